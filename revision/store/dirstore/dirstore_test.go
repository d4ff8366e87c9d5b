package dirstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/store"
)

func TestForeignKeys(t *testing.T) {
	for key, ok := range map[string]bool{
		"../a/revisions/r/files/x":    true,
		"../a%20b/revisions/r/":       true,
		"../a/workspace.json":         false,
		"../../etc/revisions/x":       false,
		"../a/revisions/../../x":      false,
		"../.././revisions/x":         false,
		"../a":                        false,
		"revisions/r/files/x":         false,
		"../a/revisions/r/files/../y": false,
	} {
		if _, _, got := store.SplitForeign(key); got != ok {
			t.Errorf("splitForeign(%q) = %v", key, got)
		}
	}
	s, _ := New("/base", "w")
	if got := s.path("../o/revisions/r/files/x"); got != "/base/o/revisions/r/files/x" {
		t.Errorf("path of a foreign key: %s", got)
	}
	if s.Foreign("revisions/r/") != "../w/revisions/r/" || s.Foreign("../o/revisions/r/") != "../o/revisions/r/" {
		t.Error("Foreign")
	}
	if err := s.Remove(context.Background(), "../o/revisions/r/"); err == nil {
		t.Error("a store removed another workspace's revision")
	}
}

func TestLeaseHeartbeat(t *testing.T) {
	base := t.TempDir()
	st, _ := New(base, "hb")
	st.LockRefresh = 50 * time.Millisecond
	lost := make(chan error, 1)
	lease, err := st.Lock(context.Background(), func(err error) { lost <- err }, nil)
	if err != nil {
		t.Fatal(err)
	}
	lp := filepath.Join(base, "hb.lock")
	old := time.Now().Add(-10 * time.Minute)
	// The heartbeat keeps moving the lock's mtime forward.
	fi0, _ := os.Stat(lp)
	time.Sleep(200 * time.Millisecond)
	fi1, _ := os.Stat(lp)
	if !fi1.ModTime().After(fi0.ModTime()) {
		t.Errorf("heartbeat did not refresh the lock: %v -> %v", fi0.ModTime(), fi1.ModTime())
	}
	// Someone else keeps touching the lock, as another writer that took
	// it over would: the heartbeat notices and reports. (A single foreign
	// touch that lands between the heartbeat's check and its own touch is
	// overwritten unseen; that window is inherent to mtime leases.)
	deadline := time.After(2 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		os.Chtimes(lp, old, old)
		select {
		case err := <-lost:
			if !amlerr.Has(err, amlerr.LockLost) {
				t.Errorf("lost with %v", err)
			}
			break wait
		case <-deadline:
			t.Fatal("heartbeat did not notice the lost lease")
		case <-tick.C:
		}
	}
	if err := lease.Release(context.Background()); !amlerr.Has(err, amlerr.LockLost) {
		t.Errorf("release after loss: %v", err)
	}
}
