package integration

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lockChild is a process that takes a lock and obeys lines on stdin:
// LOCK_KIND is flock or fcntl; LOCK_OP is hold (lock, report, then
// "close" closes the descriptor without unlocking), wait (block for the
// lock, report "got"), or dup (open twice, lock through the first
// descriptor, then "close" closes the second one).
func lockChild() {
	path, kind, op := os.Getenv("LOCK_PATH"), os.Getenv("LOCK_KIND"), os.Getenv("LOCK_OP")
	fd, err := unix.Open(path, unix.O_RDWR, 0)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	other := -1
	if op == "dup" {
		if other, err = unix.Open(path, unix.O_RDWR, 0); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
	}
	lock := func(wait bool) error {
		if kind == "flock" {
			how := unix.LOCK_EX
			if !wait {
				how |= unix.LOCK_NB
			}
			return unix.Flock(fd, how)
		}
		cmd := unix.F_SETLK
		if wait {
			cmd = unix.F_SETLKW
		}
		return unix.FcntlFlock(uintptr(fd), cmd, &unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0})
	}
	if err := lock(op == "wait"); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	if op == "wait" {
		fmt.Println("got")
		return
	}
	fmt.Println("locked", os.Getpid())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "close":
			if other >= 0 {
				unix.Close(other)
			} else {
				unix.Close(fd)
			}
			fmt.Println("closed")
		}
	}
}

// child is a running lockChild.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  chan string
	done chan error
}

func startLockChild(t *testing.T, path, kind, op string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "AMLFS_TEST_CHILD=lock", "LOCK_PATH="+path, "LOCK_KIND="+kind, "LOCK_OP="+op)
	in, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	c := &child{cmd: cmd, in: in, out: make(chan string, 8), done: make(chan error, 1)}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.out <- s.Text()
		}
		close(c.out)
		c.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		in.Close()
	})
	return c
}

// expect waits up to d for the child's next line and returns it.
func (c *child) expect(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-c.out:
		if !ok || !strings.HasPrefix(l, prefix) {
			t.Fatalf("child said %q (open %v), want %q", l, ok, prefix)
		}
		return l
	case <-time.After(d):
		t.Fatalf("child did not say %q within %s", prefix, d)
		return ""
	}
}

// quiet fails if the child says anything within d.
func (c *child) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case l := <-c.out:
		t.Fatalf("child said %q, want it blocked", l)
	case <-time.After(d):
	}
}

func (c *child) say(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(c.in, line+"\n")
	must(t, err)
}

// testLocks checks locks as ext4 has them, in dir.
func testLocks(t *testing.T, dir string) {
	for _, kind := range []string{"flock", "fcntl"} {
		t.Run(kind, func(t *testing.T) {
			p := filepath.Join(dir, "lock-"+kind)
			must(t, os.WriteFile(p, []byte("locked file\n"), 0o644))
			// The holder opens first; this process opens the file after
			// it and keeps it open all along: the other opener whose
			// descriptor must not keep a closed holder's lock alive.
			holder := startLockChild(t, p, kind, "hold")
			pid, _ := strconv.Atoi(strings.Fields(holder.expect(t, "locked", 10*time.Second))[1])
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			must(t, err)
			defer f.Close()
			tryLock := func() error {
				if kind == "flock" {
					return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
				}
				return unix.FcntlFlock(f.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_WRLCK})
			}
			unlock := func() {
				if kind == "flock" {
					must(t, unix.Flock(int(f.Fd()), unix.LOCK_UN))
				} else {
					must(t, unix.FcntlFlock(f.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_UNLCK}))
				}
			}

			if err := tryLock(); err != unix.EAGAIN {
				t.Fatalf("lock held by another process: %v, want EAGAIN", err)
			}
			if kind == "fcntl" {
				lk := unix.Flock_t{Type: unix.F_WRLCK}
				must(t, unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk))
				if lk.Type != unix.F_WRLCK || int(lk.Pid) != pid {
					t.Errorf("F_GETLK: type %d pid %d, want F_WRLCK by pid %d", lk.Type, lk.Pid, pid)
				}
			}
			// A blocked waiter gets the lock within a second of the
			// holder closing its descriptor without unlocking.
			waiter := startLockChild(t, p, kind, "wait")
			waiter.quiet(t, 300*time.Millisecond)
			holder.say(t, "close")
			holder.expect(t, "closed", 5*time.Second)
			waiter.expect(t, "got", time.Second)
			<-waiter.done
			// The waiter exited: its lock died with it.
			must(t, tryLock())
			unlock()

			// A blocked waiter is interruptible: SIGTERM ends it.
			holder2 := startLockChild(t, p, kind, "hold")
			holder2.expect(t, "locked", 10*time.Second)
			waiter2 := startLockChild(t, p, kind, "wait")
			waiter2.quiet(t, 300*time.Millisecond)
			must(t, waiter2.cmd.Process.Signal(syscall.SIGTERM))
			select {
			case <-waiter2.done:
			case <-time.After(time.Second):
				t.Fatal("a blocked lock waiter did not die of SIGTERM within 1 s")
			}
			holder2.in.Close()
			<-holder2.done
			must(t, tryLock())
			unlock()

			if kind == "fcntl" {
				// POSIX: closing any descriptor of the file releases the
				// process's record locks on it.
				dup := startLockChild(t, p, kind, "dup")
				dup.expect(t, "locked", 10*time.Second)
				if err := tryLock(); err != unix.EAGAIN {
					t.Fatalf("lock held by another process: %v, want EAGAIN", err)
				}
				dup.say(t, "close")
				dup.expect(t, "closed", 5*time.Second)
				must(t, tryLock())
				unlock()
			}
		})
	}
}

// TestLocks runs testLocks on the workspace and on a host live mount, and
// then unmounts within 5 s.
func TestLocks(t *testing.T) {
	e := newEnv(t)
	host := filepath.Join(e.root, "host")
	must(t, os.Mkdir(host, 0o755))
	mp := e.mount("locks", "--mount", "/shared=file://"+host)
	t.Run("workspace", func(t *testing.T) { testLocks(t, mp) })
	t.Run("shared", func(t *testing.T) { testLocks(t, filepath.Join(mp, "shared")) })
	start := time.Now()
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("unmount took %s after the lock tests, over 5 s", d)
	}
}

// TestLocksNative runs testLocks on the native disk: the reference the
// mounts must match.
func TestLocksNative(t *testing.T) { testLocks(t, t.TempDir()) }
