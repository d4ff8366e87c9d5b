package integration

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/format"
)

// TestRevisionsDiff checks `amlfs revisions diff` on a known pair of
// revisions, on both stores: the text lines and the JSON.
func TestRevisionsDiff(t *testing.T) { forEachStore(t, testRevisionsDiff) }

func testRevisionsDiff(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("diff", "--retention", "3")
	sh(t, mp, `mkdir -p src old && echo same > src/same.txt && echo aaaa > src/swap.txt && echo short > grow.txt && echo bye > old/gone.txt && echo '#!/bin/sh' > run.sh`)
	r := e.amlfs("commit", mp)
	if r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	a := strings.TrimSpace(r.stdout)
	sh(t, mp, `echo bbbb > src/swap.txt && echo much longer now > grow.txt && rm -r old && chmod 755 run.sh && printf hello > new.txt`)
	r = e.amlfs("commit", mp)
	if r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	b := strings.TrimSpace(r.stdout)
	r = e.amlfs(append([]string{"revisions", "diff", a, b}, e.storeFlags("diff")...)...)
	want := strings.Join([]string{
		"M  grow.txt  6 bytes -> 16 bytes",
		"A  new.txt  5 bytes",
		"D  old  directory",
		"D  old/gone.txt  4 bytes",
		"M  run.sh  10 bytes -> 10 bytes  mode 0644 -> 0755",
		"M  src/swap.txt  5 bytes -> 5 bytes  (content)",
	}, "\n") + "\n"
	if r.code != 0 || r.stdout != want {
		t.Fatalf("revisions diff:\n%s\nwant:\n%s", r, want)
	}
	r = e.amlfs(append([]string{"revisions", "diff", b, "current", "--json"}, e.storeFlags("diff")...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("diff of current against itself: %s", r)
	}
	r = e.amlfs(append([]string{"revisions", "diff", a}, e.storeFlags("diff")...)...)
	if r.code != 2 {
		t.Fatalf("diff with one revision: %s", r)
	}
	e.unmount(mp)
}

// TestFstab mounts through mount(8): `mount -t fuse.amlfs` with the options
// mount and systemd inject, and an fstab line with `mount -T FSTAB`. The
// helper is /sbin/mount.fuse.amlfs, a link to amlfs. uid=, gid= and umask=
// change what every file shows; `umount` saves, as an external unmount.
func TestFstab(t *testing.T) {
	helper := "/sbin/mount.fuse.amlfs"
	if _, err := os.Lstat(helper); err == nil {
		t.Skipf("%s exists already; not replacing it", helper)
	}
	if err := os.Symlink(amlfsBin, helper); err != nil {
		t.Skipf("cannot install the helper: %v", err)
	}
	t.Cleanup(func() { os.Remove(helper) })
	e := newEnv(t)
	e.folder() // a test of the folder layout
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "AMLFS_RUNTIME_DIR="+e.runtime)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	mp := filepath.Join(e.root, "mnt")
	os.Mkdir(mp, 0o755)
	run("mount", "-t", "fuse.amlfs", e.store, mp, "-o",
		"rw,nosuid,nodev,_netdev,nofail,x-systemd.automount,id=fst,cache-dir="+e.cache+",allow_other,default_permissions,uid=1234,gid=2345,umask=027")
	t.Cleanup(func() { e.forceUnmount(mp) })
	if !isMounted(mp) {
		t.Fatal("mount -t fuse.amlfs did not mount")
	}
	sh(t, mp, "echo hello > a.txt && chmod 666 a.txt && mkdir d")
	for name, mode := range map[string]os.FileMode{"a.txt": 0o640, "d": 0o750 | os.ModeDir} {
		fi, err := os.Stat(filepath.Join(mp, name))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 1234 || st.Gid != 2345 || fi.Mode() != mode {
			t.Errorf("%s: uid %d gid %d mode %v; want 1234 2345 %v", name, st.Uid, st.Gid, fi.Mode(), mode)
		}
	}
	if out := run("findmnt", "-n", "-o", "FSTYPE,OPTIONS", mp); !strings.Contains(out, "fuse.amlfs") || !strings.Contains(out, "allow_other") {
		t.Errorf("findmnt: %s", out)
	}
	run("umount", mp)
	waitFor(t, func() bool { return !isMounted(mp) && e.lockExists("fst") == false })
	if got := e.revisionFile(t, "fst", "a.txt"); got != "hello\n" {
		t.Fatalf("after umount the revision holds a.txt = %q", got)
	}

	// The same from an fstab line.
	fstab := filepath.Join(e.root, "fstab")
	line := fmt.Sprintf("%s %s fuse.amlfs id=fst,cache-dir=%s,retention=2,noauto,x-systemd.requires=network-online.target 0 0\n", e.store, mp, e.cache)
	os.WriteFile(fstab, []byte("# amlfs\n"+line), 0o644)
	run("mount", "-T", fstab, mp)
	if got, _ := os.ReadFile(filepath.Join(mp, "a.txt")); string(got) != "hello\n" {
		t.Fatalf("fstab mount: a.txt = %q", got)
	}
	run("umount", mp)
	waitFor(t, func() bool { return !isMounted(mp) })
}

// revisionFile reads rel from workspace id's current revision, straight
// from a file store.
func (e *env) revisionFile(t *testing.T, id, rel string) string {
	t.Helper()
	return e.revisionFileAt(t, id, readIndex(t, e, id).Current, rel)
}

// revisionFileAt reads rel from revision rev of workspace id, straight
// from a file store.
func (e *env) revisionFileAt(t *testing.T, id, rev, rel string) string {
	t.Helper()
	idx := readIndex(t, e, id)
	cur, ok := idx.Find(rev)
	if !ok {
		t.Fatalf("no revision %s of %s", rev, id)
	}
	if cur.Format == format.FormatArchive {
		var got *string
		err := e.eachArchiveFile(id, cur, func(p string, r io.Reader) error {
			if p == rel {
				b, err := io.ReadAll(r)
				s := string(b)
				got = &s
				return err
			}
			return nil
		})
		if err != nil || got == nil {
			t.Fatalf("%s in %s: %v", rel, cur.Path, err)
		}
		return *got
	}
	data, err := os.ReadFile(filepath.Join(e.storeD, id, filepath.FromSlash(cur.Path), "files", filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// eachArchiveFile calls fn with each file of the archive revision cur of
// workspace id, read straight from a file store as AML's archive reader
// would: the tar stream.
func (e *env) eachArchiveFile(id string, cur format.Entry, fn func(path string, r io.Reader) error) error {
	f, err := os.Open(filepath.Join(e.storeD, id, filepath.FromSlash(cur.Path)))
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = format.ReadArchive(f, cur.Path, format.DefaultLimits, func(te format.TreeEntry, r io.Reader) error {
		if r == nil {
			return nil
		}
		return fn(te.Path, r)
	})
	return err
}

// TestSIGTERMGrace stops a foreground mount of a typical workspace with
// SIGTERM, as a container runtime or systemd does, and requires the save
// to be published and the process gone well inside a 30 s grace period.
// The log says what the save had to do.
func TestSIGTERMGrace(t *testing.T) {
	srv := startS3(t, false)
	e := newS3Env(t, srv)
	mp := filepath.Join(e.root, "mnt")
	cmd, stderr := e.foreground(mp, "term")
	sh(t, mp, `git init -q repo && cd repo && for i in $(seq 1 400); do head -c 65536 /dev/urandom > f$i; done && git add -A && git commit -qm all && head -c 50000000 /dev/urandom > ../big.bin`)
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
	}
	took := time.Since(start)
	t.Logf("SIGTERM to exit, saving %s: %s", "about 80 MB in 900 files", took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("stopping took %s; a 30 s grace period needs it well inside", took)
	}
	if !strings.Contains(stderr.String(), "msg=saving") || !strings.Contains(stderr.String(), "saved revision") {
		t.Errorf("the log does not report the save:\n%s", stderr.String())
	}
	if e.lockExists("term") {
		t.Error("lock not released")
	}
	v := e.host(t)
	mp2 := filepath.Join(v.root, "verify")
	if r := v.mountAt(mp2, "term"); r.code != 0 {
		t.Fatalf("verify mount: %s", r)
	}
	sh(t, mp2, `cd repo && git fsck --no-progress && test $(git ls-files | wc -l) = 400 && test $(stat -c %s ../big.bin) = 50000000`)
	v.unmount(mp2)
}
