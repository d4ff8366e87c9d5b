package mount

import (
	"errors"
	"os"
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
		return true, mountpoint.FusermountDetach(mp)
	}
	return true, at.Detach()
}
