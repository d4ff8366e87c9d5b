package revision

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/amlfs/amlfs/revision/format"
	"golang.org/x/sys/unix"
)

func TestLazyRestore(t *testing.T) {
	forStoresFormats(t, func(t *testing.T, sk, form string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"a/one.txt": "one", "a/two.txt": "second file", "b/three.bin": strings.Repeat("3", 5000), "empty/": ""})
		os.Chmod(filepath.Join(src, "a/two.txt"), 0o640)
		w := openWS(t, base, "lazy", Options{LazyRestore: true, Retention: 5, Format: form})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		// The directories are there at once; their files are made on first
		// use of each directory.
		if des, err := os.ReadDir(filepath.Join(dst, "a")); err != nil || len(des) != 0 {
			t.Fatalf("a/ before first use: %v %v", des, err)
		}
		for _, d := range []string{"a", "b", "empty", "a"} {
			if err := w.ensureDir(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
		// Then the files, sizes and modes are there; the bytes are not.
		if n, b := w.pending(); n != 3 || b != 3+11+5000 {
			t.Fatalf("pending %d files, %d bytes", n, b)
		}
		fi, err := os.Stat(filepath.Join(dst, "a/two.txt"))
		if err != nil || fi.Size() != 11 || fi.Mode().Perm() != 0o640 {
			t.Fatalf("placeholder stat: %v %v", fi, err)
		}
		if raw, _ := os.ReadFile(filepath.Join(dst, "a/two.txt")); string(raw) == "second file" {
			t.Fatal("bytes fetched eagerly")
		}
		// Ensure fetches, exactly once, and keeps the inode.
		var before, after syscall.Stat_t
		syscall.Stat(filepath.Join(dst, "a/two.txt"), &before)
		if err := w.ensure(ctx, "a/two.txt"); err != nil {
			t.Fatal(err)
		}
		syscall.Stat(filepath.Join(dst, "a/two.txt"), &after)
		if got, _ := os.ReadFile(filepath.Join(dst, "a/two.txt")); string(got) != "second file" || before.Ino != after.Ino {
			t.Fatalf("after Ensure: %q, inode %d -> %d", got, before.Ino, after.Ino)
		}
		if n, _ := w.pending(); n != 2 {
			t.Errorf("pending after one fetch: %d", n)
		}
		// A chmod'd placeholder must be saved with its real bytes, not zeros;
		// an untouched one is reused without fetching.
		os.Chmod(filepath.Join(dst, "b/three.bin"), 0o600)
		res, err := w.Save(ctx, dst, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if res.Uploaded != 1 || res.Reused != 2 {
			t.Errorf("save over placeholders: uploaded %d reused %d", res.Uploaded, res.Reused)
		}
		if n, _ := w.pending(); n != 1 {
			t.Errorf("pending after save: %d (a/one.txt should still be lazy)", n)
		}
		// "Crash": a fresh workspace finds the remaining placeholder by xattr.
		w2 := openWS(t, base, "lazy2", Options{NoLock: true})
		if n, err := w2.resumePending(dst, format.Selection{}, false); err != nil || n != 1 {
			t.Fatalf("resume: %d %v", n, err)
		}
		w.prefetch(ctx, 2)
		if n, _ := w.pending(); n != 0 {
			t.Errorf("pending after prefetch: %d", n)
		}
		check := filepath.Join(t.TempDir(), "c")
		w3 := openWS(t, base, "lazy", Options{NoLock: true})
		if _, err := w3.Restore(ctx, "current", check, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]string{"a/one.txt": "one", "a/two.txt": "second file", "b/three.bin": strings.Repeat("3", 5000)} {
			for _, d := range []string{dst, check} {
				if got, _ := os.ReadFile(filepath.Join(d, p)); string(got) != want {
					t.Errorf("%s in %s: %d bytes, want %d", p, d, len(got), len(want))
				}
			}
		}
		buf := make([]byte, 100)
		if _, err := unix.Getxattr(filepath.Join(dst, "a/one.txt"), PendingXattr(), buf); err == nil {
			t.Error("marker left after fetch")
		}
	})
}

func TestProgressReports(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"a": "12345", "b/c": "678"})
		var last Progress
		var mu sync.Mutex
		w := openWS(t, base, "prog", Options{Progress: func(p Progress) { mu.Lock(); last = p; mu.Unlock() }})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !last.Done || last.Phase != "save" || last.Files != 2 || last.TotalFiles != 2 || last.Bytes != 8 || last.TotalBytes != 8 {
			t.Errorf("last report %+v", last)
		}
	})
}

// Pruning never strands a placeholder: a save repoints reused placeholders
// at the new revision, and fetches the rest before pruning.
func TestLazyPlaceholdersSurvivePruning(t *testing.T) {
	forStoresFormats(t, func(t *testing.T, sk, form string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"keep.txt": "kept", "skip.log": "excluded later", "x.txt": "x"})
		w := openWS(t, base, "prune", Options{LazyRestore: true, Retention: 1, Format: form})
		if _, err := w.Save(ctx, src, format.Selection{NoGitignore: true}, ""); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		// Writes reach the working dir through the mount, which populates the
		// directory and fetches the file first.
		if err := w.ensureDir(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if err := w.ensure(ctx, "x.txt"); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dst, "x.txt"), []byte("changed"), 0o644)
		// skip.log is not in this save's selection, so its bytes exist only in
		// the revision being pruned.
		if _, err := w.Save(ctx, dst, format.Selection{Exclude: []string{"*.log"}}, ""); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]string{"keep.txt": "kept", "skip.log": "excluded later", "x.txt": "changed"} {
			if got, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(got) != want {
				// read straight from the working dir: only correct if fetched
				// or still fetchable.
				if err := w.ensure(ctx, p); err != nil {
					t.Fatalf("%s: %v", p, err)
				}
				if got, _ := os.ReadFile(filepath.Join(dst, p)); string(got) != want {
					t.Errorf("%s = %q, want %q", p, got, want)
				}
			}
		}
		if n, _ := w.pending(); n != 0 {
			w.prefetch(ctx, 1)
		}
		if n, _ := w.pending(); n != 0 {
			t.Errorf("%d placeholders could not be fetched after pruning", n)
		}
	})
}

// A directory not yet populated survives a crash and a move of its parent:
// the next run finds it by its marker and makes the placeholders of the
// directory's manifest path at wherever it is now, and a save after that
// holds every file with its bytes.
func TestLazyDirectoriesResumeAfterCrash(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"top.txt": "top", "p/q/deep.txt": "deep bytes", "p/q/r/deeper.txt": "deeper", "p/side.txt": "side"})
		w := openWS(t, base, "lazydir", Options{LazyRestore: true, Retention: 3})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		if err := w.ensureDir(ctx, "p"); err != nil {
			t.Fatal(err)
		}
		// p is whole, so moving p/q is allowed (the mount populates the
		// moved directory itself first; a move of an ancestor does not).
		if err := os.Rename(filepath.Join(dst, "p"), filepath.Join(dst, "moved")); err != nil {
			t.Fatal(err)
		}
		w.Close(ctx)

		// "Crash": a fresh workspace finds what is left to do by its markers.
		w2 := openWS(t, base, "lazydir", Options{NoLock: true})
		if _, err := w2.resumePending(dst, format.Selection{}, false); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{"", "moved", "moved/q", "moved/q/r"} {
			if err := w2.ensureDir(ctx, d); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 200)
			if _, err := unix.Lgetxattr(filepath.Join(dst, d), PendingDirXattr(), buf); err == nil {
				t.Errorf("%q still marked after EnsureDir", d)
			}
		}
		want := map[string]string{"top.txt": "top", "moved/q/deep.txt": "deep bytes", "moved/q/r/deeper.txt": "deeper", "moved/side.txt": "side"}
		for p, content := range want {
			if err := w2.ensure(ctx, p); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if got, _ := os.ReadFile(filepath.Join(dst, p)); string(got) != content {
				t.Errorf("%s = %q, want %q", p, got, content)
			}
		}
		if _, err := w2.Save(ctx, dst, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		check := filepath.Join(t.TempDir(), "c")
		w3 := openWS(t, base, "lazydir", Options{NoLock: true})
		if _, err := w3.Restore(ctx, "current", check, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		for p, content := range want {
			if got, _ := os.ReadFile(filepath.Join(check, p)); string(got) != content {
				t.Errorf("saved %s = %q, want %q", p, got, content)
			}
		}
	})
}

// Population never replaces a file it did not make, and an interrupted
// population is finished without duplicating or clobbering.
func TestLazyPopulationIsIdempotent(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"d/a.txt": "aaa", "d/b.txt": "bbbb"})
		w := openWS(t, base, "idem", Options{LazyRestore: true})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		if err := w.ensureDir(ctx, "d"); err != nil {
			t.Fatal(err)
		}
		// Put the marker back, as if the run had died before clearing it, and
		// replace b.txt with a file that is not a placeholder.
		var rev string
		for _, e := range w.Index().Revisions {
			rev = e.Path
		}
		if err := unix.Lsetxattr(filepath.Join(dst, "d"), PendingDirXattr(), []byte(rev+"\x00d"), 0); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(dst, "d/b.txt"))
		os.WriteFile(filepath.Join(dst, "d/b.txt"), []byte("mine"), 0o644)
		w2 := openWS(t, base, "idem", Options{NoLock: true})
		if _, err := w2.resumePending(dst, format.Selection{}, false); err != nil {
			t.Fatal(err)
		}
		if err := w2.ensureDir(ctx, "d"); err != nil {
			t.Fatal(err)
		}
		if n, _ := w2.pending(); n != 1 {
			t.Errorf("pending %d, want 1 (a.txt)", n)
		}
		if err := w2.ensure(ctx, "d/a.txt"); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]string{"d/a.txt": "aaa", "d/b.txt": "mine"} {
			if got, _ := os.ReadFile(filepath.Join(dst, p)); string(got) != want {
				t.Errorf("%s = %q, want %q", p, got, want)
			}
		}
	})
}

// A save repoints the placeholders not fetched at the new revision; the
// new marker is a new ctime, which must not make the next save take every
// placeholder for changed (fetching and uploading the whole tree).
func TestRepointKeepsReuse(t *testing.T) {
	forStoresFormats(t, func(t *testing.T, sk, form string) {
		ctx := context.Background()
		w, dst := lazyTree(t, newBase(t, sk), "repoint", map[string]string{"a/1": "one", "a/2": "two", "b/3": "three", "b/4": "four", "c": "c"},
			Options{Retention: 5, Format: form})
		for i, change := range []string{"c", "a/1"} {
			if err := w.ensure(ctx, change); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dst, change), []byte("changed"), 0o644)
			res, err := w.Save(ctx, dst, format.Selection{}, "")
			if err != nil {
				t.Fatal(err)
			}
			w.prunes.Wait() // the repointing, after the save
			if res.Uploaded != 1 {
				t.Errorf("save %d after a one-file change uploaded %d files, reused %d", i+1, res.Uploaded, res.Reused)
			}
		}
		if n, _ := w.pending(); n != 3 {
			t.Errorf("%d placeholders still pending, want 3 (nothing fetched but the changed files)", n)
		}
	})
}

// A population interrupted half way through a placeholder (created with
// mode 0600 and no marker yet, or marked but without its size, mode
// or times) makes it again on the next population; it never leaves a file
// that passes for content, and never touches a file that is not its own.
func TestInterruptedPlaceholdersRemade(t *testing.T) {
	ctx := context.Background()
	base := newBase(t, "mem")
	files := map[string]string{"d/bare": "bare bytes", "d/marked": "marked bytes", "d/mine": "x", "d/whole": "whole"}
	w, dst := lazyTree(t, base, "interrupted", files, Options{Format: format.FormatArchive})
	if err := w.ensureDir(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := unix.Lgetxattr(filepath.Join(dst, "d/marked"), PendingXattr(), buf)
	if err != nil {
		t.Fatal(err)
	}
	marker := append([]byte(nil), buf[:n]...)
	// As a crash would leave them: the directory still to populate; bare
	// created (madeMode) and nothing more; marked with its marker but no size; mine
	// an empty file of someone else's (mode 0644).
	rev := w.Index().Revisions[0].Path
	if err := unix.Lsetxattr(filepath.Join(dst, "d"), PendingDirXattr(), []byte(rev+"\x00d"), 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"bare", "marked", "mine"} {
		os.Remove(filepath.Join(dst, "d", p))
	}
	mk := func(p string, mode uint32) {
		fd, err := unix.Open(filepath.Join(dst, "d", p), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, mode)
		if err != nil {
			t.Fatal(err)
		}
		unix.Fchmod(fd, mode)
		unix.Close(fd)
	}
	mk("bare", madeMode)
	mk("marked", madeMode)
	mk("mine", 0o644)
	if err := unix.Lsetxattr(filepath.Join(dst, "d/marked"), PendingXattr(), marker, 0); err != nil {
		t.Fatal(err)
	}
	w2 := openWS(t, base, "interrupted", Options{NoLock: true})
	if _, err := w2.resumePending(dst, format.Selection{}, false); err != nil {
		t.Fatal(err)
	}
	if err := w2.ensureDir(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	files["d/mine"] = "" // not its own: left alone
	for p, want := range files {
		if err := w2.ensure(ctx, p); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if got, _ := os.ReadFile(filepath.Join(dst, p)); string(got) != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
}
