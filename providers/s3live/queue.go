package s3live

import (
	"container/list"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The write-back queue orders a live mount's changes to the bucket. Each
// op names one key. Ops on one key run one at a time, in order; an op
// that has not started is replaced by a newer op on its key (a delete
// after an upload needs only the delete), and its waiters wait for the
// newer op instead. Ops on different keys run in parallel, and deletes are
// batched (DeleteObjects, up to 1000 keys).

type opKind int

const (
	opPut opKind = iota // upload the entry's bytes or metadata (or dir marker)
	opDel               // delete the key
)

type op struct {
	key       string
	kind      opKind
	e         *ent // opPut
	notBefore time.Time
	added     time.Time
	waiters   []chan error
	elem      *list.Element
	tries     int
	err       error     // of the last failed try
	failedAt  time.Time // of the last failed try
}

// errGiveUp marks an op's error as final: the op is not tried again.
var errGiveUp = errors.New("not retried")

type queue struct {
	mu      sync.Mutex
	cond    *sync.Cond
	order   *list.List      // GUARDED_BY(mu): *op not started, by notBefore
	pending map[string]*op  // GUARDED_BY(mu): not started, by key
	running map[string]bool // GUARDED_BY(mu)
	closed  bool            // GUARDED_BY(mu)
	run     func(batch []*op) []error
	// active is when the mount last served a change (unix ns). Delayed
	// ops wait while changes keep coming, up to maxWait, so that the
	// uploads of a burst (an untar, an rm -rf) do not slow the burst.
	active atomic.Int64
}

// Background ops wait for the mount to be idle this long, but never more
// than maxWait after they were queued.
const (
	idleFor = 100 * time.Millisecond
	maxWait = 5 * time.Second
)

// touch records foreground activity.
func (q *queue) touch() { q.active.Store(time.Now().UnixNano()) }

func newQueue(workers int, run func([]*op) []error) *queue {
	q := &queue{order: list.New(), pending: map[string]*op{}, running: map[string]bool{}, run: run}
	q.cond = sync.NewCond(&q.mu)
	for range workers {
		go q.worker()
	}
	go q.ticker()
	return q
}

// ticker wakes the workers when delayed ops come due.
func (q *queue) ticker() {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for range t.C {
		q.mu.Lock()
		if q.closed && q.order.Len() == 0 && len(q.running) == 0 {
			q.mu.Unlock()
			return
		}
		q.cond.Broadcast()
		q.mu.Unlock()
	}
}

// add queues an op after delay (0: at once, ahead of delayed ops). A
// returned channel, if wait is set, gets the op's result.
func (q *queue) add(o *op, delay time.Duration, wait bool) chan error {
	var ch chan error
	if wait {
		ch = make(chan error, 1)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if old := q.pending[o.key]; old != nil {
		q.order.Remove(old.elem)
		o.waiters = append(o.waiters, old.waiters...)
		if delay > 0 && old.notBefore.IsZero() {
			delay = 0 // an urgent op stays urgent
		}
	}
	if ch != nil {
		o.waiters = append(o.waiters, ch)
	}
	q.pending[o.key] = o
	o.added = time.Now()
	if delay > 0 {
		o.notBefore = time.Now().Add(delay)
		q.insertDue(o)
	} else {
		o.notBefore = time.Time{}
		o.elem = q.order.PushFront(o)
	}
	q.cond.Broadcast()
	return ch
}

// busy reports whether an op on key is queued or running.
func (q *queue) busy(key string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pending[key] != nil || q.running[key]
}

// under reports whether key is under prefix: prefix itself, or below it
// when prefix is a directory's ("/"-terminated) or the whole bucket's ("").
// A file's key is not a prefix of its siblings': "a" is not under "a.txt".
func under(key, prefix string) bool {
	if strings.HasSuffix(prefix, "/") || prefix == "" {
		return strings.HasPrefix(key, prefix)
	}
	return key == prefix
}

// busyUnder reports whether any op under prefix is queued or running.
func (q *queue) busyUnder(prefix string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	busy, _ := q.busyUnderLocked(prefix)
	return busy
}

// busyUnderLocked reports whether any op under prefix is queued or
// running, and of those waiting to be retried, the one that failed last.
func (q *queue) busyUnderLocked(prefix string) (busy bool, failed *op) {
	for k, o := range q.pending {
		if under(k, prefix) {
			busy = true
			if o.err != nil && (failed == nil || o.failedAt.After(failed.failedAt)) {
				failed = o
			}
		}
	}
	for k := range q.running {
		if under(k, prefix) {
			busy = true
		}
	}
	return busy, failed
}

// flushTries is how many times an op may fail before a failFast flush
// gives up on it (the SDK has retried each try already).
const flushTries = 3

// flush makes every op under prefix urgent and waits until none is left,
// or ctx ends (then with the error of the last op that failed, if any).
// With failFast, an op that has failed flushTries times, the last time
// during the wait, ends it with its error: the op is retried later, but a
// file system call waiting on it gets EIO within seconds, not a hang
// while the bucket refuses it.
func (q *queue) flush(ctx context.Context, prefix string, failFast bool) error {
	start := time.Now()
	q.mu.Lock()
	for e := q.order.Front(); e != nil; {
		next := e.Next()
		o := e.Value.(*op)
		if under(o.key, prefix) && !o.notBefore.IsZero() {
			o.notBefore = time.Time{}
			q.order.MoveToFront(e)
		}
		e = next
	}
	q.cond.Broadcast()
	q.mu.Unlock()
	for {
		q.mu.Lock()
		busy, failed := q.busyUnderLocked(prefix)
		var err error
		if failed != nil {
			err = failed.err
			if failFast && failed.tries >= flushTries && failed.failedAt.After(start) {
				q.mu.Unlock()
				return err
			}
		}
		q.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return err
			}
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// insertDue puts a delayed op into the order after every op due no later
// than it: next stops at the first op not yet due, so one retry waiting
// 30 s must not hold back the ops due before it.
func (q *queue) insertDue(o *op) {
	for e := q.order.Back(); e != nil; e = e.Prev() {
		if p := e.Value.(*op); p.notBefore.IsZero() || !p.notBefore.After(o.notBefore) {
			o.elem = q.order.InsertAfter(o, e)
			return
		}
	}
	o.elem = q.order.PushFront(o)
}

// Len is the number of ops queued or running.
func (q *queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending) + len(q.running)
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// next takes the ops to run next: the first due op whose key is not
// running, and for a delete up to 999 more due deletes.
func (q *queue) next() []*op {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.closed && q.order.Len() == 0 {
			return nil
		}
		now := time.Now()
		idle := now.Sub(time.Unix(0, q.active.Load())) >= idleFor
		var batch []*op
		for e := q.order.Front(); e != nil; e = e.Next() {
			o := e.Value.(*op)
			if !q.closed && !o.notBefore.IsZero() && (o.notBefore.After(now) || !idle && now.Sub(o.added) < maxWait) {
				break // delayed ops are in due order after the urgent ones
			}
			if q.running[o.key] {
				continue
			}
			if len(batch) > 0 && (o.kind != opDel || batch[0].kind != opDel) {
				continue
			}
			batch = append(batch, o)
			if o.kind != opDel || len(batch) == 1000 {
				break
			}
		}
		if len(batch) > 0 {
			for _, o := range batch {
				q.order.Remove(o.elem)
				delete(q.pending, o.key)
				q.running[o.key] = true
			}
			return batch
		}
		q.cond.Wait()
	}
}

func (q *queue) worker() {
	for {
		batch := q.next()
		if batch == nil {
			return
		}
		errs := q.run(batch)
		q.mu.Lock()
		for i, o := range batch {
			delete(q.running, o.key)
			err := errs[i]
			for _, w := range o.waiters {
				w <- err
			}
			o.waiters = nil
			if err != nil {
				if q.pending[o.key] == nil && (!q.closed || o.tries < 3) && !errors.Is(err, errGiveUp) {
					// Try again later, unless a newer op on the key
					// has superseded this one.
					o.tries++
					o.err, o.failedAt = err, time.Now()
					o.notBefore = o.failedAt.Add(min(time.Duration(o.tries)*time.Second, 30*time.Second))
					q.pending[o.key] = o
					q.insertDue(o)
				}
			}
		}
		q.cond.Broadcast()
		q.mu.Unlock()
	}
}
