package revision

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
)

// A placeholder of an archive's file is marked by reference to its entry
// in the archive's index: a marker that fits in an ext4 inode however long
// the path, read back after a crash, repointed by a save, and resolved by
// the fetch after the archive it was restored from is pruned.
func TestShortMarkers(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base := newBase(t, sk)
		long := strings.Repeat("node_modules/some-package/", 6) + "lib/index.js"
		files := map[string]string{long: "long path bytes", "a/b.txt": "bee", "c.txt": "sea"}
		w, dst := lazyTree(t, base, "short", files, Options{Retention: 1, Format: format.FormatArchive})
		if err := w.populateAll(ctx); err != nil {
			t.Fatal(err)
		}
		marker := func(p string) string {
			buf := make([]byte, 4096)
			n, err := unix.Lgetxattr(filepath.Join(dst, p), PendingXattr(), buf)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			return string(buf[:n])
		}
		first := marker(long)
		if !strings.HasPrefix(first, "@") || len(first) > 16 {
			t.Fatalf("marker of %s is %q: not a short reference", long, first)
		}
		table := make([]byte, 4096)
		n, err := unix.Lgetxattr(dst, RevsXattr(), table)
		if err != nil || !strings.Contains(string(table[:n]), ".tar.gz\n") {
			t.Fatalf("table of archives: %q, %v", table[:n], err)
		}

		// A save repoints the placeholders not fetched to the new archive,
		// which gets a number of its own; Retention 1 prunes the first.
		if err := w.ensure(ctx, "c.txt"); err != nil { // as the serving layer does before a write
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dst, "c.txt"), []byte("changed"), 0o644)
		files["c.txt"] = "changed"
		if _, err := w.Save(ctx, dst, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		w.Close(ctx)
		if again := marker(long); again == first || !strings.HasPrefix(again, "@") {
			t.Fatalf("marker after the save: %q (was %q)", again, first)
		}

		// "Crash": a fresh workspace reads the markers back and fetches
		// through the current archive's index.
		w2 := openWS(t, base, "short", Options{NoLock: true})
		if n, err := w2.resumePending(dst, format.Selection{}, false); err != nil || n != 2 {
			t.Fatalf("resume: %d placeholders, %v", n, err)
		}
		for p, want := range files {
			if err := w2.ensure(ctx, p); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if got, _ := os.ReadFile(filepath.Join(dst, p)); string(got) != want {
				t.Errorf("%s = %q, want %q", p, got, want)
			}
		}
	})
}

// Markers that do not resolve give a clear error, never other bytes: a
// number the table lacks refuses the resume; an entry that is not a file,
// or past the index, fails the fetch.
func TestShortMarkersRefused(t *testing.T) {
	ctx := context.Background()
	base, src := newBase(t, "mem"), t.TempDir()
	writeTree(t, src, map[string]string{"d/f.txt": "ffff", "g.txt": "gggg"})
	w := openWS(t, base, "bad", Options{LazyRestore: true, Format: format.FormatArchive})
	if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
		t.Fatal(err)
	}
	x, err := w.archiveIndex(ctx, w.Index().Revisions[0].Path)
	if err != nil || x == nil {
		t.Fatal(x, err)
	}
	dirAt := -1
	for i, e := range x.Entries {
		if e.Type == format.TypeDir {
			dirAt = i
		}
	}
	for _, tc := range []struct {
		name, marker string
		resumes      bool
	}{
		{"unknown number", "@7:0", false},
		{"not a number", "@x:0", false},
		{"a directory's entry", "@0:" + strconv.Itoa(dirAt), true},
		{"past the index", "@0:100000", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "w")
			if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
				t.Fatal(err)
			}
			if err := w.populateAll(ctx); err != nil {
				t.Fatal(err)
			}
			if err := unix.Lsetxattr(filepath.Join(dst, "g.txt"), PendingXattr(), []byte(tc.marker), 0); err != nil {
				t.Fatal(err)
			}
			w2 := openWS(t, base, "bad", Options{NoLock: true})
			_, err := w2.resumePending(dst, format.Selection{}, false)
			if !tc.resumes {
				if !amlerr.Has(err, amlerr.InvalidStore) {
					t.Fatalf("resume with %q: %v", tc.marker, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := w2.ensure(ctx, "g.txt"); !amlerr.Has(err, amlerr.InvalidStore) {
				t.Fatalf("fetch with %q: %v", tc.marker, err)
			}
			if got, _ := os.ReadFile(filepath.Join(dst, "g.txt")); string(got) == "ffff" {
				t.Fatal("another file's bytes")
			}
		})
	}
}

// FuzzMarker reads arbitrary markers and tables back: never a panic, and
// what is accepted is a key a fetch takes (validPendingKey).
func FuzzMarker(f *testing.F) {
	f.Add("@0:12", "0 revisions/abc.tar.gz\n")
	f.Add("revisions/abc.tar.gz#1,2,3,4,a/b", "")
	f.Add("@1:x", "1 ../other/revisions/x.tar.gz\n")
	f.Add("@-1:0", "0 revisions/a/b.tar.gz\n")
	f.Fuzz(func(t *testing.T, marker, table string) {
		tb := newRevTable(t.TempDir())
		ok := true
		for _, line := range strings.Split(strings.TrimSuffix(table, "\n"), "\n") {
			num, rev, cut := strings.Cut(line, " ")
			n, err := strconv.Atoi(num)
			if !cut || err != nil || n < 0 || !isArchiveKey(rev) {
				ok = false
				break
			}
			tb.byN[n], tb.byRev[rev] = rev, n
		}
		if !ok {
			return
		}
		if key, ok := tb.key(marker); ok && !validPendingKey(key) {
			t.Fatalf("marker %q read as %q, which no fetch takes", marker, key)
		}
	})
}
