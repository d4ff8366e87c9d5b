package revision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/amlfs/amlfs/fuse/shown"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/revision/store/dirstore"
	"github.com/amlfs/amlfs/revision/store/memstore"
	"golang.org/x/sys/unix"
)

// storeKinds are the stores the engine's tests run on: a directory and
// memory. (The S3 store passes the same conformance suite, against a real
// server, in the integration suite.)
var storeKinds = []string{"dir", "mem"}

// testBase is one store base of a test.
type testBase struct {
	kind string
	dir  string // the directory store's base
	mem  *memstore.Base
}

func newBase(t *testing.T, kind string) testBase {
	b := testBase{kind: kind}
	switch kind {
	case "dir":
		b.dir = t.TempDir()
	case "mem":
		b.mem = memstore.NewBase()
	default:
		t.Fatalf("store kind %q", kind)
	}
	return b
}

// forStores runs fn once per store kind, as subtests.
func forStores(t *testing.T, fn func(t *testing.T, kind string)) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { fn(t, kind) })
	}
}

// forStoresFormats runs fn once per store kind and revision format.
func forStoresFormats(t *testing.T, fn func(t *testing.T, kind, form string)) {
	for _, kind := range storeKinds {
		for _, form := range []string{format.FormatFolder, format.FormatArchive} {
			t.Run(kind+"/"+form, func(t *testing.T) { fn(t, kind, form) })
		}
	}
}

func (b testBase) store(t *testing.T, id string) store.Family {
	t.Helper()
	var (
		s   store.Family
		err error
	)
	if b.mem != nil {
		s, err = memstore.New(b.mem, id)
	} else {
		s, err = dirstore.New(b.dir, id)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// revisions lists workspace id's revision artifacts in the store.
func (b testBase) revisions(t *testing.T, id string) []string {
	t.Helper()
	keys, err := b.store(t, id).Artifacts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range keys {
		if strings.HasPrefix(k, "revisions/") {
			out = append(out, k)
		}
	}
	return out
}

// read returns the object at key of workspace id.
func (b testBase) read(t *testing.T, id, key string) []byte {
	t.Helper()
	r, err := b.store(t, id).Open(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func readManifest(t *testing.T, b testBase, id string, e format.Entry) *format.Manifest {
	t.Helper()
	m, err := format.ParseManifest("m", b.read(t, id, e.Path+"manifest.json"), format.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSaveOnFailingStore: a save whose store fails (at any step) reports
// the failure, publishes nothing, leaves no artifact behind once the store
// heals, and the next save succeeds.
func TestSaveOnFailingStore(t *testing.T) {
	for _, op := range []string{"put", "commit", "publish"} {
		t.Run(op, func(t *testing.T) {
			ctx := context.Background()
			base, src := newBase(t, "mem"), t.TempDir()
			writeTree(t, src, map[string]string{"a.txt": "a", "d/b.txt": "b"})
			w := openWS(t, base, "f", Options{Retention: 2})
			first, err := w.Save(ctx, src, format.Selection{}, "")
			if err != nil {
				t.Fatal(err)
			}
			writeTree(t, src, map[string]string{"a.txt": "changed"})
			injected := errors.New("injected " + op + " failure")
			base.mem.Fail(func(o, key string) error {
				if o == op {
					return injected
				}
				return nil
			})
			if _, err := w.Save(ctx, src, format.Selection{}, ""); !errors.Is(err, injected) {
				t.Fatalf("save on a failing store: %v", err)
			}
			base.mem.Fail(nil)
			if cur := w.Index().Current; cur != first.Entry.ID {
				t.Fatalf("current moved to %s", cur)
			}
			if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
				t.Fatalf("save after the store healed: %v", err)
			}
			if got := base.revisions(t, "f"); len(got) != 2 {
				t.Errorf("artifacts after a failed and a good save: %v", got)
			}
		})
	}
}

// TestViewKeepsSavedStat: with a view of the stat data the mount shows
// (fuse/shown), a tree restored and saved again untouched records the
// inode numbers and ctimes it was first saved with; without one, the
// disk's own.
func TestViewKeepsSavedStat(t *testing.T) {
	for _, c := range []struct {
		withView bool
		form     string
	}{{true, format.FormatFolder}, {false, format.FormatFolder}, {true, format.FormatArchive}, {false, format.FormatArchive}} {
		withView := c.withView
		t.Run(fmt.Sprint("view=", withView, "/", c.form), func(t *testing.T) {
			ctx := context.Background()
			base, src := newBase(t, "mem"), t.TempDir()
			writeTree(t, src, map[string]string{"a.txt": "a", "d/b.txt": "b"})
			w := openWS(t, base, "v", Options{Retention: 3, Format: c.form})
			first, err := w.Save(ctx, src, format.Selection{}, "")
			if err != nil {
				t.Fatal(err)
			}
			w.Close(ctx)
			opts := Options{Retention: 3}
			if withView {
				opts.View = shown.New()
			}
			w2 := openWS(t, base, "v", opts)
			dst := filepath.Join(t.TempDir(), "w")
			if _, err := w2.Restore(ctx, "current", dst, format.Selection{}); err != nil {
				t.Fatal(err)
			}
			second, err := w2.Save(ctx, dst, format.Selection{}, "")
			if err != nil {
				t.Fatal(err)
			}
			stats := func(e format.Entry) map[string]format.EntryStat {
				out := map[string]format.EntryStat{}
				tree, _, err := w2.Describe(ctx, e)
				if err != nil {
					t.Fatal(err)
				}
				for _, te := range tree {
					if te.Type == format.TypeFile {
						out[te.Path] = format.EntryStat{Ino: te.Stat.Ino, Ctime: te.Stat.Ctime}
					}
				}
				return out
			}
			a, b := stats(first.Entry), stats(second.Entry)
			if same := reflect.DeepEqual(a, b); same != withView {
				t.Errorf("saved stat data the same: %v, want %v\nfirst  %v\nsecond %v", same, withView, a, b)
			}
		})
	}
}

// TestFillByDescriptor: a placeholder is filled through a descriptor of
// it (FUSE's O_PATH one) wherever it has moved since, and a descriptor of
// anything else fills nothing.
func TestFillByDescriptor(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"a.txt": "alpha bytes", "b.txt": "beta"})
		w := openWS(t, base, "fill", Options{})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		w.Close(ctx)
		w2 := openWS(t, base, "fill", Options{LazyRestore: true})
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w2.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		if err := w2.ensureDir(ctx, ""); err != nil { // as a FUSE lookup does
			t.Fatal(err)
		}
		fd, err := unix.Open(filepath.Join(dst, "a.txt"), unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		// Moved, and its name taken by a symlink: the descriptor decides.
		if err := os.Rename(filepath.Join(dst, "a.txt"), filepath.Join(dst, "moved.txt")); err != nil {
			t.Fatal(err)
		}
		os.Symlink("b.txt", filepath.Join(dst, "a.txt"))
		before, _ := w2.pending()
		if err := w2.fillFd(ctx, fd); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dst, "moved.txt")); string(b) != "alpha bytes" {
			t.Fatalf("moved placeholder holds %q", b)
		}
		if after, _ := w2.pending(); after != before-1 {
			t.Errorf("pending %d -> %d", before, after)
		}
		// A directory's descriptor, and a filled file's, fill nothing.
		dfd, _ := unix.Open(dst, unix.O_PATH|unix.O_CLOEXEC, 0)
		defer unix.Close(dfd)
		for _, d := range []int{dfd, fd} {
			if err := w2.fillFd(ctx, d); err != nil {
				t.Errorf("fill of a non-placeholder: %v", err)
			}
		}
		if after, _ := w2.pending(); after != before-1 {
			t.Errorf("pending changed by fills of non-placeholders: %d", after)
		}
	})
}

// TestFillReadOnlyFile: a read-only restored file (git's objects are
// 0444) is filled, through a descriptor and by path, by a daemon that is
// not root too, and keeps its mode. Root's opens ignore the mode: the
// unprivileged fast lane is where this shows.
func TestFillReadOnlyFile(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"objects/ab/cdef": "object one", "objects/ab/0123": "object two"})
		for _, p := range []string{"objects/ab/cdef", "objects/ab/0123"} {
			if err := os.Chmod(filepath.Join(src, p), 0o444); err != nil {
				t.Fatal(err)
			}
		}
		w := openWS(t, base, "ro", Options{})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		w.Close(ctx)
		w2 := openWS(t, base, "ro", Options{LazyRestore: true})
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w2.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		if err := w2.populateAll(ctx); err != nil {
			t.Fatal(err)
		}
		one, two := filepath.Join(dst, "objects/ab/cdef"), filepath.Join(dst, "objects/ab/0123")
		fd, err := unix.Open(one, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := w2.fillFd(ctx, fd); err != nil {
			t.Fatalf("fill through a descriptor: %v", err)
		}
		if err := w2.ensure(ctx, "objects/ab/0123"); err != nil {
			t.Fatalf("fill by path: %v", err)
		}
		for p, want := range map[string]string{one: "object one", two: "object two"} {
			if b, err := os.ReadFile(p); err != nil || string(b) != want {
				t.Errorf("%s holds %q (%v)", p, b, err)
			}
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o444 {
				t.Errorf("%s mode %v (%v), want 0444", p, fi.Mode(), err)
			}
		}
		if n, _ := w2.pending(); n != 0 {
			t.Errorf("%d placeholders still pending", n)
		}
	})
}
