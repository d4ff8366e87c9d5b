package native

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/mount/mountpoint"
)

// The keeper. A placeholder is a sparse file: if the daemon died and its
// fanotify group went with it, the bind mount would stay and every file
// not fetched yet would read as zeros. So a native mount starts a small
// child process, the keeper, that holds the group too. While the daemon
// lives the keeper only waits. If the daemon dies without saying goodbye,
// the keeper detaches the mount and answers every pre-content event with
// EIO, so that a process still holding a placeholder open gets an error,
// never zeros. It exits once no process holds a file of the detached
// mount open any more, or when the next mount of the workspace takes the
// tree over and stops it.

// KeeperArg is the hidden command the amlfs binary runs the keeper as.
const KeeperArg = "internal-native-keeper"

// keeper is the daemon's handle on its keeper.
type keeper struct {
	cmd  *exec.Cmd
	bye  *os.File // write end: closing it without a byte means the daemon died
	done chan struct{}
}

// startKeeper runs exe KeeperArg with the group, a pipe and the mount's
// root.
func startKeeper(exe string, group int, mnt *mountpoint.Mount) (*keeper, error) {
	parent, name, err := mnt.Parent()
	if err != nil {
		return nil, err
	}
	defer parent.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	g := os.NewFile(uintptr(group), "fanotify")
	cmd := exec.Command(exe, KeeperArg, mnt.Path(), strconv.FormatUint(mnt.ID(), 10), name)
	// Not the mount's root: a descriptor of it would hold it busy.
	cmd.ExtraFiles = []*os.File{g, r, parent} // fds 3, 4 and 5
	cmd.Stderr = os.Stderr
	// Its own process group: a Ctrl-C meant for the daemon must not end
	// the keeper first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	k := &keeper{cmd: cmd, bye: w, done: make(chan struct{})}
	go func() { cmd.Wait(); close(k.done) }()
	return k, nil
}

// stop tells the keeper the daemon stops cleanly, and waits for it.
func (k *keeper) stop() {
	k.bye.Write([]byte{'q'})
	k.bye.Close()
	select {
	case <-k.done:
	case <-time.After(5 * time.Second):
		k.cmd.Process.Kill()
	}
}

// RunKeeper is the keeper's main: fd 3 is the group, fd 4 the pipe from
// the daemon, fd 5 the mountpoint's parent. It returns only on a clean
// stop.
func RunKeeper(args []string) int {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "amlfs keeper: want MOUNTPOINT MOUNT-ID NAME")
		return 2
	}
	mp := args[0]
	id, _ := strconv.ParseUint(args[1], 10, 64)
	group, pipe, parent := 3, os.NewFile(4, "daemon"), os.NewFile(5, "parent")
	buf := make([]byte, 1)
	if n, _ := pipe.Read(buf); n == 1 && buf[0] == 'q' {
		return 0 // a clean stop: the daemon answered everything
	}
	// The daemon died. The mount is detached by its id, through the
	// parent's descriptor, never by a path someone could have changed.
	if err := mountpoint.DetachAt(parent, args[2], id); err != nil {
		fmt.Fprintf(os.Stderr, "amlfs keeper: the daemon died; detach %s: %v\n", mp, err)
	}
	parent.Close()
	fmt.Fprintf(os.Stderr, "amlfs keeper: the daemon serving %s died; detached the mount, and files not fetched yet give EIO until the workspace is mounted again\n", mp)
	// Events the daemon read but never answered wait on descriptor
	// numbers of the dead daemon: answer every number it could have had.
	var lim unix.Rlimit
	max := 1 << 20
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && lim.Max < uint64(max) {
		max = int(lim.Max)
	}
	for fd := 0; fd < max; fd++ {
		deny(group, int32(fd))
	}
	unix.SetNonblock(group, false)
	go func() {
		ev := make([]byte, 64<<10)
		for {
			n, err := unix.Read(group, ev)
			if err == unix.EINTR || err == unix.EAGAIN {
				continue
			}
			if err != nil || n == 0 {
				os.Exit(1)
			}
			eachEvent(ev[:n], func(m *unix.FanotifyEventMetadata, _ []byte) {
				if m.Fd >= 0 {
					deny(group, m.Fd)
					unix.Close(int(m.Fd))
				}
			})
		}
	}()
	// Once no process holds a file of the detached mount open, nothing
	// can reach a placeholder through it: the keeper's work is done.
	for idle := 0; idle < 2; {
		time.Sleep(keeperPoll)
		if mountInUse(id) {
			idle = 0
		} else {
			idle++
		}
	}
	return 0
}

// keeperPoll is how often a keeper whose daemon died looks for processes
// still using the detached mount.
const keeperPoll = 5 * time.Second

// mountInUse reports whether any process has a file open on the mount
// with id, from the mnt_id line of every /proc/PID/fdinfo/FD.
func mountInUse(id uint64) bool {
	want := fmt.Sprintf("mnt_id:\t%d\n", id)
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		dir := "/proc/" + p.Name() + "/fdinfo"
		fds, _ := os.ReadDir(dir)
		for _, fd := range fds {
			data, err := os.ReadFile(dir + "/" + fd.Name())
			if err == nil && strings.Contains(string(data), want) {
				return true
			}
		}
	}
	return false
}

func deny(group int, fd int32) {
	r := unix.FanotifyResponse{Fd: fd, Response: unix.FAN_DENY | uint32(unix.EIO)<<unix.FAN_ERRNO_SHIFT}
	unix.Write(group, (*[unsafe.Sizeof(r)]byte)(unsafe.Pointer(&r))[:])
}

// StopKeeper ends a keeper left by a dead daemon (pid in file), once the
// next mount has marked the tree again. A pid that is not a keeper is left
// alone.
func StopKeeper(file string) {
	data, err := os.ReadFile(file)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(string(data))
	if err != nil || pid <= 1 {
		return
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err == nil && containsArg(cmdline, KeeperArg) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	os.Remove(file)
}

func containsArg(cmdline []byte, arg string) bool {
	start := 0
	for i, b := range cmdline {
		if b == 0 {
			if string(cmdline[start:i]) == arg {
				return true
			}
			start = i + 1
		}
	}
	return false
}
