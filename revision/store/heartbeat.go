package store

import (
	"sync"
	"time"
)

// Heartbeat is the bookkeeping every store's lease shares: a heartbeat
// goroutine, and the first loss, reported once.
type Heartbeat struct {
	onLost func(error)
	done   chan struct{}
	stop   sync.Once
	wg     sync.WaitGroup

	mu   sync.Mutex
	lost error // GUARDED_BY(mu)
}

// NewHeartbeat returns a heartbeat that reports a loss to onLost, if set.
func NewHeartbeat(onLost func(error)) *Heartbeat {
	return &Heartbeat{onLost: onLost, done: make(chan struct{})}
}

// Start runs tick every interval until Halt; a tick that returns an error
// marks the lease lost and ends the heartbeat.
func (s *Heartbeat) Start(interval time.Duration, tick func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-t.C:
			}
			if err := tick(); err != nil {
				s.SetLost(err)
				return
			}
		}
	}()
}

// SetLost records the first loss and reports it.
func (s *Heartbeat) SetLost(err error) {
	s.mu.Lock()
	first := s.lost == nil
	if first {
		s.lost = err
	}
	s.mu.Unlock()
	if first && s.onLost != nil {
		s.onLost(err)
	}
}

// LostErr is the first loss recorded, or nil.
func (s *Heartbeat) LostErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// Halt stops the heartbeat and waits for it.
func (s *Heartbeat) Halt() {
	s.stop.Do(func() { close(s.done) })
	s.wg.Wait()
}
