package integration

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fsx is an fsx-style randomized exerciser: it applies the same random
// operations (write, read, truncate, mapped read and write, hole punching,
// fsync, close and reopen) to a file under dir and to a reference file on
// the native disk, and checks every read, and the whole file at the end,
// against the reference.
type fsx struct {
	t         *testing.T
	r         *rand.Rand
	test, ref *os.File
	testPath  string
	refPath   string
	maxLen    int64
	holes     bool
	log       []string
}

func newFsx(t *testing.T, dir string, seed uint64) *fsx {
	t.Helper()
	x := &fsx{t: t, r: rand.New(rand.NewPCG(seed, 7)), testPath: filepath.Join(dir, fmt.Sprintf("fsx-%d.bin", seed)),
		refPath: filepath.Join(t.TempDir(), "ref.bin"), maxLen: 256 << 10, holes: true}
	x.open()
	return x
}

func (x *fsx) open() {
	var err error
	if x.test, err = os.OpenFile(x.testPath, os.O_RDWR|os.O_CREATE, 0o644); err != nil {
		x.t.Fatal(err)
	}
	if x.ref, err = os.OpenFile(x.refPath, os.O_RDWR|os.O_CREATE, 0o644); err != nil {
		x.t.Fatal(err)
	}
}

func (x *fsx) close() {
	x.test.Close()
	x.ref.Close()
}

func (x *fsx) fail(format string, args ...any) {
	x.t.Helper()
	tail := x.log
	if len(tail) > 20 {
		tail = tail[len(tail)-20:]
	}
	x.t.Fatalf("fsx after %d ops: %s\nlast ops:\n  %s", len(x.log), fmt.Sprintf(format, args...), strings.Join(tail, "\n  "))
}

func (x *fsx) size() int64 {
	fi, err := x.ref.Stat()
	if err != nil {
		x.t.Fatal(err)
	}
	return fi.Size()
}

func (x *fsx) data(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(x.r.Uint32())
	}
	return b
}

func (x *fsx) checkRead(off, n int64) {
	want := make([]byte, n)
	got := make([]byte, n)
	wn, _ := x.ref.ReadAt(want, off)
	gn, err := x.test.ReadAt(got, off)
	if err != nil && gn != wn {
		x.fail("read %d+%d: %v", off, n, err)
	}
	if gn != wn || !bytes.Equal(got[:gn], want[:wn]) {
		x.fail("read %d+%d: got %d bytes, want %d; first difference at %d", off, n, gn, wn, firstDiff(got[:gn], want[:wn]))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// mapped runs fn on shared mappings of [0, n) of both files.
func (x *fsx) mapped(n int64, write bool, fn func(test, ref []byte)) {
	prot := unix.PROT_READ
	if write {
		prot |= unix.PROT_WRITE
	}
	tm, err := unix.Mmap(int(x.test.Fd()), 0, int(n), prot, unix.MAP_SHARED)
	if err != nil {
		x.fail("mmap test %d: %v", n, err)
	}
	rm, err := unix.Mmap(int(x.ref.Fd()), 0, int(n), prot, unix.MAP_SHARED)
	if err != nil {
		x.fail("mmap ref: %v", err)
	}
	fn(tm, rm)
	if write {
		if err := unix.Msync(tm, unix.MS_SYNC); err != nil {
			x.fail("msync: %v", err)
		}
		unix.Msync(rm, unix.MS_SYNC)
	}
	unix.Munmap(tm)
	unix.Munmap(rm)
}

func (x *fsx) step() {
	size := x.size()
	off := x.r.Int64N(x.maxLen)
	n := 1 + x.r.Int64N(min(x.maxLen-off, 64<<10))
	switch op := x.r.IntN(100); {
	case op < 25: // write
		x.log = append(x.log, fmt.Sprintf("write %d+%d", off, n))
		b := x.data(int(n))
		if _, err := x.test.WriteAt(b, off); err != nil {
			x.fail("write: %v", err)
		}
		x.ref.WriteAt(b, off)
	case op < 50: // read
		if size == 0 {
			return
		}
		off = x.r.Int64N(size)
		n = 1 + x.r.Int64N(min(size-off+100, 64<<10))
		x.log = append(x.log, fmt.Sprintf("read %d+%d", off, n))
		x.checkRead(off, n)
	case op < 60: // truncate
		to := x.r.Int64N(x.maxLen)
		x.log = append(x.log, fmt.Sprintf("truncate %d", to))
		if err := x.test.Truncate(to); err != nil {
			x.fail("truncate: %v", err)
		}
		x.ref.Truncate(to)
	case op < 70: // mapped read
		if size == 0 {
			return
		}
		off = x.r.Int64N(size)
		n = 1 + x.r.Int64N(size-off)
		x.log = append(x.log, fmt.Sprintf("mapread %d+%d", off, n))
		x.mapped(size, false, func(tm, rm []byte) {
			if !bytes.Equal(tm[off:off+n], rm[off:off+n]) {
				x.fail("mapread %d+%d differs at %d", off, n, firstDiff(tm[off:off+n], rm[off:off+n]))
			}
		})
	case op < 80: // mapped write, extending the file first if needed
		end := off + n
		x.log = append(x.log, fmt.Sprintf("mapwrite %d+%d (size %d)", off, n, size))
		if end > size {
			if err := x.test.Truncate(end); err != nil {
				x.fail("truncate up for mapwrite: %v", err)
			}
			x.ref.Truncate(end)
			size = end
		}
		b := x.data(int(n))
		x.mapped(size, true, func(tm, rm []byte) {
			copy(tm[off:], b)
			copy(rm[off:], b)
		})
	case op < 88: // punch a hole
		if !x.holes || size == 0 {
			return
		}
		off = x.r.Int64N(size)
		n = 1 + x.r.Int64N(size-off)
		x.log = append(x.log, fmt.Sprintf("punch %d+%d", off, n))
		err := unix.Fallocate(int(x.test.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
			x.holes = false
			x.log = append(x.log, "(holes not supported)")
			return
		}
		if err != nil {
			x.fail("punch: %v", err)
		}
		if err := unix.Fallocate(int(x.ref.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
			x.fail("punch ref: %v", err)
		}
	case op < 94: // fsync
		x.log = append(x.log, "fsync")
		if err := x.test.Sync(); err != nil {
			x.fail("fsync: %v", err)
		}
	default: // close and reopen
		x.log = append(x.log, "close+open")
		x.close()
		x.open()
	}
}

func (x *fsx) run(ops int) {
	for range ops {
		x.step()
	}
	x.close()
	got, err := os.ReadFile(x.testPath)
	if err != nil {
		x.fail("final read: %v", err)
	}
	want, _ := os.ReadFile(x.refPath)
	if !bytes.Equal(got, want) {
		x.fail("final contents: %d bytes, want %d; first difference at %d", len(got), len(want), firstDiff(got, want))
	}
}

// TestFsx runs the exerciser on the workspace (passthrough and FUSE paths)
// and on a host live mount. Both are the same loopback node
// (fuse/loopback), so the host mount gets fewer ops: 30,000 (38 s here),
// against the workspace's 100,000 (130 s).
func TestFsx(t *testing.T) {
	scale := 10
	if testing.Short() {
		scale = 1
	}
	e := newEnv(t)
	host := t.TempDir()
	// Through FUSE: natively the workspace is the disk itself.
	mp := e.mount("fsx", "--serve", "fuse", "--mount", "/host=file://"+host)
	for name, dir := range map[string]string{"workspace": mp, "host mount": filepath.Join(mp, "host")} {
		ops := scale * 10000
		if name == "host mount" {
			ops = scale * 3000
		}
		t.Run(name, func(t *testing.T) {
			x := newFsx(t, dir, 1)
			x.run(ops)
			t.Logf("%d ops, holes supported: %v", ops, x.holes)
		})
	}
	if r := e.unmount(mp, "--no-save"); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// TestFsxS3 runs it on an S3 live mount, whose bytes live in amlfs's cache
// and go to the bucket on fsync and close; the bucket must hold the final
// contents.
func TestFsxS3(t *testing.T) {
	ops := 20000
	if testing.Short() {
		ops = 3000
	}
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "fsx")
	mp := l.mountNone("fsx")
	x := newFsx(t, filepath.Join(mp, "s"), 2)
	x.run(ops)
	l.drained(mp, "/s")
	got, err := l.get("fsx-2.bin")
	want, _ := os.ReadFile(x.refPath)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the object holds %d bytes (%v), want the %d of the reference", len(got), err, len(want))
	}
	if r := l.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}
