package mount

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A free slot with unsaved work wins over an empty one, and a slot another
// open file description holds is skipped.
func TestClaimSlotPrefersUnsavedWork(t *testing.T) {
	base := t.TempDir()
	held, err := claimSlot(base) // slot 0, held for the whole test
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, n := range []string{"1", "2"} {
		if err := os.MkdirAll(filepath.Join(base, n), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if got := slotOf(t, base); got != "1" {
		t.Fatalf("no unsaved work anywhere: got slot %s, want the first free one, 1", got)
	}
	os.WriteFile(filepath.Join(base, "2", "state.json"), []byte("{}"), 0o600)
	if got := slotOf(t, base); got != "2" {
		t.Fatalf("slot 2 has unsaved work: got slot %s", got)
	}
	os.WriteFile(filepath.Join(base, "0", "state.json"), []byte("{}"), 0o600)
	if got := slotOf(t, base); got != "2" {
		t.Fatalf("slot 0's unsaved work belongs to a live mount: got slot %s, want 2", got)
	}
}

func slotOf(t *testing.T, base string) string {
	t.Helper()
	f, err := claimSlot(base)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return filepath.Base(filepath.Dir(f.Name()))
}

func TestDeadHolder(t *testing.T) {
	host, _ := os.Hostname()
	for _, tc := range []struct {
		name   string
		rec    *leaseRecord // nil: no record
		held   bool         // the recorded slot is held by a live claim
		own    bool         // the recorded slot is the caller's own
		holder string
		dead   bool
	}{
		{name: "no record", holder: "h1"},
		{name: "slot free", rec: &leaseRecord{Holder: "h1", Slot: "1", PID: 42, Host: host}, holder: "h1", dead: true},
		{name: "own slot", rec: &leaseRecord{Holder: "h1", Slot: "1", Host: host}, own: true, holder: "h1", dead: true},
		{name: "slot held", rec: &leaseRecord{Holder: "h1", Slot: "1", Host: host}, held: true, holder: "h1"},
		{name: "another holding", rec: &leaseRecord{Holder: "h0", Slot: "1", Host: host}, holder: "h1"},
		{name: "another host", rec: &leaseRecord{Holder: "h1", Slot: "1", Host: host + "-other"}, holder: "h1"},
		{name: "bad slot", rec: &leaseRecord{Holder: "h1", Slot: "../x", Host: host}, holder: "h1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			var own *os.File
			if tc.rec != nil {
				data, _ := json.Marshal(tc.rec)
				if err := os.WriteFile(leaseRecordPath(base), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.held || tc.own {
				f, err := tryClaim(filepath.Join(base, "1"))
				if err != nil || f == nil {
					t.Fatal(err)
				}
				defer f.Close()
				if tc.own {
					own = f
				}
			}
			if got := deadHolder(base, own, nil)(tc.holder); got != tc.dead {
				t.Fatalf("dead = %v, want %v", got, tc.dead)
			}
		})
	}
}

// TestSlotsDirLongID: an id of any length AML takes gets a slots
// directory whose name fits a file name; short ids keep theirs.
func TestSlotsDirLongID(t *testing.T) {
	cache := t.TempDir()
	for _, id := range []string{"short", strings.Repeat("i", 238), strings.Repeat("é", 200), strings.Repeat("x", 1000)} {
		st, err := OpenStore(context.Background(), "file://"+t.TempDir(), S3Options{}, id)
		if err != nil {
			t.Fatal(err)
		}
		dir := slotsDir(cache, st, id)
		if len(filepath.Base(dir)) > 255 {
			t.Errorf("id of %d bytes: a name of %d bytes", len(id), len(filepath.Base(dir)))
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Errorf("id of %d bytes: %v", len(id), err)
		}
		if id == "short" && !strings.HasPrefix(filepath.Base(dir), "short@") {
			t.Errorf("a short id's directory: %s", dir)
		}
	}
}
