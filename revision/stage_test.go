package revision

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

// TestHeldSaveIsTheTreeWhenHeld: with Options.Freeze, a save is the tree
// at the instant the writers were held, whatever changed before (after
// the first reading) or after (while it uploads): a file changed, a file
// made and one removed between the first reading and the hold are saved
// as at the hold; a file rewritten, one made and one removed after the
// thaw, as before it. Nothing is left in the staging directory. In both
// formats, on both stores; with the hold knowing which directories
// changed (natively) and not (through FUSE).
func TestHeldSaveIsTheTreeWhenHeld(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		for _, tc := range []struct {
			kind  string
			known bool
		}{{format.FormatFolder, false}, {format.FormatArchive, false}, {format.FormatFolder, true}, {format.FormatArchive, true}} {
			kind := tc.kind
			t.Run(fmt.Sprintf("%s/known=%v", kind, tc.known), func(t *testing.T) {
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
					var clean func(uint64) bool
					if tc.known {
						changed := map[uint64]bool{}
						for _, d := range []string{"a", "b", "c"} {
							fi, _ := os.Stat(filepath.Join(src, d))
							changed[fi.Sys().(*syscall.Stat_t).Ino] = true
						}
						clean = func(ino uint64) bool { return !changed[ino] }
					}
					return clean, func() {
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

// TestSnapshotAgainListsOnlyChanged: a second reading lists again only
// the directories clean does not vouch for, and takes a subtree it
// vouches for whole. A change in a directory it vouches for is not seen
// (the proof that it is not listed again), but for a file of more than
// one link, stated again; the others' changes, a directory moved into
// one of them, and one removed, are.
func TestSnapshotAgainListsOnlyChanged(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a/f": "1", "a/b/g": "2", "c/h": "3", "a/linked": "4", "d/moved/m": "5", "e/gone/x": "6"})
	if err := os.Link(filepath.Join(dir, "a/linked"), filepath.Join(dir, "c/link")); err != nil {
		t.Fatal(err)
	}
	first, err := snapshotWith(dir, format.Selection{}, walkOpts{record: true})
	if err != nil {
		t.Fatal(err)
	}
	writeTree(t, dir, map[string]string{"a/f": "1 changed", "a/b/g": "2 changed", "c/new": "n", "c/link": "4 changed"})
	if err := os.Rename(filepath.Join(dir, "d/moved"), filepath.Join(dir, "c/moved")); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(dir, "e/gone"))
	inoOf := func(rel string) uint64 {
		fi, err := os.Stat(filepath.Join(dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	changed := map[uint64]bool{inoOf("c"): true, inoOf("d"): true, inoOf("e"): true}
	sizes := func(clean func(uint64) bool) map[string]int64 {
		r, err := snapshotWith(dir, format.Selection{}, walkOpts{prev: first.listings, clean: clean})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, e := range r.entries {
			if e.Type == format.TypeFile {
				got[e.Path] = e.Size
			}
		}
		return got
	}
	got := sizes(func(ino uint64) bool { return !changed[ino] })
	want := map[string]int64{"a/f": 1, "a/b/g": 1, "a/linked": 9, "c/h": 1, "c/link": 9, "c/new": 1, "c/moved/m": 1}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("with c, d and e changed: %v, want %v", got, want)
	}
	// Without clean, every directory is listed again.
	got = sizes(nil)
	want["a/f"], want["a/b/g"] = 9, 9
	if !reflect.DeepEqual(got, want) {
		t.Errorf("listing all again: %v, want %v", got, want)
	}
}

// TestFillsDuringASaveKeepReuse: placeholders filled while a save runs
// (a prefetch started before it) are their revision's bytes: the save
// after reuses them and uploads only what changed. The old base kept the
// stamps the save's snapshot listed, of placeholders, and the next save
// uploaded every file filled meanwhile again.
func TestFillsDuringASaveKeepReuse(t *testing.T) {
	ctx := context.Background()
	files := map[string]string{}
	for i := 0; i < 800; i++ {
		files[fmt.Sprintf("d%d/f%04d", i/200, i)] = fmt.Sprint("content ", i)
	}
	for _, kind := range []string{format.FormatArchive, format.FormatFolder} {
		t.Run(kind, func(t *testing.T) {
			w, dst := lazyTree(t, newBase(t, "mem"), "fills", files, Options{Format: kind})
			if err := w.populateAll(ctx); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dst, "d0/f0000"), []byte("x"), 0o644)
			done := make(chan struct{})
			go func() { w.prefetch(ctx, 1); close(done) }()
			if _, err := w.Save(ctx, dst, format.Selection{}, ""); err != nil {
				t.Fatal(err)
			}
			<-done
			os.WriteFile(filepath.Join(dst, "d0/f0001"), []byte("y"), 0o644)
			res, err := w.Save(ctx, dst, format.Selection{}, "")
			if err != nil {
				t.Fatal(err)
			}
			if res.Uploaded != 1 {
				t.Errorf("the save after: uploaded %d, reused %d; want 1 uploaded", res.Uploaded, res.Reused)
			}
		})
	}
}

// TestFillLog: a base set after a fill it listed the placeholder of
// takes the filled file's stamp; a change after the fill is still seen.
func TestFillLog(t *testing.T) {
	ctx := context.Background()
	w, dst := lazyTree(t, newBase(t, "mem"), "log", map[string]string{"a": "alpha", "b": "beta"}, Options{Format: format.FormatFolder})
	if err := w.populateAll(ctx); err != nil {
		t.Fatal(err)
	}
	before := map[string]store.Stamp{}
	for _, p := range []string{"a", "b"} {
		before[p], _ = statStamp(filepath.Join(dst, p))
	}
	w.startFills()
	for _, p := range []string{"a", "b"} {
		if err := w.ensure(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dst, "b"), []byte("BETA"), 0o644) // changed after its fill
	b := &baseTree{dir: dst, files: map[string]baseFile{"a": {stamp: before["a"], key: "ka"}, "b": {stamp: before["b"], key: "kb"}}}
	w.setBaseAfterFills(b)
	if _, _, ok := b.reusable(dst, "a"); !ok {
		t.Errorf("a, filled after the base listed it, is not reusable")
	}
	if _, _, ok := b.reusable(dst, "b"); ok {
		t.Errorf("b, changed after its fill, is reusable")
	}
}

// TestHeldSaveOfALargeChange: a change too large to copy first is
// uploaded with the writers held until it has landed; a small one is
// uploaded after they are let go.
func TestHeldSaveOfALargeChange(t *testing.T) {
	for _, large := range []bool{false, true} {
		t.Run(fmt.Sprint("large=", large), func(t *testing.T) {
			if large {
				defer func(m int64) { maxStage = m }(maxStage)
				maxStage = 4
			}
			ctx := context.Background()
			base, src := newBase(t, "mem"), t.TempDir()
			writeTree(t, src, map[string]string{"a": "alpha", "b": "beta"})
			committed, landedWhileHeld := false, false
			base.mem.Fail(func(op, key string) error {
				if op == "commit" {
					committed = true
				}
				return nil
			})
			defer base.mem.Fail(nil)
			opts := Options{StageDir: t.TempDir()}
			opts.Freeze = func(context.Context) (func(uint64) bool, func(), error) {
				return nil, func() { landedWhileHeld = landedWhileHeld || committed }, nil
			}
			w := openWS(t, base, "large", opts)
			res, err := w.Save(ctx, src, format.Selection{}, "")
			if err != nil {
				t.Fatal(err)
			}
			if landedWhileHeld != large {
				t.Errorf("the artifact landed while the writers were held: %v, want %v", landedWhileHeld, large)
			}
			checkRevision(t, base, "large", res.Entry.ID, map[string]string{"a": "alpha", "b": "beta"})
		})
	}
}

// TestStagedCopyKeepsOwnerBits: a store that keeps a file's owner bits
// (a file store's objects) gets them from a staged copy too.
func TestStagedCopyKeepsOwnerBits(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	writeTree(t, src, map[string]string{"run.sh": ":", "key": "k"})
	os.Chmod(filepath.Join(src, "run.sh"), 0o755)
	os.Chmod(filepath.Join(src, "key"), 0o400)
	tr, err := openTree(src)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for name, want := range map[string]os.FileMode{"run.sh": 0o700, "key": 0o600} {
		if _, _, err := copyStaged(tr, name, filepath.Join(dst, name)); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(filepath.Join(dst, name)); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s staged: %v, %v; want %o", name, fi.Mode(), err, want)
		}
	}
}

// TestLaterReadingCopiesAgain: a copy taken while a write was under way
// has the stamp the file keeps once the write is done (a write sets mtime
// and ctime before its bytes), and bytes of before and after it. So a
// later reading copies again every file to upload it lists, whatever its
// stamp: held (the directories changed since the save began) and watched
// (a reading during which the tree changed). The test stands for such a
// copy by spoiling the first copy in place, which leaves every stamp as
// it was; it was saved as it was before.
func TestLaterReadingCopiesAgain(t *testing.T) {
	spoil := func(t *testing.T, stage string) {
		t.Helper()
		copies, _ := filepath.Glob(filepath.Join(stage, stageName, "*"))
		if len(copies) == 0 {
			t.Fatal("the test shows nothing: no staged copy")
		}
		for _, c := range copies {
			fi, err := os.Stat(c)
			must(t, err)
			if fi.Size() > 1 { // a/busy's; b/other's directory did not change
				must(t, os.WriteFile(c, make([]byte, fi.Size()), 0o600))
			}
		}
	}
	for _, mode := range []string{"held", "watched"} {
		for _, kind := range []string{format.FormatFolder, format.FormatArchive} {
			t.Run(mode+"/"+kind, func(t *testing.T) {
				ctx := context.Background()
				base, src, stage := newBase(t, "dir"), t.TempDir(), t.TempDir()
				writeTree(t, src, map[string]string{"a/busy": "the bytes the file holds", "b/other": "o"})
				opts := Options{Format: kind, StageDir: stage}
				switch mode {
				case "held":
					opts.Freeze = func(context.Context) (func(uint64) bool, func(), error) {
						spoil(t, stage)
						fi, _ := os.Stat(filepath.Join(src, "a"))
						changed := fi.Sys().(*syscall.Stat_t).Ino
						return func(ino uint64) bool { return ino != changed }, func() {}, nil
					}
				case "watched":
					watches := 0
					opts.Watch = func() func() bool {
						watches++
						first := watches == 1
						return func() bool {
							if first {
								spoil(t, stage)
							}
							return first // the first reading saw a change
						}
					}
				}
				w := openWS(t, base, "again", opts)
				res, err := w.Save(ctx, src, format.Selection{}, "")
				must(t, err)
				checkRevision(t, base, "again", res.Entry.ID, map[string]string{"a/busy": "the bytes the file holds", "b/other": "o"})
			})
		}
	}
}
