package revision

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/amlfs/amlfs/revision/format"
)

// savedAndRestored saves src as w's current revision and restores it
// into a new directory, which it returns: lazily, if w restores so.
func savedAndRestored(t *testing.T, w *Workspace, src string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "w")
	if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
		t.Fatal(err)
	}
	return dst
}

func inoOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestInodeReuseKeepsNewBytes: a placeholder removed before its fill, and
// a file the sandbox makes with its inode number, keeps the sandbox's
// bytes through every fill the engine makes (a read, the prefetch, the
// fetches before a prune, a save), in the tree and in the revision: the
// engine knows a placeholder by its handle, not its number. Files are
// removed and made one at a time, so that ext4 gives the freed number to
// the next file.
func TestInodeReuseKeepsNewBytes(t *testing.T) {
	type step struct {
		name string
		make func(t *testing.T, dst string, i int) // removes f<i>, makes a file with new bytes
		want func(i int) map[string]string
	}
	const n = 40
	steps := []step{
		{"rm then create", func(t *testing.T, dst string, i int) {
			os.Remove(filepath.Join(dst, fmt.Sprintf("d/f%d", i)))
			writeTree(t, dst, map[string]string{fmt.Sprintf("d/g%d", i): fmt.Sprintf("new %d", i)})
		}, func(i int) map[string]string {
			return map[string]string{fmt.Sprintf("d/g%d", i): fmt.Sprintf("new %d", i)}
		}},
		{"rm then recreate", func(t *testing.T, dst string, i int) {
			os.Remove(filepath.Join(dst, fmt.Sprintf("d/f%d", i)))
			writeTree(t, dst, map[string]string{fmt.Sprintf("d/f%d", i): fmt.Sprintf("new %d", i)})
		}, func(i int) map[string]string {
			return map[string]string{fmt.Sprintf("d/f%d", i): fmt.Sprintf("new %d", i)}
		}},
		{"temp then rename over", func(t *testing.T, dst string, i int) {
			tmp := filepath.Join(dst, fmt.Sprintf("d/.f%d.tmp", i))
			os.Remove(filepath.Join(dst, fmt.Sprintf("d/f%d", i+1))) // frees a number for the temp file
			writeTree(t, dst, map[string]string{fmt.Sprintf("d/.f%d.tmp", i): fmt.Sprintf("new %d", i)})
			if err := os.Rename(tmp, filepath.Join(dst, fmt.Sprintf("d/f%d", i))); err != nil {
				t.Fatal(err)
			}
		}, func(i int) map[string]string {
			return map[string]string{fmt.Sprintf("d/f%d", i): fmt.Sprintf("new %d", i)}
		}},
	}
	for _, s := range steps {
		for _, fill := range []string{"read", "prefetch", "prune"} {
			t.Run(s.name+"/"+fill, func(t *testing.T) {
				forStoresFormats(t, func(t *testing.T, sk, form string) {
					ctx := context.Background()
					base, src := newBase(t, sk), t.TempDir()
					files := map[string]string{}
					for i := 0; i < 2*n; i++ {
						files[fmt.Sprintf("d/f%d", i)] = fmt.Sprintf("old %d %s", i, strings.Repeat("x", i))
					}
					writeTree(t, src, files)
					w := openWS(t, base, "reuse", Options{LazyRestore: true, Retention: 1, Format: form})
					dst := savedAndRestored(t, w, src)
					if err := w.ensureDir(ctx, "d"); err != nil {
						t.Fatal(err)
					}
					want := map[string]string{}
					for p, c := range files {
						want[p] = c
					}
					reused := 0
					for i := 0; i < 2*n; i += 2 {
						olds := map[uint64]bool{inoOf(t, filepath.Join(dst, fmt.Sprintf("d/f%d", i))): true}
						if s.name == "temp then rename over" {
							olds[inoOf(t, filepath.Join(dst, fmt.Sprintf("d/f%d", i+1)))] = true
							delete(want, fmt.Sprintf("d/f%d", i+1))
						}
						delete(want, fmt.Sprintf("d/f%d", i))
						s.make(t, dst, i)
						for p, c := range s.want(i) {
							want[p] = c
							if olds[inoOf(t, filepath.Join(dst, p))] {
								reused++
							}
						}
					}
					if reused == 0 {
						t.Fatal("no inode number was reused: the test shows nothing on this file system")
					}
					switch fill {
					case "read":
						for p := range want {
							if err := w.ensure(ctx, p); err != nil {
								t.Fatal(err)
							}
						}
					case "prefetch":
						w.prefetch(ctx, 2)
					}
					// A save (which reads every new file) that prunes the
					// revision the placeholders came from.
					if _, err := w.Save(ctx, dst, format.Selection{}, ""); err != nil {
						t.Fatal(err)
					}
					check := filepath.Join(t.TempDir(), "c")
					w2 := openWS(t, base, "reuse", Options{NoLock: true})
					if _, err := w2.Restore(ctx, "current", check, format.Selection{}); err != nil {
						t.Fatal(err)
					}
					// Placeholders the save repointed are still to fill.
					for p := range want {
						if err := w.ensure(ctx, p); err != nil {
							t.Fatal(err)
						}
					}
					bad := 0
					for p, c := range want {
						for _, d := range []string{dst, check} {
							if got, err := os.ReadFile(filepath.Join(d, p)); string(got) != c {
								if bad++; bad < 5 {
									t.Errorf("%s in %s: %q (%v), want %q", p, d, got, err, c)
								}
							}
						}
					}
					if bad > 0 {
						t.Errorf("%d files wrong (%d inode numbers reused)", bad, reused)
					}
				})
			})
		}
	}
}

// TestDirInodeReuse: a directory still to populate, removed (it is empty
// on disk), and one made with its inode number, is not populated with the
// removed directory's files.
func TestDirInodeReuse(t *testing.T) {
	forStoresFormats(t, func(t *testing.T, sk, form string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		files := map[string]string{}
		for i := 0; i < 20; i++ {
			files[fmt.Sprintf("d%d/f", i)] = fmt.Sprintf("old %d", i)
		}
		writeTree(t, src, files)
		w := openWS(t, base, "dreuse", Options{LazyRestore: true, Retention: 1, Format: form})
		dst := savedAndRestored(t, w, src)
		reused := 0
		for i := 0; i < 20; i++ {
			old := inoOf(t, filepath.Join(dst, fmt.Sprintf("d%d", i)))
			if err := os.Remove(filepath.Join(dst, fmt.Sprintf("d%d", i))); err != nil {
				t.Fatal(err)
			}
			nd := filepath.Join(dst, fmt.Sprintf("e%d", i))
			if err := os.Mkdir(nd, 0o755); err != nil {
				t.Fatal(err)
			}
			if inoOf(t, nd) == old {
				reused++
			}
			if err := w.ensureDir(ctx, fmt.Sprintf("e%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		if reused == 0 {
			t.Fatal("no inode number was reused: the test shows nothing on this file system")
		}
		if _, err := w.Save(ctx, dst, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 20; i++ {
			if des, err := os.ReadDir(filepath.Join(dst, fmt.Sprintf("e%d", i))); err != nil || len(des) != 0 {
				t.Fatalf("e%d: %v %v (%d numbers reused)", i, des, err, reused)
			}
		}
	})
}

// TestChmodBeforeFill: a placeholder chmod'ed, then filled, is saved with
// its new mode: the fill's stamp stands for the base's bytes, not for a
// mode changed before it (an archive's member carries the old one).
func TestChmodBeforeFill(t *testing.T) {
	forStoresFormats(t, func(t *testing.T, sk, form string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"f": "bytes"})
		os.Chmod(filepath.Join(src, "f"), 0o644)
		w := openWS(t, base, "chmod", Options{LazyRestore: true, Retention: 2, Format: form})
		dst := savedAndRestored(t, w, src)
		must(t, w.populateAll(ctx))
		must(t, os.Chmod(filepath.Join(dst, "f"), 0o755))
		must(t, w.ensure(ctx, "f"))
		res, err := w.Save(ctx, dst, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		check := filepath.Join(t.TempDir(), "c")
		w2 := openWS(t, base, "chmod", Options{NoLock: true})
		if _, err := w2.Restore(ctx, res.Entry.ID, check, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(filepath.Join(check, "f")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Fatalf("saved mode %v (%v), want 0755", fi.Mode().Perm(), err)
		}
	})
}
