package revision

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/format"
)

// A tree kept at a stop is adopted by the next workspace of its revision
// only while it is that revision's tree exactly: every change a stamp
// shows, and any other revision current, make Adopt refuse; entries the
// revision does not have are handed aside.
func TestAdoptKept(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		before func(t *testing.T, dst string) // before the save that keeps the tree
		tamper func(t *testing.T, dst string)
		sel    format.Selection
		aside  int  // entries handed aside, when adopted
		ok     bool // adopted
	}{
		{name: "untouched", ok: true},
		{name: "a file and a directory the revision lacks", ok: true, aside: 2, tamper: func(t *testing.T, dst string) {
			writeTree(t, dst, map[string]string{"build/out.o": "ignored", "a/extra.txt": "not saved"})
		}},
		{name: "a directory another selection leaves out", ok: true, aside: 1, sel: format.Selection{Exclude: []string{"b/**"}}},
		{name: "bytes rewritten, size and mtime put back", tamper: func(t *testing.T, dst string) {
			p := filepath.Join(dst, "a/two.txt")
			fi, _ := os.Stat(p)
			must(t, os.WriteFile(p, []byte("SECOND FILE"), 0o640))
			must(t, os.Chtimes(p, fi.ModTime(), fi.ModTime()))
		}},
		{name: "a placeholder written", tamper: func(t *testing.T, dst string) {
			f, err := os.OpenFile(filepath.Join(dst, "b/three.bin"), os.O_WRONLY, 0)
			must(t, err)
			f.WriteAt([]byte("x"), 10)
			f.Close()
		}},
		{name: "a file's mode", tamper: func(t *testing.T, dst string) { must(t, os.Chmod(filepath.Join(dst, "a/one.txt"), 0o600)) }},
		{name: "a directory's mode", tamper: func(t *testing.T, dst string) { must(t, os.Chmod(filepath.Join(dst, "a"), 0o700)) }},
		{name: "a file removed", tamper: func(t *testing.T, dst string) { must(t, os.Remove(filepath.Join(dst, "a/one.txt"))) }},
		{name: "a file moved", tamper: func(t *testing.T, dst string) {
			must(t, os.Rename(filepath.Join(dst, "a/one.txt"), filepath.Join(dst, "b/one.txt")))
		}},
		{name: "a symlink pointed elsewhere", tamper: func(t *testing.T, dst string) {
			must(t, os.Remove(filepath.Join(dst, "link")))
			must(t, os.Symlink("b/three.bin", filepath.Join(dst, "link")))
		}},
		{name: "a file with two names as saved", before: func(t *testing.T, dst string) {
			// A restore makes each name its own copy; the kept tree
			// shares the bytes.
			must(t, os.Link(filepath.Join(dst, "a/one.txt"), filepath.Join(dst, "a/same.txt")))
		}},
		{name: "the directory a file was", tamper: func(t *testing.T, dst string) {
			must(t, os.Remove(filepath.Join(dst, "a/one.txt")))
			must(t, os.Mkdir(filepath.Join(dst, "a/one.txt"), 0o755))
		}},
	}
	for _, form := range []string{format.FormatFolder, format.FormatArchive} {
		for _, c := range cases {
			t.Run(form+"/"+c.name, func(t *testing.T) {
				base, src := newBase(t, "dir"), t.TempDir()
				writeTree(t, src, map[string]string{"a/one.txt": "one", "a/two.txt": "second file", "b/three.bin": string(make([]byte, 5000)), "empty/": ""})
				must(t, os.Symlink("a/one.txt", filepath.Join(src, "link")))
				w := openWS(t, base, "kept", Options{LazyRestore: true, Format: form})
				if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
					t.Fatal(err)
				}
				dst := filepath.Join(t.TempDir(), "w")
				if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
					t.Fatal(err)
				}
				must(t, w.populateAll(ctx))
				must(t, w.ensure(ctx, "a/one.txt")) // one fetched, the rest placeholders
				// A save of one change makes the kept tree that
				// revision's: its stamps are the save's.
				must(t, os.WriteFile(filepath.Join(dst, "a/new.txt"), []byte("new"), 0o644))
				if c.before != nil {
					c.before(t, dst)
				}
				res, err := w.Save(ctx, dst, format.Selection{}, "")
				must(t, err)
				must(t, w.Close(ctx))
				kept := filepath.Join(t.TempDir(), "kept.json")
				must(t, w.WriteKept(kept, dst, res.Entry.ID))
				var before syscall.Stat_t
				must(t, syscall.Stat(filepath.Join(dst, "a/two.txt"), &before))
				if c.tamper != nil {
					c.tamper(t, dst)
				}

				w2 := openWS(t, base, "kept", Options{LazyRestore: true})
				var aside []string
				a, err := w2.Adopt(ctx, kept, "current", dst, c.sel, func(rel string) error {
					aside = append(aside, rel)
					return os.RemoveAll(filepath.Join(dst, rel))
				})
				if !c.ok {
					if !errors.Is(err, ErrNotKept) {
						t.Fatalf("a tree changed after it was kept was adopted (err %v)", err)
					}
					t.Log(err)
					if w2.baseTree() != nil || w2.lazyState() != nil {
						t.Fatal("a refused adoption left a base or placeholders")
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if a.Entry.ID != res.Entry.ID || a.Aside != c.aside || len(aside) != c.aside {
					t.Fatalf("adopted %s with %d aside (%v), want %s and %d", a.Entry.ID, a.Aside, aside, res.Entry.ID, c.aside)
				}
				// a/two.txt and b/three.bin are placeholders still (with b
				// left out, a/two.txt only): a save reuses a placeholder's
				// bytes without fetching them.
				var after syscall.Stat_t
				must(t, syscall.Stat(filepath.Join(dst, "a/two.txt"), &after))
				if after.Ino != before.Ino {
					t.Fatal("the adopted tree's file is not the kept one")
				}
				wantPending := 2
				if len(c.sel.Exclude) > 0 {
					wantPending = 1
				}
				if a.Pending != wantPending {
					t.Fatalf("%d placeholders pending, want %d", a.Pending, wantPending)
				}
				if len(c.sel.Exclude) == 0 {
					must(t, w2.ensure(ctx, "b/three.bin"))
					if got, _ := os.ReadFile(filepath.Join(dst, "b/three.bin")); len(got) != 5000 {
						t.Fatalf("the adopted placeholder's bytes: %d", len(got))
					}
				}
				// The adopted stamps are the base: a save with no change
				// uploads nothing.
				res2, err := w2.Save(ctx, dst, c.sel, "")
				must(t, err)
				if res2.Uploaded != 0 {
					t.Fatalf("a save of the unchanged adopted tree uploaded %d files", res2.Uploaded)
				}
			})
		}
	}
}

// Another writer's publication since the tree was kept: the tree is no
// longer the current revision, and is not adopted for it.
func TestAdoptKeptAfterAnotherWriter(t *testing.T) {
	ctx := context.Background()
	base, src := newBase(t, "dir"), t.TempDir()
	writeTree(t, src, map[string]string{"a/one.txt": "one"})
	w := openWS(t, base, "kept", Options{LazyRestore: true})
	res, err := w.Save(ctx, src, format.Selection{}, "")
	must(t, err)
	dst := filepath.Join(t.TempDir(), "w")
	_, err = w.Restore(ctx, "current", dst, format.Selection{})
	must(t, err)
	must(t, w.populateAll(ctx))
	must(t, w.Close(ctx))
	kept := filepath.Join(t.TempDir(), "kept.json")
	must(t, w.WriteKept(kept, dst, res.Entry.ID))
	if err := w.WriteKept(kept, dst, "another"); err == nil {
		t.Fatal("a tree was recorded as a revision it is not")
	}
	other := openWS(t, base, "kept", Options{NoLock: true, Retention: 2, Now: func() time.Time { return time.Now().Add(time.Second) }})
	writeTree(t, src, map[string]string{"a/one.txt": "two"})
	_, err = other.Save(ctx, src, format.Selection{}, "")
	must(t, err)
	w2 := openWS(t, base, "kept", Options{LazyRestore: true})
	if _, err := w2.Adopt(ctx, kept, "current", dst, format.Selection{}, func(string) error { return nil }); !errors.Is(err, ErrNotKept) {
		t.Fatalf("the kept tree was adopted as the revision another writer published since (err %v)", err)
	}
	// As the revision it is, named, it still is.
	if _, err := w2.Adopt(ctx, kept, res.Entry.ID, dst, format.Selection{}, func(string) error { return nil }); err != nil {
		t.Fatalf("adopt as its own revision: %v", err)
	}
}

func TestKeptArtifacts(t *testing.T) {
	w := &Workspace{index: &format.Index{Current: "r2", Revisions: []format.Entry{
		{ID: "r1", Path: "revisions/r1/", Format: format.FormatFolder},
		{ID: "r2", Path: "revisions/r2.tar.gz", Format: format.FormatArchive},
	}}}
	kept := w.keptArtifacts()
	for _, c := range []struct {
		key  string
		want bool
	}{
		{"revisions/r1/files/a.txt", true},
		{"revisions/r2.tar.gz#@3", true},
		{"revisions/r2.tar.gz#0,10,512,3,a", true},
		{"revisions/r0/files/a.txt", false},  // pruned
		{"revisions/r1x/files/a.txt", false}, // another folder
		{"revisions/r2.tar.gzz#@3", false},   // another archive
		{"revisions/r2.tar.gz", false},       // no member
	} {
		if got := kept(c.key); got != c.want {
			t.Errorf("%q: %v, want %v", c.key, got, c.want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
