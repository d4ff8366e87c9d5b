package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileStoreNoSymlinks: a root daemon never follows a symlink planted in
// a file store. A files/x symlink to a root-only file outside does not
// restore that file's bytes (a full restore fails with INVALID_STORE, a lazy
// one reads EIO), and a revisions/ symlink to another directory does not
// make a save's orphan cleanup delete what is there.
func TestFileStoreNoSymlinks(t *testing.T) {
	e := newEnv(t)
	e.folder() // a test of the folder layout
	secret := filepath.Join(t.TempDir(), "secret")
	must(t, os.WriteFile(secret, []byte("S\n"), 0o600)) // as long as x: a size check alone does not catch it
	mp := e.mount("planted")
	sh(t, mp, "echo x > x")
	r := e.unmount(mp)
	if r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	rev := strings.TrimSpace(r.stdout)
	obj := filepath.Join(e.storeD, "planted", "revisions", rev, "files", "x")
	must(t, os.Remove(obj))
	must(t, os.Symlink(secret, obj))
	h := e.host(t)
	r = h.mountAt(filepath.Join(h.root, "full"), "planted", "--restore", "full")
	if r.code == 0 || !strings.Contains(r.stderr, "INVALID_STORE") {
		t.Errorf("full restore through a planted symlink: %s", r)
	}
	l := e.host(t)
	mp = l.mount("planted", "--no-lock", "--save", "never")
	if got, err := os.ReadFile(filepath.Join(mp, "x")); err == nil || string(got) == "S\n" {
		t.Errorf("lazy read through a planted symlink: %q, %v", got, err)
	}
	l.unmount(mp)

	// revisions/ itself a symlink to a directory outside.
	outside := t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, "victim"), []byte("v"), 0o644))
	e2 := newEnv(t)
	e2.folder() // a test of the folder layout
	mp = e2.mount("planted2")
	sh(t, mp, "echo y > y")
	if r := e2.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	revs := filepath.Join(e2.storeD, "planted2", "revisions")
	must(t, os.Rename(revs, revs+".real"))
	must(t, os.Symlink(outside, revs))
	sh(t, mp, "echo z > z")
	e2.amlfs("commit", mp)
	e2.unmount(mp, "--no-save")
	if !fileExists(filepath.Join(outside, "victim")) {
		t.Error("a save deleted a file outside the store through a revisions/ symlink")
	}
}

// TestFileStoreKeepsPrivacy: the store keeps to its owner: directories are
// 0700, and an object has no more than its file's owner bits.
func TestFileStoreKeepsPrivacy(t *testing.T) {
	e := newEnv(t)
	e.folder() // a test of the folder layout
	mp := e.mount("private")
	sh(t, mp, "echo key > server.key && chmod 600 server.key && echo pub > pub.txt && echo : > run.sh && chmod 755 run.sh")
	r := e.unmount(mp)
	if r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	files := filepath.Join(e.storeD, "private", "revisions", strings.TrimSpace(r.stdout), "files")
	for name, want := range map[string]os.FileMode{"server.key": 0o600, "pub.txt": 0o600, "run.sh": 0o700} {
		fi, err := os.Stat(filepath.Join(files, name))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s in the store: %v, %v; want %o", name, fi.Mode(), err, want)
		}
	}
	for _, d := range []string{"", "revisions", filepath.Join("revisions", strings.TrimSpace(r.stdout)), filepath.Join("revisions", strings.TrimSpace(r.stdout), "files")} {
		if fi, err := os.Stat(filepath.Join(e.storeD, "private", d)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("store directory %q: %v, %v; want 0700", d, fi.Mode(), err)
		}
	}
}
