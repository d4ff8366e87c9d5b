package mount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Freezing writers. A checkpoint is the tree at one instant only if nothing
// writes it while the save reads it. Through FUSE the daemon holds mutating
// calls back (fuse.FS.Freeze), but not writes through a shared mapping
// (SQLite's -shm); served natively it can hold nothing back. When amlfs
// knows the writers' cgroup (v2), it freezes them instead: under `amlfs
// exec` the command runs in a cgroup of its own, and --freeze-cgroup names
// a container runtime's. Every process in it, and every child it forks (a
// git auto-gc left running in the background too), stands still from the
// moment the cgroup reports frozen until the save has read the tree.

// freezeTimeout bounds the wait for a cgroup to report frozen. A task in an
// uninterruptible wait freezes only once it returns from it; past this the
// cgroup is thawed and the save reads the tree as it changes.
const freezeTimeout = 2 * time.Second

// cgroupFreezer freezes the processes of one cgroup v2 directory, which it
// holds open: a path renamed or replaced later is not followed.
type cgroupFreezer struct {
	dir string
	fd  int // O_PATH of the cgroup directory
}

// cgroup2Magic is CGROUP2_SUPER_MAGIC.
const cgroup2Magic = 0x63677270

// openFreezer opens dir, which must be a cgroup v2 directory other than the
// root (which cannot be frozen).
func openFreezer(dir string) (*cgroupFreezer, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("--freeze-cgroup %s: %w", dir, err)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != cgroup2Magic {
		unix.Close(fd)
		return nil, fmt.Errorf("--freeze-cgroup %s: not a cgroup v2 directory", dir)
	}
	f := &cgroupFreezer{dir: dir, fd: fd}
	if _, err := f.read("cgroup.freeze"); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("--freeze-cgroup %s: %w (the root cgroup cannot be frozen)", dir, err)
	}
	return f, nil
}

func (f *cgroupFreezer) read(name string) ([]byte, error) {
	fd, err := unix.Openat(f.fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func (f *cgroupFreezer) write(name, val string) error {
	fd, err := unix.Openat(f.fd, name, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(val))
	return err
}

// Freeze freezes the cgroup and waits until the kernel reports it frozen.
// thaw undoes it; it is safe to call once.
func (f *cgroupFreezer) Freeze(ctx context.Context) (thaw func(), err error) {
	if err := f.write("cgroup.freeze", "1"); err != nil {
		return nil, fmt.Errorf("freeze %s: %w", f.dir, err)
	}
	thaw = func() { f.write("cgroup.freeze", "0") }
	deadline := time.Now().Add(freezeTimeout)
	for {
		frozen, err := f.frozen()
		if err != nil {
			thaw()
			return nil, fmt.Errorf("freeze %s: %w", f.dir, err)
		}
		if frozen {
			return thaw, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			thaw()
			return nil, fmt.Errorf("freeze %s: not frozen within %s (a process in an uninterruptible wait)", f.dir, freezeTimeout)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// frozen reports whether the kernel says the cgroup is frozen.
func (f *cgroupFreezer) frozen() (bool, error) {
	ev, err := f.read("cgroup.events")
	return bytes.Contains(ev, []byte("frozen 1")), err
}

// Close releases the directory.
func (f *cgroupFreezer) Close() error { return unix.Close(f.fd) }

// cgroup2Root is where the cgroup v2 hierarchy is mounted ("" for
// nowhere): /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a
// hybrid one.
func cgroup2Root() string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		// ... mountpoint ... - fstype source options
		pre, post, ok := strings.Cut(line, " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 && f[3] == "/" {
			return unescapeMountinfo(f[4])
		}
	}
	return ""
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroup2 is the cgroup v2 directory this process is in ("" if none).
func ownCgroup2() string {
	root := cgroup2Root()
	data, err := os.ReadFile("/proc/self/cgroup")
	if root == "" || err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(root, filepath.Clean("/"+rel))
		}
	}
	return ""
}

// NewExecCgroup makes a cgroup v2 of its own for `amlfs exec`'s command,
// beside nothing else: a child of this process's cgroup. It returns its
// path and a descriptor of it for the command to be started in
// (SysProcAttr.CgroupFD), and a remove that deletes it once empty. An
// error means there is none to be had here (not root, no cgroup v2).
func NewExecCgroup() (path string, fd int, remove func(), err error) {
	parent := ownCgroup2()
	if parent == "" {
		return "", -1, nil, fmt.Errorf("no cgroup v2 hierarchy")
	}
	dir := filepath.Join(parent, fmt.Sprintf("amlfs-exec-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", -1, nil, err
	}
	// Not O_PATH: clone3 takes no such descriptor for CLONE_INTO_CGROUP.
	fd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(dir)
		return "", -1, nil, err
	}
	remove = func() {
		unix.Close(fd)
		// A process still in it (a background child the command left)
		// goes back to the parent, so that the cgroup can go; one it
		// forked meanwhile too.
		for range 20 {
			if data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
				for _, pid := range strings.Fields(string(data)) {
					os.WriteFile(filepath.Join(parent, "cgroup.procs"), []byte(pid), 0)
				}
			}
			if err := os.Remove(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return dir, fd, remove, nil
}

// WatchFrozen thaws the cgroup dir if it stays frozen while alive reports
// the daemon gone: a daemon that dies mid-checkpoint must not leave the
// command frozen for ever. It checks every second until ctx ends.
func WatchFrozen(ctx context.Context, dir string, alive func(context.Context) bool) {
	f, err := openFreezer(dir)
	if err != nil {
		return
	}
	defer f.Close()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if frozen, err := f.frozen(); err != nil || !frozen {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		ok := alive(actx)
		cancel()
		if !ok && ctx.Err() == nil {
			f.write("cgroup.freeze", "0")
		}
	}
}
