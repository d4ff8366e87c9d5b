package revision

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/format"
)

func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "protocol.file.allow=always", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v in %s: %v\n%s", args, dir, err, out)
	}
	return string(out)
}

// TestRefreshGitIndexes: after a lazy restore served with the disk's own
// stat data (natively), git's indexes (the repository's, a linked
// worktree's, a submodule's) match the restored files: git diff-files,
// which compares stat data only, lists nothing, although every file is a
// new inode and none has been fetched. git status and git diff then give
// what they gave before the save, and the refresh fetched no file outside
// .git. Without the refresh, every file is listed.
func TestRefreshGitIndexes(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	forStoresFormats(t, func(t *testing.T, sk, form string) {
		ctx := context.Background()
		base := newBase(t, sk)
		dir := filepath.Join(t.TempDir(), "ws")
		os.Mkdir(dir, 0o755)
		files := map[string]string{}
		for i := range 40 {
			files[fmt.Sprintf("src/d%d/f%02d.go", i%4, i)] = fmt.Sprintf("package d // %d\n", i)
		}
		writeTree(t, dir, files)
		os.Symlink("src/d0/f00.go", filepath.Join(dir, "link.go"))
		gitIn(t, dir, "init", "-q")
		gitIn(t, dir, "add", "-A")
		gitIn(t, dir, "commit", "-q", "-m", "one")
		gitIn(t, dir, "worktree", "add", "-q", "-b", "other", "wt2")
		os.MkdirAll(filepath.Join(dir, "subsrc"), 0o755)
		writeTree(t, dir, map[string]string{"subsrc/s.txt": "sub\n", "subsrc/x/y.txt": "y\n"})
		gitIn(t, filepath.Join(dir, "subsrc"), "init", "-q")
		gitIn(t, filepath.Join(dir, "subsrc"), "add", "-A")
		gitIn(t, filepath.Join(dir, "subsrc"), "commit", "-q", "-m", "sub")
		os.WriteFile(filepath.Join(dir, ".git/info/exclude"), []byte("wt2\nsubsrc\n"), 0o644)
		gitIn(t, dir, "submodule", "add", "-q", "./subsrc", "sub")
		gitIn(t, dir, "commit", "-q", "-m", "sub")
		// A change git has not seen, and one it has (staged).
		os.WriteFile(filepath.Join(dir, "src/d1/f01.go"), []byte("changed\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "src/d2/f02.go"), []byte("staged\n"), 0o644)
		gitIn(t, dir, "add", "src/d2/f02.go")
		time.Sleep(1100 * time.Millisecond) // past git's racy-clean window
		// The submodule first: git in the superproject runs git status in
		// it, which refreshes its index.
		repos := []string{"sub", "wt2", "."}
		before := map[string]string{}
		for _, r := range repos {
			d := filepath.Join(dir, r)
			before[r] = gitIn(t, d, "status", "--porcelain") + gitIn(t, d, "diff")
		}

		// git's objects are read-only; a daemon that is not root cannot
		// fill a read-only placeholder yet (the fill opens it for
		// writing), and this test fills them to run git: u+w.
		filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o200 == 0 {
				os.Chmod(p, fi.Mode().Perm()|0o200)
			}
			return nil
		})
		w := openWS(t, base, "git", Options{LazyRestore: true, Format: form})
		if _, err := w.Save(ctx, dir, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		for _, refresh := range []bool{false, true} {
			// At the same path: a linked worktree records its path.
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Restore(ctx, "current", dir, format.Selection{}); err != nil {
				t.Fatal(err)
			}
			if err := w.populateAll(ctx); err != nil {
				t.Fatal(err)
			}
			// git must read its own files: fill them (and the submodule's
			// and worktree's .git files), never the tracked files of src.
			filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
				rel, _ := filepath.Rel(dir, p)
				if err == nil && fi.Mode().IsRegular() && !strings.HasPrefix(rel, "src/") && !strings.HasPrefix(rel, "wt2/src/") {
					if err := w.ensure(ctx, rel); err != nil {
						t.Fatal(err)
					}
				}
				return nil
			})
			pending, _ := w.pending()
			if refresh {
				res, err := w.RefreshGitIndexes(ctx, dir)
				if err != nil || res.Indexes != 4 || len(res.Left) != 0 || res.Stale != 1 {
					t.Fatalf("refresh: %+v, %v", res, err)
				}
				t.Logf("%+v", res)
				if now, _ := w.pending(); now != pending {
					t.Errorf("the refresh fetched %d files", pending-now)
				}
			}
			for _, r := range repos {
				stale := gitIn(t, filepath.Join(dir, r), "diff-files", "--name-only")
				if refresh && stale != "src/d1/f01.go\n" && !(r != "." && stale == "") {
					t.Errorf("%s: after the refresh git diff-files lists:\n%s", r, stale)
				}
				if !refresh && strings.Count(stale, "\n") < 2 {
					t.Errorf("%s: a restore matched git's index without a refresh: the test cannot fail (%q)", r, stale)
				}
			}
			if !refresh {
				continue
			}
			if now, _ := w.pending(); now != pending {
				t.Errorf("git diff-files fetched %d files", pending-now)
			}
			// Fill what git will read, then compare with before the save.
			for p := range files {
				if err := w.ensure(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range repos {
				d := filepath.Join(dir, r)
				if got := gitIn(t, d, "status", "--porcelain") + gitIn(t, d, "diff"); got != before[r] {
					t.Errorf("%s: git status and diff after the restore:\n%s\nbefore the save:\n%s", r, got, before[r])
				}
			}
		}
	})
}
