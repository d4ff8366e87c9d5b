package revision

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOpenBreaksLease: a write lease a user holds on a file (F_SETLEASE)
// does not fail the daemon's open for a save: the open waits for the
// lease to be given up, as the kernel asks its holder to (issue 26, row
// 9: every save failed with EAGAIN while one lease was held).
func TestOpenBreaksLease(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "leased")
	if err := os.WriteFile(p, []byte("bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	holder, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := unix.FcntlInt(holder.Fd(), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		t.Skipf("no lease here: %v", err)
	}
	// The holder gives the lease up a moment after the break starts, as
	// a well-behaved holder does on its SIGIO.
	hfd := holder.Fd()
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(300 * time.Millisecond)
		unix.FcntlInt(hfd, unix.F_SETLEASE, unix.F_UNLCK)
	}()
	defer func() { <-released }()
	start := time.Now()
	f, err := openBeneath(dir, "leased", os.O_RDONLY)
	if err != nil {
		t.Fatalf("open of a leased file: %v", err)
	}
	defer f.Close()
	buf := make([]byte, 16)
	if n, err := f.Read(buf); err != nil || string(buf[:n]) != "bytes" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	t.Logf("the open waited %v for the lease", time.Since(start))
	// A fifo is never opened blocking.
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		f, err := openBeneath(dir, "fifo", os.O_WRONLY)
		if err == nil {
			f.Close()
		}
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("an open of a fifo blocked")
	}
}
