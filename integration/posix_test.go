package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/posixtest"
	"golang.org/x/sys/unix"
)

// posixMount is one workspace mount, with a host live mount at /shared,
// shared by the POSIX suite; each case works in a directory of its own.
func posixMount(t *testing.T) string {
	e := newEnv(t)
	host := filepath.Join(e.root, "host")
	must(t, os.Mkdir(host, 0o755))
	return e.mount("posix", "--mount", "/shared=file://"+host)
}

func caseDir(t *testing.T, mp string) string {
	t.Helper()
	d := filepath.Join(mp, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// posixtestNotExt4 names the posixtest cases that expect what ext4 does not
// do. amlfs keeps locks in the kernel, as ext4 does, not in go-fuse's OFD
// emulation; testFcntlLocks covers locks across processes.
var posixtestNotExt4 = map[string]string{
	"FcntlFlockLocksFile": "it expects a second descriptor of the same process to conflict with the first one's F_SETLK lock; POSIX record locks belong to the process, and ext4 grants it",
}

// TestPOSIX runs go-fuse's posixtest suite, then amlfs's own cases for
// every operation the workspace promises.
func TestPOSIX(t *testing.T) {
	ws := posixMount(t)
	for _, where := range []string{"workspace", "shared"} {
		mp := ws
		if where == "shared" {
			mp = filepath.Join(ws, "shared")
		}
		t.Run(where, func(t *testing.T) { posixSuite(t, mp, where) })
	}
}

func posixSuite(t *testing.T, mp, where string) {
	t.Run("posixtest", func(t *testing.T) {
		names := make([]string, 0, len(posixtest.All))
		for name := range posixtest.All {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			fn := posixtest.All[name]
			t.Run(name, func(t *testing.T) {
				if why, ok := posixtestNotExt4[name]; ok {
					t.Skip(why)
				}
				if name == "OpenSymlinkRace" && !isFUSE(mp) {
					// It checks that the FUSE daemon never follows a
					// symlink for the caller; served natively there is no
					// daemon, and the caller's own open follows it, as
					// on ext4.
					t.Skip("a FUSE daemon's property; the workspace is served natively")
				}
				fn(t, caseDir(t, mp))
			})
		}
	})
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, dir string)
	}{
		{"CreateReadWrite", testCreateReadWrite},
		{"RandomWritesAppendTruncate", testRandomWrites},
		{"RenameOverExisting", testRenameOverExisting},
		{"RenameNonEmptyDir", testRenameNonEmptyDir},
		{"RenameExchangeNoReplace", testRenameFlags},
		{"UnlinkWhileOpen", testUnlinkWhileOpen},
		{"HardLinks", testHardLinks},
		{"Symlinks", testSymlinks},
		{"ChmodChownUtimens", testChmodChownUtimens},
		{"Fsync", testFsync},
		{"Flock", testFlock},
		{"FcntlLocks", testFcntlLocks},
		{"Xattrs", testXattrs},
		{"MmapShared", testMmapShared},
		{"ReaddirSeekRewindStableInodes", testReaddirSeek},
		{"Statfs", testStatfs},
		{"CallerUmask", testCallerUmask},
		{"LongRelativePath", testLongPath},
		{"ModeZero", testModeZero},
		{"InodeStable", testInodeStable},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, caseDir(t, mp)) })
	}
}

// A 4,095-byte path relative to the caller's directory works, as on ext4
// (PATH_MAX counts the terminating NUL), whatever lies in front of the
// backing tree; 4,096 bytes is ENAMETOOLONG.
func testLongPath(t *testing.T, dir string) {
	parts := make([]string, 16) // 16 * 255 - 1 = 4,079 bytes
	for i := range parts {
		parts[i] = strings.Repeat(string(rune('a'+i)), 254)
	}
	rel := strings.Join(parts, "/")
	long := rel + "/" + strings.Repeat("f", 4095-len(rel)-1)
	if len(long) != 4095 {
		t.Fatalf("built a path of %d bytes", len(long))
	}
	// Relative to a descriptor of dir, as pjdfstest's */03.t is to its
	// working directory: dir's own path in front would pass PATH_MAX.
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(d)
	for i := range parts {
		must(t, unix.Mkdirat(d, strings.Join(parts[:i+1], "/"), 0o755))
	}
	fd, err := unix.Openat(d, long, unix.O_CREAT|unix.O_RDWR, 0o644)
	must(t, err)
	unix.Write(fd, []byte("deep"))
	unix.Close(fd)
	var st unix.Stat_t
	must(t, unix.Fstatat(d, long, &st, unix.AT_SYMLINK_NOFOLLOW))
	if st.Size != 4 {
		t.Errorf("size %d, want 4", st.Size)
	}
	must(t, unix.Fchmodat(d, long, 0o600, 0))
	must(t, unix.Fchownat(d, long, 1, 1, unix.AT_SYMLINK_NOFOLLOW))
	must(t, unix.Renameat(d, long, d, rel+"/g"))
	must(t, unix.Renameat(d, rel+"/g", d, long))
	must(t, unix.Unlinkat(d, long, 0))
	if _, err := unix.Openat(d, long+"x", unix.O_CREAT|unix.O_RDWR, 0o644); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Errorf("a 4,096-byte path: %v, want ENAMETOOLONG", err)
	}
}

// A file made with mode 0000 shows 0000, and a non-root user cannot read
// it.
func testModeZero(t *testing.T, dir string) {
	p := filepath.Join(dir, "zero")
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY, 0)
	must(t, err)
	unix.Write(fd, []byte("root's"))
	unix.Close(fd)
	var st unix.Stat_t
	must(t, unix.Stat(p, &st))
	if st.Mode&0o7777 != 0 {
		t.Errorf("mode %o, want 0000", st.Mode&0o7777)
	}
	must(t, os.Chmod(dir, 0o755))
	if _, err := exec.LookPath("setpriv"); err == nil {
		if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", p).CombinedOutput(); err == nil {
			t.Errorf("nobody read a mode 0000 file: %q", out)
		}
	}
}

// st_ino stays the same through chown, chmod, rename and a fresh lookup.
func testInodeStable(t *testing.T, dir string) {
	p := filepath.Join(dir, "ino")
	must(t, os.WriteFile(p, nil, 0o644))
	ino := func() uint64 {
		t.Helper()
		var st unix.Stat_t
		must(t, unix.Stat(p, &st))
		return st.Ino
	}
	want := ino()
	for i := range 50 {
		must(t, os.Chown(p, 1000+i, 1000+i))
		if got := ino(); got != want {
			t.Fatalf("after chown %d: st_ino %d, was %d", i, got, want)
		}
		must(t, os.Chmod(p, os.FileMode(0o600+i%8)))
		if got := ino(); got != want {
			t.Fatalf("after chmod %d: st_ino %d, was %d", i, got, want)
		}
	}
	must(t, os.Rename(p, p+"2"))
	must(t, os.Rename(p+"2", p))
	ents, err := os.ReadDir(dir)
	must(t, err)
	for _, e := range ents {
		info, err := e.Info()
		must(t, err)
		if e.Name() == "ino" && info.Sys().(*syscall.Stat_t).Ino != want {
			t.Errorf("readdir st_ino %d, stat %d", info.Sys().(*syscall.Stat_t).Ino, want)
		}
	}
	if got := ino(); got != want {
		t.Errorf("after rename: st_ino %d, was %d", got, want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	must(t, err)
	return string(b)
}

func testCreateReadWrite(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o640)
	must(t, err)
	defer f.Close()
	_, err = f.WriteString("hello world")
	must(t, err)
	buf := make([]byte, 5)
	_, err = f.ReadAt(buf, 6)
	must(t, err)
	if string(buf) != "world" {
		t.Errorf("read back %q", buf)
	}
	if _, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL, 0o600); !errors.Is(err, os.ErrExist) {
		t.Errorf("O_EXCL on existing file: %v", err)
	}
	fi, err := os.Stat(p)
	must(t, err)
	if fi.Mode().Perm() != 0o640 || fi.Size() != 11 {
		t.Errorf("stat: %v %d", fi.Mode(), fi.Size())
	}
}

func testRandomWrites(t *testing.T, dir string) {
	p := filepath.Join(dir, "r")
	ref := make([]byte, 0, 1<<20)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	defer f.Close()
	write := func(off int, data []byte) {
		_, err := f.WriteAt(data, int64(off))
		must(t, err)
		if need := off + len(data); need > len(ref) {
			ref = append(ref, make([]byte, need-len(ref))...)
		}
		copy(ref[off:], data)
	}
	write(0, bytes.Repeat([]byte("a"), 5000))
	write(100000, []byte("sparse"))
	write(4090, []byte("crosses-a-page-boundary"))
	must(t, f.Truncate(50000))
	ref = ref[:50000]
	must(t, f.Truncate(60000))
	ref = append(ref, make([]byte, 10000)...)
	write(59990, bytes.Repeat([]byte("z"), 20))
	if got := readFile(t, p); got != string(ref) {
		t.Fatalf("content differs from the reference (len %d vs %d)", len(got), len(ref))
	}
	// O_APPEND writes go to the end whatever the offset.
	a, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = a.WriteString("END")
	must(t, err)
	a.Close()
	got := readFile(t, p)
	if !strings.HasSuffix(got, "END") || len(got) != len(ref)+3 {
		t.Errorf("append: len %d", len(got))
	}
	// truncate(2) by path.
	must(t, os.Truncate(p, 3))
	if got := readFile(t, p); got != "aaa" {
		t.Errorf("truncate: %q", got)
	}
}

func testRenameOverExisting(t *testing.T, dir string) {
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	must(t, os.WriteFile(a, []byte("new"), 0o644))
	must(t, os.WriteFile(b, []byte("old"), 0o644))
	old, err := os.Open(b)
	must(t, err)
	defer old.Close()
	must(t, os.Rename(a, b))
	if got := readFile(t, b); got != "new" {
		t.Errorf("b = %q", got)
	}
	if _, err := os.Stat(a); !os.IsNotExist(err) {
		t.Errorf("a still exists: %v", err)
	}
	// The replaced file stays readable through its open descriptor.
	buf := make([]byte, 3)
	if _, err := old.ReadAt(buf, 0); err != nil || string(buf) != "old" {
		t.Errorf("old fd: %q %v", buf, err)
	}
}

func testRenameNonEmptyDir(t *testing.T, dir string) {
	src := filepath.Join(dir, "src")
	must(t, os.MkdirAll(filepath.Join(src, "x", "y"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "x", "y", "f"), []byte("deep"), 0o644))
	must(t, os.Mkdir(filepath.Join(dir, "empty"), 0o755))
	must(t, os.Rename(src, filepath.Join(dir, "moved")))
	if got := readFile(t, filepath.Join(dir, "moved", "x", "y", "f")); got != "deep" {
		t.Errorf("moved: %q", got)
	}
	// A directory may replace an empty one, not a non-empty one. (rename(2)
	// directly: os.Rename refuses any existing directory target itself.)
	must(t, unix.Rename(filepath.Join(dir, "moved"), filepath.Join(dir, "empty")))
	must(t, os.Mkdir(filepath.Join(dir, "other"), 0o755))
	if err := unix.Rename(filepath.Join(dir, "other"), filepath.Join(dir, "empty")); !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		t.Errorf("rename over non-empty dir: %v", err)
	}
	if got := readFile(t, filepath.Join(dir, "empty", "x", "y", "f")); got != "deep" {
		t.Errorf("after replace: %q", got)
	}
}

func testRenameFlags(t *testing.T, dir string) {
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	must(t, os.WriteFile(a, []byte("A"), 0o644))
	must(t, os.WriteFile(b, []byte("B"), 0o644))
	if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_NOREPLACE); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("RENAME_NOREPLACE: %v", err)
	}
	must(t, unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE))
	if readFile(t, a) != "B" || readFile(t, b) != "A" {
		t.Error("RENAME_EXCHANGE did not swap")
	}
}

func testUnlinkWhileOpen(t *testing.T, dir string) {
	p := filepath.Join(dir, "u")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	defer f.Close()
	must(t, os.Remove(p))
	_, err = f.WriteString("still here")
	must(t, err)
	buf := make([]byte, 10)
	_, err = f.ReadAt(buf, 0)
	must(t, err)
	if string(buf) != "still here" {
		t.Errorf("read %q", buf)
	}
	var st syscall.Stat_t
	must(t, syscall.Fstat(int(f.Fd()), &st))
	if st.Nlink != 0 || st.Size != 10 {
		t.Errorf("fstat after unlink: nlink %d size %d", st.Nlink, st.Size)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("name still visible: %v", err)
	}
}

func testHardLinks(t *testing.T, dir string) {
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	must(t, os.WriteFile(a, []byte("one"), 0o644))
	must(t, os.Link(a, b))
	var sa, sb syscall.Stat_t
	must(t, syscall.Stat(a, &sa))
	must(t, syscall.Stat(b, &sb))
	if sa.Ino != sb.Ino || sa.Nlink != 2 {
		t.Errorf("ino %d/%d nlink %d", sa.Ino, sb.Ino, sa.Nlink)
	}
	must(t, os.WriteFile(b, []byte("two"), 0o644))
	if readFile(t, a) != "two" {
		t.Error("write through one name not seen through the other")
	}
	must(t, os.Remove(a))
	must(t, syscall.Stat(b, &sb))
	if sb.Nlink != 1 {
		t.Errorf("nlink after unlink %d", sb.Nlink)
	}
}

func testSymlinks(t *testing.T, dir string) {
	must(t, os.WriteFile(filepath.Join(dir, "target"), []byte("t"), 0o644))
	l := filepath.Join(dir, "link")
	must(t, os.Symlink("target", l))
	if dst, err := os.Readlink(l); err != nil || dst != "target" {
		t.Errorf("readlink %q %v", dst, err)
	}
	fi, err := os.Lstat(l)
	must(t, err)
	if fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("lstat mode %v", fi.Mode())
	}
	if readFile(t, l) != "t" {
		t.Error("follow failed")
	}
	must(t, os.Symlink("/nonexistent/abs", filepath.Join(dir, "dangling")))
	if _, err := os.Stat(filepath.Join(dir, "dangling")); !os.IsNotExist(err) {
		t.Errorf("dangling: %v", err)
	}
}

func testChmodChownUtimens(t *testing.T, dir string) {
	p := filepath.Join(dir, "f")
	must(t, os.WriteFile(p, nil, 0o644))
	must(t, syscall.Chmod(p, 0o4751)) // os.Chmod would drop the setuid bit
	fi, err := os.Stat(p)
	must(t, err)
	if fi.Mode()&(os.ModePerm|os.ModeSetuid) != 0o751|os.ModeSetuid {
		t.Errorf("chmod: %v", fi.Mode())
	}
	must(t, os.Chown(p, 1234, 5678))
	var st syscall.Stat_t
	must(t, syscall.Stat(p, &st))
	if st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("chown: %d:%d", st.Uid, st.Gid)
	}
	at := time.Date(2001, 2, 3, 4, 5, 6, 123456789, time.UTC)
	mt := time.Date(2002, 3, 4, 5, 6, 7, 987654321, time.UTC)
	must(t, os.Chtimes(p, at, mt))
	must(t, syscall.Stat(p, &st))
	if time.Unix(st.Mtim.Unix()).UTC() != mt || time.Unix(st.Atim.Unix()).UTC() != at {
		t.Errorf("utimens: atime %v mtime %v", time.Unix(st.Atim.Unix()), time.Unix(st.Mtim.Unix()))
	}
}
