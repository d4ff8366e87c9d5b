package revision

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/format"
)

func TestIncrementalSaveReusesUnchangedFiles(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		files := map[string]string{}
		for i := 0; i < 50; i++ {
			files[fmt.Sprintf("d%d/f%d.txt", i%5, i)] = strings.Repeat("x", i+1)
		}
		writeTree(t, src, files)
		w := openWS(t, base, "inc", Options{Retention: 2})
		first, err := w.Save(ctx, src, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if first.Uploaded != 50 || first.Reused != 0 {
			t.Fatalf("first save: %+v", first)
		}
		// One content change, one chmod, one same-size rewrite with the old
		// mtime put back: all three must upload; the rest is reused.
		os.WriteFile(filepath.Join(src, "d0/f0.txt"), []byte("changed"), 0o644)
		os.Chmod(filepath.Join(src, "d1/f1.txt"), 0o600)
		p := filepath.Join(src, "d2/f2.txt")
		fi, _ := os.Stat(p)
		os.WriteFile(p, []byte("ZZZ"), 0o644)
		os.Chtimes(p, fi.ModTime(), fi.ModTime())
		second, err := w.Save(ctx, src, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if second.Uploaded != 3 || second.Reused != 47 || second.UploadedBytes != int64(len("changed")+2+3) {
			t.Fatalf("second save: uploaded %d (%d bytes), reused %d", second.Uploaded, second.UploadedBytes, second.Reused)
		}
		// Both revisions restore exactly.
		for _, tc := range []struct {
			rev  string
			want map[string]string
		}{
			{first.Entry.ID, files},
			{second.Entry.ID, func() map[string]string {
				m := map[string]string{}
				for k, v := range files {
					m[k] = v
				}
				m["d0/f0.txt"] = "changed"
				m["d2/f2.txt"] = "ZZZ"
				return m
			}()},
		} {
			dst := filepath.Join(t.TempDir(), "w")
			if _, err := w.Restore(ctx, tc.rev, dst, format.Selection{}); err != nil {
				t.Fatal(err)
			}
			for path, want := range tc.want {
				if got, _ := os.ReadFile(filepath.Join(dst, path)); string(got) != want {
					t.Errorf("%s %s = %q, want %q", tc.rev, path, got, want)
				}
			}
		}
		// After a restore, an untouched tree reuses everything.
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		third, err := w.Save(ctx, dst, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if third.Uploaded != 0 || third.Reused != 50 {
			t.Errorf("save of a fresh restore: %+v", third)
		}
	})
}

// TestSaveChangingTree saves, in both formats, while a writer rewrites one
// file in place, appends lines to another, and makes and removes others:
// every save succeeds, and each file it holds is whole (one version of
// the rewritten file, whole lines of the log) with the manifest's size. A
// file that changed during every reading is saved with its bytes of the
// previous revision (Earlier), or left out if that has none (LeftOut),
// never torn and never failing the save.
func TestSaveChangingTree(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		for _, kind := range []string{format.FormatFolder, format.FormatArchive} {
			t.Run(kind, func(t *testing.T) {
				ctx := context.Background()
				base, src := newBase(t, sk), t.TempDir()
				w := openWS(t, base, "chg", Options{Format: kind, Retention: 2})
				writeTree(t, src, map[string]string{"rewrite": strings.Repeat("v0 ", 50000), "db-wal": strings.Repeat("v0 ", 50000), "log": "", "churn/keep": "k"})
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					rw, _ := os.OpenFile(filepath.Join(src, "rewrite"), os.O_RDWR, 0)
					wal, _ := os.OpenFile(filepath.Join(src, "db-wal"), os.O_RDWR, 0)
					defer wal.Close()
					lg, _ := os.OpenFile(filepath.Join(src, "log"), os.O_WRONLY|os.O_APPEND, 0)
					defer rw.Close()
					defer lg.Close()
					for i := 1; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						// In place, and of another length: a torn read
						// mixes versions or sizes. Shrunk before it is
						// written, so that no instant between the two
						// calls holds a new prefix on an old tail (such an
						// instant is the file's own, and may be saved).
						v := rewriteV(i)
						for _, f := range []*os.File{rw, wal} {
							if st, err := f.Stat(); err == nil && st.Size() > int64(len(v)) {
								f.Truncate(int64(len(v)))
							}
							f.WriteAt([]byte(v), 0)
						}
						// Opened for each rewrite, as most tools do, and of one
						// length, so that every instant outside a write call
						// holds one whole version.
						if f, err := os.OpenFile(filepath.Join(src, "reopened"), os.O_WRONLY|os.O_CREATE, 0o644); err == nil {
							f.WriteAt([]byte(reopenedV(i)), 0)
							f.Close()
						}
						fmt.Fprintf(lg, "line %d\n", i)
						p := filepath.Join(src, "churn", fmt.Sprint("f", i%7))
						if i%2 == 0 {
							os.WriteFile(p, []byte(v[:i%5000]), 0o644)
						} else {
							os.Remove(p)
						}
						time.Sleep(3 * time.Millisecond)
					}
				}()
				prev := map[string]string{}
				for i := 0; i < 8; i++ {
					res, err := w.Save(ctx, src, format.Selection{}, "")
					if err != nil {
						close(stop)
						<-done
						t.Fatalf("save %d of a changing tree: %v", i, err)
					}
					if len(res.Earlier)+len(res.LeftOut) > 0 {
						t.Logf("save %d: saved as before %v, left out %v", i, res.Earlier, res.LeftOut)
					}
					dst := filepath.Join(t.TempDir(), "r")
					if _, err := w.Restore(ctx, res.Entry.ID, dst, format.Selection{}); err != nil {
						t.Fatalf("restore %d: %v", i, err)
					}
					for _, name := range res.LeftOut {
						if _, err := os.Lstat(filepath.Join(dst, name)); err == nil || (prev[name] != "" && !journalOf(name)) {
							t.Errorf("save %d: %s reported left out, restored %v, in the previous revision %d bytes", i, name, err, len(prev[name]))
						}
					}
					for _, name := range res.Earlier {
						if journalOf(name) {
							t.Errorf("save %d: the journal %s was saved with earlier bytes", i, name)
						}
						if got, _ := os.ReadFile(filepath.Join(dst, name)); string(got) != prev[name] {
							t.Errorf("save %d: %s reported as in the previous revision (%d bytes), is %d bytes", i, name, len(prev[name]), len(got))
						}
					}
					for _, name := range []string{"rewrite", "reopened", "log"} {
						got, _ := os.ReadFile(filepath.Join(dst, name))
						prev[name] = string(got)
					}
					// Each file is its bytes at one instant of the save
					// (the writer is not held): a whole version, or, if
					// that instant fell inside one write call, that
					// call's first bytes over the version before, as a
					// kill -9 of the writer then would leave them. Never
					// bytes of versions further apart, and never a file
					// no instant held.
					for name, version := range map[string]func(int) string{"rewrite": rewriteV, "db-wal": rewriteV, "reopened": reopenedV} {
						got, err := os.ReadFile(filepath.Join(dst, name))
						if err != nil {
							continue // left out (a journal), or not made yet
						}
						if len(got) == 0 && name == "reopened" {
							continue // made, not written yet: an instant it had
						}
						if !atAnInstant(string(got), version) {
							t.Errorf("save %d: %s is no state the file held: %d bytes, starting %.12q", i, name, len(got), got)
						}
					}
					lg, _ := os.ReadFile(filepath.Join(dst, "log"))
					if len(lg) > 0 && lg[len(lg)-1] != '\n' {
						t.Errorf("save %d: the log ends mid-line: %q", i, lg[max(0, len(lg)-20):])
					}
				}
				close(stop)
				<-done
			})
		}
	})
}

// rewriteV and reopenedV are TestSaveChangingTree's i-th versions of its
// files rewritten in place (version 0: as the tree was made).
func rewriteV(i int) string {
	if i == 0 {
		return strings.Repeat("v0 ", 50000)
	}
	return strings.Repeat(fmt.Sprintf("v%d ", i), 400000+i%200000)
}

func reopenedV(i int) string { return strings.Repeat(fmt.Sprintf("%07d ", i), 200000) }

// atAnInstant reports whether got is a state a file rewritten in place
// with the versions version(0), version(1), ..., one write call each (a
// shrinking one truncated first), held at some instant: a whole version,
// or the first bytes of version n over version n-1 (cut to the length the
// file had then).
func atAnInstant(got string, version func(int) string) bool {
	if got == "" {
		return false // every version has bytes
	}
	n := versionOf(got)
	for _, n := range []int{n, n + 1} {
		if n < 1 {
			if got == version(0) {
				return true
			}
			continue
		}
		cur, prev := version(n), version(n-1)
		k := 0
		for k < len(got) && k < len(cur) && got[k] == cur[k] {
			k++
		}
		switch {
		case k == len(got):
			return true // a prefix of version n: written as far as it grew
		case len(got) <= len(prev) && got[k:] == prev[k:len(got)]:
			return true // version n's first bytes over version n-1
		}
	}
	return false
}

// versionOf reads the version number the first word of got names.
func versionOf(got string) int {
	w, _, _ := strings.Cut(got, " ")
	n, err := strconv.Atoi(strings.TrimPrefix(w, "v"))
	if err != nil {
		return -1
	}
	return n
}

// An archive written by another tar (GNU tar here; AML uses node-tar, also
// rooted at ".") restores, and one amlfs writes lists cleanly with tar(1).
func TestArchiveInteropWithTar(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar")
	}
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a/b.txt": "bee", "top.txt": "top", "empty/": ""})
	arch := filepath.Join(t.TempDir(), "x.tar.gz")
	if out, err := exec.Command("tar", "-czf", arch, "-C", src, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	f, err := os.Open(arch)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dst := t.TempDir()
	entries, err := readArchive(f, dst, "x", format.DefaultLimits, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 4 {
		t.Errorf("entries %+v", entries)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a", "b.txt")); string(b) != "bee" {
		t.Errorf("a/b.txt = %q", b)
	}
	// And the other way: tar(1) reads what amlfs writes.
	base := newBase(t, "mem")
	w := openWS(t, base, "tar", Options{Format: format.FormatArchive})
	res, err := w.Save(context.Background(), src, format.Selection{}, "")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("tar", "-tzf", "-")
	cmd.Stdin = bytes.NewReader(base.read(t, "tar", res.Entry.Path))
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	// Files first, then the directories, whose mtimes change most.
	if got := string(out); got != "./top.txt\n./a/b.txt\n./\n./a/\n./empty/\n" {
		t.Errorf("tar -t:\n%s", got)
	}
}

// TestArchiveIsComposable: an archive revision is written composable: its
// index is found from its end, names every file with its saved stat data
// and nanosecond mtime, and each file reads alone from its member.
func TestArchiveIsComposable(t *testing.T) {
	ctx := context.Background()
	base, src := newBase(t, "mem"), t.TempDir()
	writeTree(t, src, map[string]string{"a.txt": "alpha", "d/b.txt": strings.Repeat("b", 300<<10), "d/e/c.txt": "c"})
	w := openWS(t, base, "arch", Options{Format: format.FormatArchive})
	res, err := w.Save(ctx, src, format.Selection{}, "")
	if err != nil {
		t.Fatal(err)
	}
	data := base.read(t, "arch", res.Entry.Path)
	off, n, err := format.IndexRange(data[len(data)-format.TailBytes:], int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	x, err := format.ParseIndexMember(data[off:off+n], int64(len(data)), format.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for _, e := range x.Entries {
		if e.Type != format.TypeFile {
			continue
		}
		files++
		if e.Stat.Ino == 0 || e.Mtime%1e9 == 0 && e.Mtime.Time().Nanosecond() != 0 {
			t.Errorf("%s: stat data %+v, mtime %v", e.Path, e.Stat, e.Mtime)
		}
		r, err := format.OpenEntry(bytes.NewReader(data), e)
		if err != nil {
			t.Fatalf("%s: %v", e.Path, err)
		}
		got, _ := io.ReadAll(r)
		want, _ := os.ReadFile(filepath.Join(src, e.Path))
		if !bytes.Equal(got, want) {
			t.Errorf("%s read alone differs", e.Path)
		}
	}
	if files != 3 {
		t.Errorf("the index names %d files", files)
	}
}

// TestAtAnInstant: the check TestSaveChangingTree makes of each saved
// file can fail.
func TestAtAnInstant(t *testing.T) {
	v := func(i int) string { return strings.Repeat(fmt.Sprintf("v%d ", i), 4+i) }
	for _, c := range []struct {
		got  string
		want bool
	}{
		{v(0), true},
		{v(3), true},
		{v(3)[:7], true},             // version 3 as far as it grew
		{v(3)[:8] + v(2)[8:], true},  // inside version 3's write
		{v(2)[:10], true},            // version 2 cut for version 3, before its write
		{v(3)[:8] + v(1)[8:], false}, // two versions apart
		{v(2)[:8] + v(3)[8:], false}, // the older one first
		{v(3)[:8] + "xx" + v(2)[10:], false},
		{v(3) + "v3 ", false}, // longer than any state
		{"", false},
	} {
		if got := atAnInstant(c.got, v); got != c.want {
			t.Errorf("%q: %v, want %v", c.got, got, c.want)
		}
	}
}
