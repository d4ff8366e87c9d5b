package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func testFsync(t *testing.T, dir string) {
	f, err := os.Create(filepath.Join(dir, "f"))
	must(t, err)
	defer f.Close()
	f.WriteString("durable")
	must(t, f.Sync())
	must(t, unix.Fdatasync(int(f.Fd())))
	d, err := os.Open(dir)
	must(t, err)
	defer d.Close()
	must(t, d.Sync())
	must(t, unix.Syncfs(int(f.Fd())))
}

func testFlock(t *testing.T, dir string) {
	p := filepath.Join(dir, "lock")
	must(t, os.WriteFile(p, nil, 0o644))
	a, err := os.Open(p)
	must(t, err)
	defer a.Close()
	b, err := os.Open(p)
	must(t, err)
	defer b.Close()
	must(t, unix.Flock(int(a.Fd()), unix.LOCK_EX|unix.LOCK_NB))
	if err := unix.Flock(int(b.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Errorf("second flock: %v, want EWOULDBLOCK", err)
	}
	// Another process sees the lock too.
	if err := exec.Command("flock", "-n", "-x", p, "true").Run(); err == nil {
		t.Error("flock(1) got a held lock")
	}
	must(t, unix.Flock(int(a.Fd()), unix.LOCK_UN))
	must(t, unix.Flock(int(b.Fd()), unix.LOCK_EX|unix.LOCK_NB))
}

func testFcntlLocks(t *testing.T, dir string) {
	p := filepath.Join(dir, "plock")
	must(t, os.WriteFile(p, make([]byte, 100), 0o644))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 10, Len: 20}
	must(t, unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk))
	// A child process must see the conflicting lock and fail to take it.
	// (go-fuse's loopback keeps POSIX locks as open-file-description locks
	// on the backing file, so l_pid is not the holder's pid; README.)
	helper := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFcntlHelper$")
		cmd.Env = append(os.Environ(), "AMLFS_FCNTL_HELPER="+p)
		return cmd
	}
	out, err := helper().CombinedOutput()
	if err != nil || !strings.Contains(string(out), "locked-by") {
		t.Errorf("child F_GETLK: %v %s", err, out)
	}
	lk.Type = unix.F_UNLCK
	must(t, unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk))
	out, err = helper().CombinedOutput()
	if !strings.Contains(string(out), "unlocked") {
		t.Errorf("after unlock: %v %s", err, out)
	}
}

// TestFcntlHelper runs in a child process for testFcntlLocks.
func TestFcntlHelper(t *testing.T) {
	p := os.Getenv("AMLFS_FCNTL_HELPER")
	if p == "" {
		t.Skip("helper for FcntlLocks")
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Start: 15, Len: 1}
	must(t, unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk))
	if lk.Type == unix.F_UNLCK {
		fmt.Println("unlocked")
		return
	}
	fmt.Printf("locked-by %d\n", lk.Pid)
	if err := unix.FcntlFlock(f.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_WRLCK, Start: 15, Len: 1}); err == nil {
		t.Error("got a conflicting lock")
	}
}

func testXattrs(t *testing.T, dir string) {
	p := filepath.Join(dir, "x")
	must(t, os.WriteFile(p, nil, 0o644))
	must(t, unix.Setxattr(p, "user.test.key", []byte("value"), 0))
	buf := make([]byte, 64)
	n, err := unix.Getxattr(p, "user.test.key", buf)
	must(t, err)
	if string(buf[:n]) != "value" {
		t.Errorf("getxattr %q", buf[:n])
	}
	n, err = unix.Listxattr(p, buf)
	must(t, err)
	if !strings.Contains(string(buf[:n]), "user.test.key") {
		t.Errorf("listxattr %q", buf[:n])
	}
	if err := unix.Setxattr(p, "user.test.key", []byte("v2"), unix.XATTR_CREATE); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("XATTR_CREATE on existing: %v", err)
	}
	// user.amlfs.* is amlfs's own namespace (lazy-restore markers) in
	// a workspace served through FUSE; a host mount shows the host's
	// xattrs as they are, and so does a workspace served natively (the
	// markers are trusted.* there).
	if err := unix.Setxattr(p, "user.amlfs.mine", []byte("x"), 0); isFUSE(dir) && !strings.Contains(dir, "/shared/") && !errors.Is(err, syscall.EPERM) {
		t.Errorf("setxattr in amlfs's namespace: %v, want EPERM", err)
	}
	must(t, unix.Removexattr(p, "user.test.key"))
	if _, err := unix.Getxattr(p, "user.test.key", buf); !errors.Is(err, unix.ENODATA) {
		t.Errorf("after remove: %v", err)
	}
}

func testMmapShared(t *testing.T, dir string) {
	p := filepath.Join(dir, "m")
	must(t, os.WriteFile(p, make([]byte, 8192), 0o644))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	must(t, err)
	copy(m[4000:], "mapped write")
	must(t, unix.Msync(m, unix.MS_SYNC))
	if got := readFile(t, p); got[4000:4012] != "mapped write" {
		t.Errorf("read after mapped write: %q", got[4000:4012])
	}
	_, err = f.WriteAt([]byte("plain write"), 100)
	must(t, err)
	if string(m[100:111]) != "plain write" {
		t.Errorf("mapping after write(): %q", m[100:111])
	}
	must(t, unix.Munmap(m))
	// A second, independent mapping sees the data too.
	g, err := os.Open(p)
	must(t, err)
	defer g.Close()
	m2, err := unix.Mmap(int(g.Fd()), 0, 8192, unix.PROT_READ, unix.MAP_SHARED)
	must(t, err)
	defer unix.Munmap(m2)
	if string(m2[4000:4012]) != "mapped write" {
		t.Errorf("second mapping: %q", m2[4000:4012])
	}
}

type dent struct {
	name string
	ino  uint64
	off  int64
}

// getdents reads a directory with a small buffer, recording each entry's
// d_off, the cookie telldir returns.
func getdents(t *testing.T, fd int) []dent {
	var out []dent
	buf := make([]byte, 512)
	for {
		n, err := unix.Getdents(fd, buf)
		must(t, err)
		if n == 0 {
			return out
		}
		for b := buf[:n]; len(b) > 0; {
			ino := *(*uint64)(unsafePointer(&b[0]))
			off := *(*int64)(unsafePointer(&b[8]))
			reclen := int(*(*uint16)(unsafePointer(&b[16])))
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			out = append(out, dent{string(name), ino, off})
			b = b[reclen:]
		}
	}
}

func testReaddirSeek(t *testing.T, dir string) {
	const n = 200
	for i := 0; i < n; i++ {
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("file-with-a-longish-name-%03d", i)), nil, 0o644))
	}
	d, err := os.Open(dir)
	must(t, err)
	defer d.Close()
	fd := int(d.Fd())
	first := getdents(t, fd)
	if len(first) != n+2 {
		t.Fatalf("read %d entries, want %d", len(first), n+2)
	}
	// Rewind: the same listing again.
	_, err = unix.Seek(fd, 0, 0)
	must(t, err)
	again := getdents(t, fd)
	if fmt.Sprint(again) != fmt.Sprint(first) {
		t.Error("listing after rewind differs")
	}
	// Seek to the middle: the listing continues from there.
	mid := first[n/2]
	_, err = unix.Seek(fd, mid.off, 0)
	must(t, err)
	rest := getdents(t, fd)
	if fmt.Sprint(rest) != fmt.Sprint(first[n/2+1:]) {
		t.Errorf("after seekdir: %d entries, want %d", len(rest), len(first[n/2+1:]))
	}
	// Inode numbers are real and stable: readdir, stat and a later lookup
	// after the kernel forgets the dentries all agree.
	for _, de := range first[:10] {
		if de.name == "." || de.name == ".." {
			continue
		}
		var st syscall.Stat_t
		must(t, syscall.Stat(filepath.Join(dir, de.name), &st))
		if st.Ino != de.ino || st.Ino == 0 || st.Ino == 0xffffffff {
			t.Errorf("%s: readdir ino %d, stat ino %d", de.name, de.ino, st.Ino)
		}
	}
	var before, after syscall.Stat_t
	p := filepath.Join(dir, first[5].name)
	must(t, syscall.Stat(p, &before))
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0)
	must(t, syscall.Stat(p, &after))
	if before.Ino != after.Ino {
		t.Errorf("inode changed after drop_caches: %d -> %d", before.Ino, after.Ino)
	}
}

func testStatfs(t *testing.T, dir string) {
	var st unix.Statfs_t
	must(t, unix.Statfs(dir, &st))
	if st.Blocks == 0 || st.Bsize == 0 || st.Files == 0 {
		t.Errorf("statfs: %+v", st)
	}
}

// An unprivileged truncate of a setuid file clears setuid, and setgid on a
// group-executable file (amlfs handles FATTR_KILL_SUIDGID itself). Other
// users need allow_other and a path they can traverse.
func TestUnprivilegedTruncateKillsSuid(t *testing.T) {
	needTools(t, "util-linux", "setpriv")
	e := newEnv(t)
	e.traversable()
	dir := e.mount("suid", "-o", "allow_other")
	must(t, os.Chmod(dir, 0o777))
	p := filepath.Join(dir, "suid")
	must(t, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o644))
	must(t, syscall.Chmod(p, 0o6777))
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "truncate", "-s", "0", p).CombinedOutput()
	if err != nil {
		t.Fatalf("truncate as nobody: %v %s", err, out)
	}
	var st syscall.Stat_t
	must(t, syscall.Stat(p, &st))
	if st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 || st.Size != 0 {
		t.Errorf("mode %o size %d after unprivileged truncate; setuid/setgid should be cleared", st.Mode&07777, st.Size)
	}
	// The same for an unprivileged append.
	must(t, syscall.Chmod(p, 0o6777))
	out, err = exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", "echo more >> "+p).CombinedOutput()
	if err != nil {
		t.Fatalf("append as nobody: %v %s", err, out)
	}
	must(t, syscall.Stat(p, &st))
	if st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
		t.Errorf("mode %o after unprivileged write; setuid/setgid should be cleared", st.Mode&07777)
	}
	// Root keeps them (CAP_FSETID).
	must(t, syscall.Chmod(p, 0o6777))
	must(t, os.WriteFile(p, []byte("root"), 0o644))
	must(t, syscall.Stat(p, &st))
	if st.Mode&07777 != 0o6777 {
		t.Errorf("root's write changed the mode to %o", st.Mode&07777)
	}
}

// The caller's umask applies once: umask 002 gives group-writable files.
func testCallerUmask(t *testing.T, dir string) {
	out := sh(t, dir, "umask 002 && touch f && mkdir d && stat -c '%a' f d | tr '\\n' ' ' && umask 077 && touch g && stat -c %a g")
	if strings.Fields(out)[0] != "664" || strings.Fields(out)[1] != "775" || strings.Fields(out)[2] != "600" {
		t.Errorf("modes under umask 002 and 077: %q, want 664 775 600", out)
	}
}

// isFUSE reports whether dir is on a FUSE mount (not a workspace served
// natively).
func isFUSE(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == 0x65735546
}
