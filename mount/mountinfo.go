package mount

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/mount/mountpoint"
)

// probeMount asks the filesystem at mp for fresh attributes, which reach
// the daemon serving it: a plain stat can be answered from the kernel's
// attribute cache even when that daemon is dead.
func probeMount(mp string) error {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, mp, unix.AT_STATX_FORCE_SYNC|unix.AT_NO_AUTOMOUNT, unix.STATX_BASIC_STATS, &st)
	if err != nil {
		return &os.PathError{Op: "statx", Path: mp, Err: err}
	}
	return nil
}

// probeFD is probeMount on a descriptor (O_PATH) of the mount's root.
func probeFD(f *os.File) error {
	var st unix.Statx_t
	err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH|unix.AT_STATX_FORCE_SYNC, unix.STATX_BASIC_STATS, &st)
	if err != nil {
		return &os.PathError{Op: "statx", Path: f.Name(), Err: err}
	}
	return nil
}

func isDead(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
}

// IsDeadMount reports whether mp is a FUSE mount whose daemon is gone
// (killed, or crashed): every access fails with "transport endpoint is not
// connected".
func IsDeadMount(mp string) bool {
	err := probeMount(mp)
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
}

// DetachIfDead detaches the FUSE mount at mp if its daemon is gone, and
// reports whether it was dead. The path is resolved with no symlink
// followed, and the mount detached through descriptors (as root).
func DetachIfDead(mp string) (bool, error) {
	at, err := mountpoint.Open(mp, mountpoint.Policy{AllowUserOwnedParents: true})
	if err != nil {
		return false, nil
	}
	defer at.Close()
	top, err := at.Top()
	if err != nil {
		return false, nil
	}
	dead := isDead(probeFD(top))
	top.Close()
	if !dead {
		return false, nil
	}
	if os.Geteuid() != 0 {
		return true, Detach(mp)
	}
	return true, at.Detach()
}

// Detach removes the mount at mp lazily (MNT_DETACH): it leaves the
// namespace at once, and what still holds it open keeps it until closed.
// As root (or with CAP_SYS_ADMIN) this is umount2 itself; otherwise the
// setuid fusermount3 (or fusermount) does it for the user who mounted.
func Detach(mp string) error {
	err := unix.Unmount(mp, unix.MNT_DETACH)
	if err == nil || !errors.Is(err, syscall.EPERM) {
		if err != nil {
			return &os.PathError{Op: "umount2", Path: mp, Err: err}
		}
		return nil
	}
	for _, bin := range []string{"fusermount3", "fusermount"} {
		if p, lerr := exec.LookPath(bin); lerr == nil {
			if out, cerr := exec.Command(p, "-u", "-z", mp).CombinedOutput(); cerr != nil {
				return fmt.Errorf("%s -uz %s: %v: %s", bin, mp, cerr, strings.TrimSpace(string(out)))
			}
			return nil
		}
	}
	return fmt.Errorf("unmount %s: %w (and no fusermount3 to do it unprivileged)", mp, err)
}
