package revision

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

func mustSeg(t *testing.T, id string) string {
	t.Helper()
	seg, err := format.Seg(id)
	if err != nil {
		t.Fatal(err)
	}
	return seg
}

func inodeOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestFork: a workspace forked from another's revision restores it (lazily
// or not), and its first save hard-links every unchanged file from the
// source's revision, records the source in the manifest, and leaves the
// source as it was; later the source may prune that revision.
func TestFork(t *testing.T) {
	forStoresFormats(t, func(t *testing.T, sk, form string) {
		for _, lazy := range []bool{false, true} {
			t.Run(fmt.Sprint("lazy=", lazy), func(t *testing.T) {
				ctx := context.Background()
				base, src := newBase(t, sk), t.TempDir()
				files := map[string]string{}
				for i := range 20 {
					files[fmt.Sprintf("d%d/f%d.txt", i%4, i)] = strings.Repeat("x", i+1)
				}
				writeTree(t, src, files)
				a := openWS(t, base, "base", Options{Retention: 1, LazyRestore: lazy, Format: form})
				first, err := a.Save(ctx, src, format.Selection{}, "")
				if err != nil {
					t.Fatal(err)
				}
				b := openWS(t, base, "fork one", Options{Retention: 1, LazyRestore: lazy, Format: form})
				dir := filepath.Join(t.TempDir(), "w")
				if _, err := b.RestoreFork(ctx, "base", "", dir, format.Selection{}); err != nil {
					t.Fatal(err)
				}
				if err := b.populateAll(ctx); err != nil { // what FUSE would ask for
					t.Fatal(err)
				}
				if err := b.ensure(ctx, "d1/f5.txt"); err != nil {
					t.Fatal(err)
				}
				if got, err := os.ReadFile(filepath.Join(dir, "d1/f5.txt")); err != nil || string(got) != files["d1/f5.txt"] {
					t.Fatalf("forked tree: %q %v", got, err)
				}
				if err := b.ensure(ctx, "d0/f0.txt"); err != nil { // as FUSE does before a write
					t.Fatal(err)
				}
				os.WriteFile(filepath.Join(dir, "d0/f0.txt"), []byte("changed"), 0o644)
				res, err := b.Save(ctx, dir, format.Selection{}, "")
				if err != nil {
					t.Fatal(err)
				}
				if res.Uploaded != 1 || res.Reused != 19 {
					t.Errorf("fork's first save: uploaded %d, reused %d", res.Uploaded, res.Reused)
				}
				if f := forkOf(t, b, res.Entry); f == nil || *f != (format.ForkOrigin{ID: "base", Revision: first.Entry.ID}) {
					t.Errorf("fork record: %+v", f)
				}
				aSeg, _ := format.Seg("base")
				bSeg, _ := format.Seg("fork one")
				if base.dir != "" && form == format.FormatFolder && inodeOf(t, filepath.Join(base.dir, aSeg, "revisions", first.Entry.ID, "files/d2/f6.txt")) != inodeOf(t, filepath.Join(base.dir, bSeg, "revisions", res.Entry.ID, "files/d2/f6.txt")) {
					t.Errorf("an unchanged file was not hard-linked from the source")
				}
				if a.Index().Current != first.Entry.ID || len(a.Index().Revisions) != 1 {
					t.Errorf("the source changed: %+v", a.Index())
				}
				// The source moves on and prunes the forked revision; the
				// fork keeps its own copies, and a second save records no
				// fork.
				writeTree(t, src, map[string]string{"new.txt": "n"})
				if _, err := a.Save(ctx, src, format.Selection{}, ""); err != nil {
					t.Fatal(err)
				}
				a.prunes.Wait() // pruning runs after the save returns
				if slices.Contains(base.revisions(t, "base"), first.Entry.Path) {
					t.Fatalf("the source did not prune %s", first.Entry.Path)
				}
				again := filepath.Join(t.TempDir(), "w")
				if _, err := b.Restore(ctx, "current", again, format.Selection{}); err != nil {
					t.Fatal(err)
				}
				if err := b.populateAll(ctx); err != nil {
					t.Fatal(err)
				}
				for p := range files {
					if err := b.ensure(ctx, p); err != nil {
						t.Fatal(err)
					}
				}
				for p, want := range files {
					if p == "d0/f0.txt" {
						want = "changed"
					}
					if got, err := os.ReadFile(filepath.Join(again, p)); err != nil || string(got) != want {
						t.Errorf("fork after the source pruned: %s = %q, %v", p, got, err)
					}
				}
				os.WriteFile(filepath.Join(again, "x"), []byte("x"), 0o644)
				res2, err := b.Save(ctx, again, format.Selection{}, "")
				if err != nil {
					t.Fatal(err)
				}
				if f := forkOf(t, b, res2.Entry); f != nil {
					t.Errorf("a later save records the fork again: %+v", f)
				}
			})
		}
	})
}

// forkOf is the fork a revision of w (or of workspace in's, on w's
// store) records, from its manifest or index.
func forkOf(t *testing.T, w *Workspace, e format.Entry, in ...string) *format.ForkOrigin {
	t.Helper()
	if len(in) > 0 {
		e.Path = w.store.(store.Family).Foreign(store.ForeignKey(mustSeg(t, in[0]), e.Path))
	}
	_, f, err := w.Describe(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestForkRefusals(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"a": "a"})
		a := openWS(t, base, "a", Options{})
		if _, err := a.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ id, from, rev string }{
			{"b1", "b1", ""},       // itself
			{"b2", "missing", ""},  // no such workspace
			{"b3", "a", "nope"},    // no such revision
			{"b4", " a", ""},       // an id AML refuses
			{"a2", "a", "current"}, // fine: checked below
		} {
			w := openWS(t, base, tc.id, Options{})
			_, err := w.RestoreFork(ctx, tc.from, tc.rev, filepath.Join(t.TempDir(), "w"), format.Selection{})
			if (err == nil) != (tc.id == "a2") {
				t.Errorf("fork %q from %q@%q: %v", tc.id, tc.from, tc.rev, err)
			}
		}
		// commit --fork: to a new id only, and the mounted one stays.
		if _, err := a.SaveFork(ctx, src, format.Selection{}, "a", "", ""); err == nil {
			t.Error("--fork to the workspace itself was taken")
		}
		res, err := a.SaveFork(ctx, src, format.Selection{}, "c", "", a.Index().Current)
		if err != nil {
			t.Fatal(err)
		}
		if res.Reused != 1 || res.Uploaded != 0 {
			t.Errorf("commit --fork of an unchanged tree: uploaded %d, reused %d", res.Uploaded, res.Reused)
		}
		if f := forkOf(t, a, res.Entry, "c"); f == nil || f.ID != "a" || f.Revision != a.Index().Current {
			t.Errorf("commit --fork record: %+v", f)
		}
		// A fork takes no lease and reads no index: its publication is
		// create-if-absent. Onto an existing workspace it is refused, and
		// leaves no artifact there.
		if _, err := a.SaveFork(ctx, src, format.Selection{}, "c", "", ""); amlerr.Code(err) != amlerr.InvalidConfig || !strings.Contains(err.Error(), "already exists") {
			t.Errorf("--fork to an existing workspace: %v", err)
		}
		if keys, err := base.store(t, "c").Artifacts(ctx); err != nil || len(keys) != 1 {
			t.Errorf("artifacts of the existing workspace after a refused fork: %v %v", keys, err)
		}
		// The fork's lease was released: it can be opened.
		c := openWS(t, base, "c", Options{})
		if c.Index() == nil || c.Index().Current != res.Entry.ID {
			t.Errorf("fork's index: %+v", c.Index())
		}
		data, _ := json.Marshal(a.Index())
		if !strings.Contains(string(data), a.Index().Current) || len(a.Index().Revisions) != 1 {
			t.Errorf("the mounted workspace changed: %s", data)
		}
	})
}
