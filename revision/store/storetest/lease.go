package storetest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/store"
)

func testLease(t *testing.T, b Base) {
	s := open(t, b, "w")
	l, err := s.Lock(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Holder() == "" {
		t.Error("a lease with no holder name")
	}
	if _, err := open(t, b, "w").Lock(ctx, nil, nil); !amlerr.Has(err, amlerr.WorkspaceConflict) {
		t.Fatalf("second lock: %v", err)
	}
	// Another workspace's lease is its own.
	o, err := open(t, b, "other").Lock(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Release(ctx)
	if err := l.Lost(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := open(t, b, "w").Lock(ctx, nil, nil)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	if l2.Holder() == l.Holder() {
		t.Error("a later holding has the same name")
	}
	l2.Release(ctx)
}

// testLeaseTakeover: a fresh lease whose holder is reported dead is taken
// over; the old holder finds out, at its heartbeat or at release.
func testLeaseTakeover(t *testing.T, b Base) {
	s := open(t, b, "w")
	b.Tune(s, 50*time.Millisecond, time.Hour)
	lost := make(chan error, 1)
	l1, err := s.Lock(ctx, func(err error) { lost <- err }, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2 := open(t, b, "w")
	b.Tune(s2, time.Hour, time.Hour)
	if _, err := s2.Lock(ctx, nil, func(string) bool { return false }); !amlerr.Has(err, amlerr.WorkspaceConflict) {
		t.Fatalf("lock of a live holder: %v", err)
	}
	var asked string
	l2, err := s2.Lock(ctx, nil, func(h string) bool { asked = h; return true })
	if err != nil {
		t.Fatalf("takeover from a dead holder: %v", err)
	}
	defer l2.Release(ctx)
	if asked != l1.Holder() {
		t.Errorf("dead was asked about %q, the holder is %q", asked, l1.Holder())
	}
	select {
	case err := <-lost:
		if !amlerr.Has(err, amlerr.LockLost) {
			t.Errorf("lost with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the heartbeat did not notice the takeover")
	}
	if err := l1.Release(ctx); !amlerr.Has(err, amlerr.LockLost) {
		t.Errorf("release of a lost lease: %v", err)
	}
	if err := l2.Lost(); err != nil {
		t.Errorf("the new holder lost its lease to the old one's release: %v", err)
	}
}

// testLeaseStale: a lease not refreshed within the stale time is taken
// over without asking anyone.
func testLeaseStale(t *testing.T, b Base) {
	s := open(t, b, "w")
	b.Tune(s, time.Hour, time.Hour) // no heartbeat within the test
	l1, err := s.Lock(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Release(ctx)
	s2 := open(t, b, "w")
	b.Tune(s2, time.Hour, time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		l2, err := s2.Lock(ctx, nil, nil)
		if err == nil {
			l2.Release(ctx)
			break
		}
		if !amlerr.Has(err, amlerr.WorkspaceConflict) || time.Now().After(deadline) {
			t.Fatalf("stale lease not taken over: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := l1.Lost(); !amlerr.Has(err, amlerr.LockLost) {
		t.Errorf("the stale holder still believes it holds the lease: %v", err)
	}
	if l1.LostErr() == nil {
		t.Error("a loss Lost found is not remembered (LostErr)")
	}
}

func testDestroy(t *testing.T, b Base) {
	s := open(t, b, "w")
	o := open(t, b, "wx")
	for _, x := range []store.Store{s, o} {
		if _, err := x.PublishIndex(ctx, []byte("i"), ""); err != nil {
			t.Fatal(err)
		}
		stage(t, x, "revisions/r1/", map[string]string{"files/a": "a"})
	}
	if err := s.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ReadIndex(ctx); !errors.Is(err, store.ErrNotExist) {
		t.Fatalf("index after destroy: %v", err)
	}
	mustNotExist(t, s, "revisions/r1/files/a")
	if got := revisions(t, s); len(got) != 0 {
		t.Fatalf("artifacts after destroy: %v", got)
	}
	// A sibling whose id shares a prefix keeps everything.
	mustRead(t, o, "revisions/r1/files/a", "a")
	if _, _, err := o.ReadIndex(ctx); err != nil {
		t.Fatal(err)
	}
}

func testProbe(t *testing.T, b Base) {
	if p := open(t, b, "w").Probe(ctx); !p.Safe() {
		t.Fatalf("probe: %+v", p)
	}
}

// testFaults: a store that fails never reports success, and publishes
// nothing half-made.
func testFaults(t *testing.T, b Base) {
	if b.Break == nil {
		t.Skip("this store cannot be broken on demand")
	}
	s := open(t, b, "w")
	v, err := s.PublishIndex(ctx, []byte("good"), "")
	if err != nil {
		t.Fatal(err)
	}
	broken := errors.New("injected fault")
	b.Break(broken)
	if _, err := s.PublishIndex(ctx, []byte("bad"), v); err == nil {
		t.Error("publish on a broken store succeeded")
	}
	if _, _, err := s.ReadIndex(ctx); err == nil {
		t.Error("read on a broken store succeeded")
	}
	if _, err := s.Lock(ctx, nil, nil); err == nil {
		t.Error("lock on a broken store succeeded")
	}
	st, err := s.Stage(ctx, "revisions/r1/")
	if err == nil {
		err = st.Put(ctx, "files/a", bytes.NewReader([]byte("a")), 1)
		if err == nil {
			err = st.Flush(ctx)
		}
		if err == nil {
			err = st.Commit(ctx)
		}
		st.Abort(ctx)
	}
	if err == nil {
		t.Error("a save on a broken store succeeded")
	}
	b.Break(nil)
	data, v2, err := s.ReadIndex(ctx)
	if err != nil || string(data) != "good" || v2 != v {
		t.Fatalf("index after the fault: %q %v", data, err)
	}
	mustNotExist(t, s, "revisions/r1/files/a")
}
