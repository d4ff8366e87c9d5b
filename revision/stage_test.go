package revision

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/amlfs/amlfs/revision/format"
)

// TestHeldSaveIsTheTreeWhenHeld: with Options.Freeze, a save is the tree
// at the instant the writers were held, whatever changed before (after
// the first reading) or after (while it uploads): a file changed, a file
// made and one removed between the first reading and the hold are saved
// as at the hold; a file rewritten, one made and one removed after the
// thaw, as before it. Nothing is left in the staging directory. In both
// formats, on both stores.
func TestHeldSaveIsTheTreeWhenHeld(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		for _, kind := range []string{format.FormatFolder, format.FormatArchive} {
			t.Run(kind, func(t *testing.T) {
				ctx := context.Background()
				base, src, stage := newBase(t, sk), t.TempDir(), t.TempDir()
				writeTree(t, src, map[string]string{"a/kept": "k", "a/changed": "v1", "b/gone": "g", "b/after-gone": "ag", "c/rewritten": "r1"})
				held, thawed := 0, 0
				opts := Options{Format: kind, StageDir: stage, Retention: 3}
				opts.Freeze = func(context.Context) (func(uint64) bool, func(), error) {
					if held++; held > 1 {
						return nil, func() {}, nil // the next save's
					}
					// Between the first reading and the hold.
					writeTree(t, src, map[string]string{"a/changed": "v2-at-hold", "a/new": "n", "c/rewritten": "r2-at-hold"})
					os.Remove(filepath.Join(src, "b/gone"))
					return nil, func() {
						if thawed++; thawed > 1 {
							return
						}
						// After the thaw, before the upload reads.
						writeTree(t, src, map[string]string{"c/rewritten": "r3-after", "a/after-new": "x", "a/changed": "v3-after-longer"})
						os.Remove(filepath.Join(src, "b/after-gone"))
					}, nil
				}
				w := openWS(t, base, "held", opts)
				first, err := w.Save(ctx, src, format.Selection{}, "")
				if err != nil {
					t.Fatal(err)
				}
				if held != 1 || thawed < 1 {
					t.Fatalf("held %d times, thawed %d", held, thawed)
				}
				want := map[string]string{"a/kept": "k", "a/changed": "v2-at-hold", "a/new": "n", "b/after-gone": "ag", "c/rewritten": "r2-at-hold"}
				checkRevision(t, base, "held", first.Entry.ID, want)
				if ents, _ := os.ReadDir(stage); len(ents) != 0 {
					t.Errorf("staging left %d entries", len(ents))
				}
				// The next save: only what changed, the tree as held again.
				second, err := w.Save(ctx, src, format.Selection{}, "")
				if err != nil {
					t.Fatal(err)
				}
				if second.Uploaded != 3 {
					t.Errorf("the second save uploaded %d files, want 3 (what changed after the hold)", second.Uploaded)
				}
				checkRevision(t, base, "held", second.Entry.ID, map[string]string{"a/kept": "k", "a/changed": "v3-after-longer", "a/new": "n", "a/after-new": "x", "c/rewritten": "r3-after"})
			})
		}
	})
}

// checkRevision restores revision rev of workspace id, with a workspace
// of its own (a restore makes the restored tree the base), and compares
// its files with want, exactly.
func checkRevision(t *testing.T, base testBase, id, rev string, want map[string]string) {
	t.Helper()
	w := openWS(t, base, id, Options{NoLock: true})
	dst := filepath.Join(t.TempDir(), "r")
	if _, err := w.Restore(context.Background(), rev, dst, format.Selection{}); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(dst, p)
			got[filepath.ToSlash(rel)] = string(b)
		}
		return nil
	})
	for p, v := range want {
		if got[p] != v {
			t.Errorf("%s: %s = %q, want %q", rev, p, got[p], v)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: %s saved, want it absent", rev, p)
		}
	}
}
