package gitindex

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "protocol.file.allow=always", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func statOf(t *testing.T, p string) Stat {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return Stat{Ctime: Time{uint32(st.Ctim.Sec), uint32(st.Ctim.Nsec)}, Mtime: Time{uint32(st.Mtim.Sec), uint32(st.Mtim.Nsec)},
		Dev: uint32(st.Dev), Ino: uint32(st.Ino), Uid: st.Uid, Gid: st.Gid, Size: uint32(st.Size)}
}

// restoreCopy copies the tree src to dst as a restore does: the same bytes,
// modes and mtimes, in new inodes.
func restoreCopy(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, fi.Mode().Perm())
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
			ts := []syscall.Timespec{syscall.NsecToTimespec(fi.ModTime().UnixNano()), syscall.NsecToTimespec(fi.ModTime().UnixNano())}
			return utimesNoFollow(to, ts)
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := os.WriteFile(to, data, fi.Mode().Perm()); err != nil {
				return err
			}
			return os.Chtimes(to, fi.ModTime(), fi.ModTime())
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// refreshed refreshes dst's index at rel against the saved tree src, as the
// engine does: an entry whose stat data match the saved file's gets the
// restored file's.
func refreshed(t *testing.T, src, dst, rel, wt string) Result {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dst, rel))
	if err != nil {
		t.Fatal(err)
	}
	idx := statOf(t, filepath.Join(src, rel))
	out, res, err := Refresh(data, idx.Mtime, func(e Entry) (Stat, bool) {
		if statOf(t, filepath.Join(src, wt, e.Path)) != e.Stat {
			return e.Stat, false
		}
		return statOf(t, filepath.Join(dst, wt, e.Path)), true
	})
	if err != nil {
		t.Fatalf("refresh %s: %v", rel, err)
	}
	if err := os.WriteFile(filepath.Join(dst, rel), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return res
}

// stale lists what git diff-files finds changed in dir: it compares stat
// data only, never content, so an entry that does not match its file is
// listed whatever its bytes.
func stale(t *testing.T, dir string) string {
	return strings.TrimSpace(git(t, dir, "diff-files", "--name-only"))
}

// repo makes a repository of n files and a symlink, committed, with mtimes
// an hour back (so no entry is racily clean), and its index refreshed.
func repo(t *testing.T, dir string, n int, initArgs ...string) {
	t.Helper()
	git(t, dir, append([]string{"init", "-q"}, initArgs...)...)
	past := time.Now().Add(-time.Hour)
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d/s%d/f%03d", i%5, i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, past, past)
	}
	if err := os.Symlink("d", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	utimesNoFollow(filepath.Join(dir, "link"), []syscall.Timespec{syscall.NsecToTimespec(past.UnixNano()), syscall.NsecToTimespec(past.UnixNano())})
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "one")
	git(t, dir, "status", "--porcelain")
}

func TestRefreshWithGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	for _, c := range []struct {
		name    string
		init    []string
		version string // update-index --index-version
	}{
		{"v2", nil, "2"},
		{"v3", nil, "3"},
		{"v4", nil, "4"},
		{"sha256-v2", []string{"--object-format=sha256"}, "2"},
		{"sha256-v4", []string{"--object-format=sha256"}, "4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, dst := t.TempDir(), t.TempDir()
			repo(t, src, 60, c.init...)
			git(t, src, "update-index", "--index-version", c.version)
			if c.version == "3" {
				// An extended flag makes git keep version 3.
				git(t, src, "update-index", "--skip-worktree", "d/s0/f000")
			}
			git(t, src, "status", "--porcelain")
			restoreCopy(t, src, dst)
			if stale(t, dst) == "" {
				t.Fatal("a copied tree matches its index before any refresh: the test cannot fail")
			}
			before := git(t, dst, "status", "--porcelain")
			// git status refreshes the index itself; start over.
			os.RemoveAll(dst)
			restoreCopy(t, src, dst)
			res := refreshed(t, src, dst, ".git/index", "")
			if fmt.Sprint(res.Version) != c.version || (strings.HasPrefix(c.name, "sha256") != (res.HashSize == 32)) {
				t.Errorf("read a version %d index with %d-byte hashes", res.Version, res.HashSize)
			}
			if res.Refreshed < 60 {
				t.Errorf("refreshed %d entries of %d (version %d, hash %d)", res.Refreshed, res.Entries, res.Version, res.HashSize)
			}
			if got := stale(t, dst); got != "" {
				t.Errorf("after the refresh git diff-files still lists:\n%s", got)
			}
			if after := git(t, dst, "status", "--porcelain"); after != before {
				t.Errorf("git status after the refresh:\n%s\nbefore:\n%s", after, before)
			}
			if diff := git(t, dst, "diff"); diff != "" {
				t.Errorf("git diff after the refresh:\n%s", diff)
			}
			git(t, dst, "fsck", "--no-progress")
		})
	}
}

// TestRefreshKeepsWhatGitWouldCheck: a racily clean entry, one whose file
// changed after git recorded it, and an assume-unchanged one are left as
// they were; every other byte is kept.
func TestRefreshKeepsWhatGitWouldCheck(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	src, dst := t.TempDir(), t.TempDir()
	repo(t, src, 10)
	// Racily clean: modified in the second the index is written.
	now := time.Now().Add(-2 * time.Second).Truncate(time.Second)
	os.WriteFile(filepath.Join(src, "racy"), []byte("r"), 0o644)
	os.Chtimes(filepath.Join(src, "racy"), now, now)
	git(t, src, "add", "racy")
	idx := filepath.Join(src, ".git/index")
	os.Chtimes(idx, now, now)
	// Changed since git recorded it, same size and mtime: only its
	// ctime and inode moved.
	changed := filepath.Join(src, "d/s0/f000")
	fi, _ := os.Stat(changed)
	os.Remove(changed)
	os.WriteFile(changed, bytes.Repeat([]byte("Z"), int(fi.Size())), 0o644)
	os.Chtimes(changed, fi.ModTime(), fi.ModTime())
	git(t, src, "update-index", "--assume-unchanged", "d/s1/f001")
	os.Chtimes(idx, now, now)
	restoreCopy(t, src, dst)
	orig, _ := os.ReadFile(filepath.Join(dst, ".git/index"))
	res := refreshed(t, src, dst, ".git/index", "")
	if res.Racy != 1 {
		t.Errorf("racy entries = %d, want 1", res.Racy)
	}
	got := stale(t, dst)
	for _, p := range []string{"racy", "d/s0/f000"} {
		if !strings.Contains(got, p) {
			t.Errorf("%s was refreshed; git diff-files lists only:\n%s", p, got)
		}
	}
	out, _ := os.ReadFile(filepath.Join(dst, ".git/index"))
	if len(out) != len(orig) || !bytes.Equal(out[len(out)-int(res.HashSize)-8:len(out)-int(res.HashSize)], orig[len(orig)-int(res.HashSize)-8:len(orig)-int(res.HashSize)]) {
		t.Error("the index changed size or its extensions changed")
	}
	if s := git(t, dst, "status", "--porcelain"); !strings.Contains(s, "d/s0/f000") {
		t.Errorf("git status misses the change:\n%s", s)
	}
}

// TestRefreshLeavesAlone: a split index and an index without a checksum
// are refused; garbage is refused, never patched.
func TestRefreshLeavesAlone(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	src := t.TempDir()
	repo(t, src, 5)
	git(t, src, "update-index", "--split-index")
	data, _ := os.ReadFile(filepath.Join(src, ".git/index"))
	if _, _, err := Refresh(data, Time{}, func(e Entry) (Stat, bool) { return Stat{}, true }); err == nil {
		t.Error("a split index was refreshed")
	}
	src = t.TempDir()
	repo(t, src, 5)
	git(t, src, "config", "index.skipHash", "true")
	git(t, src, "update-index", "--really-refresh")
	os.WriteFile(filepath.Join(src, "new"), []byte("n"), 0o644)
	git(t, src, "add", "new")
	data, _ = os.ReadFile(filepath.Join(src, ".git/index"))
	if bytes.Equal(data[len(data)-20:], make([]byte, 20)) {
		if _, _, err := Refresh(data, Time{}, func(e Entry) (Stat, bool) { return Stat{}, true }); err == nil {
			t.Error("an index without a checksum was refreshed")
		}
	}
	for _, b := range [][]byte{nil, []byte("DIRC"), []byte("DIRC\x00\x00\x00\x05\x00\x00\x00\x00" + strings.Repeat("\x00", 20))} {
		if _, _, err := Refresh(b, Time{}, func(e Entry) (Stat, bool) { return Stat{}, true }); err == nil {
			t.Errorf("%q was refreshed", b)
		}
	}
}

func FuzzRefresh(f *testing.F) {
	if _, err := exec.LookPath("git"); err == nil {
		dir := f.TempDir()
		for _, v := range []string{"2", "4"} {
			cmd := exec.Command("sh", "-c", "git init -q . && echo a > a && mkdir d && echo b > d/b && git add -A && git update-index --index-version "+v)
			cmd.Dir = dir
			if cmd.Run() == nil {
				data, _ := os.ReadFile(filepath.Join(dir, ".git/index"))
				f.Add(data)
			}
			os.RemoveAll(filepath.Join(dir, ".git"))
		}
	}
	f.Add([]byte("DIRC\x00\x00\x00\x02\x00\x00\x00\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, res, err := Refresh(data, Time{Sec: 1}, func(e Entry) (Stat, bool) {
			e.Stat.Ino++
			return e.Stat, true
		})
		if err != nil {
			return
		}
		if len(out) != len(data) {
			t.Fatalf("refresh changed the length: %d to %d", len(data), len(out))
		}
		// Only stat fields and the checksum change: a second pass reads
		// the same entries.
		if _, res2, err := Refresh(out, Time{Sec: 1}, func(e Entry) (Stat, bool) { return e.Stat, false }); err != nil || res2.Entries != res.Entries {
			t.Fatalf("the refreshed index does not read back: %v", err)
		}
	})
}
