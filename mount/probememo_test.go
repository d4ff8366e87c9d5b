package mount

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/revision/store/memstore"
)

// countingStore counts its probes, and answers them as told.
type countingStore struct {
	store.Store
	probes int
	safe   bool
}

func (s *countingStore) Probe(ctx context.Context) store.Probe {
	s.probes++
	return store.Probe{Reachable: true, Writable: true, IfNoneMatch: s.safe, IfMatch: s.safe}
}

// TestProbeMemo: a store that passed its probe is not probed again on
// this host until the memo expires; an unsafe one is probed each time; a
// memo another user could have written is not trusted.
func TestProbeMemo(t *testing.T) {
	ctx := context.Background()
	ms, _ := memstore.New(memstore.NewBase(), "w")
	dir := t.TempDir()
	notify := func(string, ...any) {}
	check := func(st *countingStore, memo ProbeMemo) error {
		return CheckConditionalWrites(ctx, st, memo, false, notify)
	}
	safe := &countingStore{Store: ms, safe: true}
	memo := NewProbeMemo(dir, "s3://bkt/prefix", "http://127.0.0.1:1")
	for range 3 {
		if err := check(safe, memo); err != nil {
			t.Fatal(err)
		}
	}
	if safe.probes != 1 {
		t.Errorf("a safe store was probed %d times", safe.probes)
	}
	// Another store (another endpoint) has its own memo.
	if err := check(safe, NewProbeMemo(dir, "s3://bkt/prefix", "http://127.0.0.1:2")); err != nil || safe.probes != 2 {
		t.Errorf("another endpoint: %v, %d probes", err, safe.probes)
	}
	// A memo anyone may write is not trusted.
	os.Chmod(memo.path, 0o666)
	check(safe, memo)
	if safe.probes != 3 {
		t.Errorf("a world-writable memo was trusted (%d probes)", safe.probes)
	}
	// An expired one neither.
	old := time.Now().Add(-ProbeTTL - time.Minute)
	os.Chtimes(memo.path, old, old)
	check(safe, memo)
	if safe.probes != 4 {
		t.Errorf("an expired memo was trusted (%d probes)", safe.probes)
	}
	// An unsafe store is refused, and probed again every time.
	unsafe := &countingStore{Store: ms}
	um := NewProbeMemo(dir, "s3://other", "")
	for range 2 {
		if err := check(unsafe, um); err == nil {
			t.Error("an unsafe store passed")
		}
	}
	if unsafe.probes != 2 {
		t.Errorf("an unsafe store was probed %d times", unsafe.probes)
	}
}
