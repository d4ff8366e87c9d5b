package gitindex

import (
	"syscall"

	"golang.org/x/sys/unix"
)

func utimesNoFollow(p string, ts []syscall.Timespec) error {
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{unix.Timespec(ts[0]), unix.Timespec(ts[1])}, unix.AT_SYMLINK_NOFOLLOW)
}
