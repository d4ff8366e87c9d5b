package s3live

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// recorder runs ops by recording them; ops on one key must never overlap.
type recorder struct {
	mu      sync.Mutex
	ran     []string
	batches [][]string
	active  map[string]bool
	fail    map[string]int // fail this many times
	t       *testing.T
}

func (r *recorder) run(batch []*op) []error {
	r.mu.Lock()
	var keys []string
	for _, o := range batch {
		if r.active[o.key] {
			r.t.Errorf("two ops on %s at once", o.key)
		}
		r.active[o.key] = true
		keys = append(keys, o.key)
	}
	r.batches = append(r.batches, keys)
	r.mu.Unlock()
	time.Sleep(5 * time.Millisecond)
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := make([]error, len(batch))
	for i, o := range batch {
		delete(r.active, o.key)
		kind := "put"
		if o.kind == opDel {
			kind = "del"
		}
		if r.fail[o.key] > 0 {
			r.fail[o.key]--
			errs[i] = errors.New("injected")
			continue
		}
		r.ran = append(r.ran, kind+" "+o.key)
	}
	return errs
}

func TestQueueReplacesWaitingOps(t *testing.T) {
	r := &recorder{active: map[string]bool{}, t: t}
	q := newQueue(4, r.run)
	defer q.close()
	// put then delete of one key before either starts: only the delete.
	q.add(&op{key: "a", kind: opPut}, time.Hour, false)
	ch := q.add(&op{key: "a", kind: opDel}, 0, true)
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if fmt.Sprint(r.ran) != "[del a]" {
		t.Fatalf("ran %v, want only the delete", r.ran)
	}
}

func TestQueueBatchesDeletesAndFlushes(t *testing.T) {
	r := &recorder{active: map[string]bool{}, t: t}
	q := newQueue(2, r.run)
	defer q.close()
	for i := range 2500 {
		q.add(&op{key: fmt.Sprintf("d/%04d", i), kind: opDel}, 50*time.Millisecond, false)
	}
	q.add(&op{key: "other", kind: opPut}, time.Hour, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.flush(ctx, "d/", false); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	n, batches := len(r.ran), len(r.batches)
	r.mu.Unlock()
	if n != 2500 {
		t.Fatalf("%d deletes ran, want 2500", n)
	}
	if batches > 6 {
		t.Fatalf("%d batches for 2500 deletes, want them batched by up to 1000", batches)
	}
	if q.Len() != 1 {
		t.Fatalf("queue holds %d ops, want the delayed put only", q.Len())
	}
}

func TestQueueRetriesAndReportsFailures(t *testing.T) {
	r := &recorder{active: map[string]bool{}, t: t, fail: map[string]int{"k": 1}}
	q := newQueue(2, r.run)
	defer q.close()
	if err := <-q.add(&op{key: "k", kind: opPut}, 0, true); err == nil {
		t.Fatal("a failed op reported success to its waiter")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.flush(ctx, "", false); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if fmt.Sprint(r.ran) != "[put k]" {
		t.Fatalf("ran %v, want the retry to succeed", r.ran)
	}
}

func TestQueueOrdersOpsOnOneKey(t *testing.T) {
	r := &recorder{active: map[string]bool{}, t: t}
	q := newQueue(8, r.run)
	defer q.close()
	var chans []chan error
	for i := range 20 {
		kind := opPut
		if i%2 == 1 {
			kind = opDel
		}
		chans = append(chans, q.add(&op{key: "same", kind: kind}, 0, true))
		time.Sleep(time.Millisecond)
	}
	for _, ch := range chans {
		<-ch
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ran) == 0 || r.ran[len(r.ran)-1] != "del same" {
		t.Fatalf("ran %v: the last op added must run last", r.ran)
	}
}

// An op due soon runs soon, whatever waits longer ahead of it: next stops
// at the first op not yet due, so ops must be in due order.
func TestQueueDelayedOpsInDueOrder(t *testing.T) {
	r := &recorder{active: map[string]bool{}, t: t}
	q := newQueue(2, r.run)
	defer q.close()
	q.add(&op{key: "later", kind: opPut}, time.Hour, false)
	ch := q.add(&op{key: "soon", kind: opPut}, 20*time.Millisecond, true)
	select {
	case err := <-ch:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an op due in 20 ms waited behind one due in an hour")
	}
}

// A failFast flush waiting on an op that keeps failing gets its error
// after flushTries tries, not a wait through every retry; the op is still
// retried. A flush without failFast rides out failures until its context
// ends, and a failure that heals in time is no error.
func TestQueueFlushFailsFast(t *testing.T) {
	r := &recorder{active: map[string]bool{}, t: t, fail: map[string]int{"k": 1000, "heals": 2}}
	q := newQueue(2, r.run)
	defer q.close()
	q.add(&op{key: "k", kind: opPut}, time.Hour, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	err := q.flush(ctx, "k", true)
	if err == nil || ctx.Err() != nil || time.Since(start) > 8*time.Second {
		t.Fatalf("failFast flush of a failing op: %v after %s", err, time.Since(start))
	}
	if q.Len() != 1 {
		t.Fatalf("the failed op is not kept for a retry: %d ops", q.Len())
	}
	short, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	start = time.Now()
	if err := q.flush(short, "k", false); err == nil || err.Error() != "injected" || time.Since(start) < 2*time.Second {
		t.Fatalf("flush without failFast of a failing op: %v after %s, want the op's error at the deadline", err, time.Since(start))
	}
	q.add(&op{key: "heals", kind: opPut}, 0, false)
	if err := q.flush(ctx, "heals", true); err != nil {
		t.Fatalf("flush of an op that fails twice, then works: %v", err)
	}
}

// A file's flush waits for its own key only: "a" is not "a.txt". A
// directory's ("/"-terminated) waits for everything below it.
func TestQueueFlushUnder(t *testing.T) {
	r := &recorder{active: map[string]bool{}, t: t}
	q := newQueue(2, r.run)
	defer q.close()
	q.add(&op{key: "d/a.txt", kind: opPut}, time.Hour, false)
	q.add(&op{key: "d/a", kind: opPut}, time.Hour, false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := q.flush(ctx, "d/a", true); err != nil {
		t.Fatalf("flush of d/a: %v", err)
	}
	if !q.busy("d/a.txt") || q.busy("d/a") {
		t.Fatal("flush of d/a ran d/a.txt, or not d/a")
	}
	if err := q.flush(ctx, "d/", false); err != nil || q.Len() != 0 {
		t.Fatalf("flush of d/: %v, %d ops left", err, q.Len())
	}
}
