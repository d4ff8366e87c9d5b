package revision

import (
	"sync"
	"time"
)

// leaseState is the bookkeeping both stores' leases share: a heartbeat
// goroutine, and the first loss, reported once.
type leaseState struct {
	onLost func(error)
	done   chan struct{}
	stop   sync.Once
	wg     sync.WaitGroup

	mu   sync.Mutex
	lost error // GUARDED_BY(mu)
}

func newLeaseState(onLost func(error)) *leaseState {
	return &leaseState{onLost: onLost, done: make(chan struct{})}
}

// start runs tick every interval until halt; a tick that returns an error
// marks the lease lost and ends the heartbeat.
func (s *leaseState) start(interval time.Duration, tick func() error) {
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
				s.setLost(err)
				return
			}
		}
	}()
}

// setLost records the first loss and reports it.
func (s *leaseState) setLost(err error) {
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

func (s *leaseState) lostErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// halt stops the heartbeat and waits for it.
func (s *leaseState) halt() {
	s.stop.Do(func() { close(s.done) })
	s.wg.Wait()
}
