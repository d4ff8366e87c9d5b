package revision

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/revision/format"
)

// The first saves after a lazy restore make no placeholder: a directory
// not looked into is listed from the revision and its members copied,
// then repointed at the new archive before the base is pruned. A
// directory holding a .gitignore is made first, and the rules read from
// its real bytes.
func TestSaveListsPendingDirectories(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base := newBase(t, sk)
		files := map[string]string{"a/1": "one", "a/2": "two", "b/3": "three", "b/4": "four", "b/deep/5": "five", "c/.gitignore": "*.log\n", "c/keep.txt": "kept"}
		w, dst := lazyTree(t, base, "virt", files, Options{Retention: 1, Format: format.FormatArchive})
		statOf := func(p string) format.EntryStat {
			x, err := w.archiveIndex(ctx, w.Index().Revisions[0].Path)
			if err != nil || x == nil {
				t.Fatal(x, err)
			}
			for _, e := range x.Entries {
				if e.Path == p {
					return e.Stat
				}
			}
			t.Fatalf("%s not in the index", p)
			return format.EntryStat{}
		}
		saved := statOf("b/3")
		if saved.Ino == 0 {
			t.Fatal("the first save recorded no inode number")
		}
		made := func(dir string) int {
			des, _ := os.ReadDir(filepath.Join(dst, dir))
			n := 0
			for _, de := range des {
				if !de.IsDir() {
					n++
				}
			}
			return n
		}
		for i, change := range []string{"a/1", "a/2"} {
			if err := w.ensure(ctx, change); err != nil { // as the serving layer does before a write
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dst, change), []byte("changed"), 0o644)
			files[change] = "changed"
			if i == 0 {
				// A file the restored .gitignore ignores.
				if err := w.ensureDir(ctx, "c"); err != nil {
					t.Fatal(err)
				}
				os.WriteFile(filepath.Join(dst, "c/new.log"), []byte("ignored"), 0o644)
			}
			res, err := w.Save(ctx, dst, format.Selection{}, "")
			if err != nil {
				t.Fatal(err)
			}
			w.prunes.Wait()
			if res.Uploaded != 1 || res.Files != len(files) {
				t.Errorf("save %d: uploaded %d of %d files (want 1 of %d)", i+1, res.Uploaded, res.Files, len(files))
			}
			if n := made("b") + made("b/deep"); n != 0 {
				t.Errorf("save %d made %d placeholders in b/", i+1, n)
			}
			if len(w.Index().Revisions) != 1 {
				t.Fatalf("revisions kept: %d", len(w.Index().Revisions))
			}
			if got := statOf("b/3"); got != saved {
				t.Errorf("save %d: b/3's saved stat data %+v, was %+v", i+1, got, saved)
			}
			buf := make([]byte, 4096)
			n, err := unix.Lgetxattr(filepath.Join(dst, "b"), PendingDirXattr(), buf)
			n = max(n, 0)
			if rev := w.Index().Revisions[0].Path; err != nil || string(buf[:n]) != rev+"\x00b" {
				t.Errorf("save %d: b's marker %q, %v; want the new revision %s", i+1, buf[:n], err, rev)
			}
		}
		// The base the directories came from is pruned; their files come
		// from the revision they were repointed at, here and after a crash.
		w.Close(ctx)
		w2 := openWS(t, base, "virt", Options{NoLock: true})
		if _, err := w2.resumePending(dst, format.Selection{}, false); err != nil {
			t.Fatal(err)
		}
		check := filepath.Join(t.TempDir(), "c")
		w3 := openWS(t, base, "virt", Options{NoLock: true})
		if _, err := w3.Restore(ctx, "current", check, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		for p, want := range files {
			if err := w2.ensure(ctx, p); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			for _, d := range []string{dst, check} {
				if got, _ := os.ReadFile(filepath.Join(d, p)); string(got) != want {
					t.Errorf("%s in %s: %q, want %q", p, d, got, want)
				}
			}
		}
		if _, err := os.Lstat(filepath.Join(check, "c/new.log")); err == nil {
			t.Error("c/new.log saved: the restored .gitignore was not read")
		}
	})
}

// A directory not made yet that a save does not look into (ignored since
// the restore) is made, and its files fetched, before the revision it
// comes from is pruned: it is never stranded.
func TestPruneMakesUnlistedPendingDirectories(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		w, dst := lazyTree(t, newBase(t, sk), "unlisted", map[string]string{"top.txt": "top", "b/3": "three", "b/deep/4": "four"},
			Options{Retention: 1, Format: format.FormatArchive})
		if err := w.ensureDir(ctx, ""); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dst, ".gitignore"), []byte("b/\n"), 0o644)
		if _, err := w.Save(ctx, dst, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		w.prunes.Wait()
		for p, want := range map[string]string{"b/3": "three", "b/deep/4": "four"} {
			if err := w.ensure(ctx, p); err != nil {
				t.Fatalf("%s after its revision was pruned: %v", p, err)
			}
			if got, _ := os.ReadFile(filepath.Join(dst, p)); string(got) != want {
				t.Errorf("%s = %q, want %q", p, got, want)
			}
		}
	})
}
