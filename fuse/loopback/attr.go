package loopback

import (
	"context"
	"syscall"

	"github.com/amlfs/amlfs/fuse/posix"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var _ = (gofs.NodeSetattrer)((*Node)(nil))

// Setattr changes the backing inode by its descriptor (or the open file's):
// owner first, since a chown clears setuid and setgid, then mode, size and
// times.
func (n *Node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	fd, done, errno := n.writable()
	if errno != 0 {
		return errno
	}
	defer done()
	hfd := -1
	if fh, ok := f.(*File); ok {
		hfd = fh.fd
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		if err := unix.Fchownat(fd, "", u, g, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return errnoOf(err)
		}
	}
	if mode, ok := in.GetMode(); ok {
		var err error
		switch {
		case n.isLink():
			err = unix.EOPNOTSUPP // Linux symlinks have no mode of their own
		case hfd >= 0:
			err = unix.Fchmod(hfd, mode)
		default:
			err = unix.Chmod(procPath(fd), mode)
		}
		if err != nil {
			return errnoOf(err)
		}
	}
	if size, ok := in.GetSize(); ok {
		var err error
		if hfd >= 0 {
			err = unix.Ftruncate(hfd, int64(size))
		} else if n.StableAttr().Mode != syscall.S_IFREG {
			err = unix.EINVAL
		} else {
			err = unix.Truncate(procPath(fd), int64(size))
		}
		if err != nil {
			return errnoOf(err)
		}
	}
	if in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) != 0 {
		ts := []unix.Timespec{
			utime(in.Valid, fuse.FATTR_ATIME, fuse.FATTR_ATIME_NOW, in.Atime, in.Atimensec),
			utime(in.Valid, fuse.FATTR_MTIME, fuse.FATTR_MTIME_NOW, in.Mtime, in.Mtimensec),
		}
		if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return errnoOf(err)
		}
	}
	if in.Valid&fuse.FATTR_KILL_SUIDGID != 0 && n.StableAttr().Mode == syscall.S_IFREG {
		// The kernel asks this of an unprivileged truncate or chown
		// (amlfs takes the duty with CAP_HANDLE_KILLPRIV_V2).
		if errno := killSuidgid(fd); errno != 0 {
			return errno
		}
	}
	var st unix.Statx_t
	if err := statFd(fd, &st); err != nil {
		return errnoOf(err)
	}
	n.root.fill(&st, &out.Attr)
	n.root.attrTimeout(out)
	return 0
}

// utime is one of utimensat's times from a SETATTR: now, a time, or left.
func utime(valid, set, now uint32, sec uint64, nsec uint32) unix.Timespec {
	switch {
	case valid&set == 0:
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	case valid&now != 0:
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	}
	return unix.Timespec{Sec: int64(sec), Nsec: int64(nsec)}
}

// killSuidgid clears setuid, and setgid on a group-executable file, of the
// regular file fd refers to, as a write or truncate by an unprivileged
// caller does.
func killSuidgid(fd int) syscall.Errno {
	var st unix.Statx_t
	if err := statFd(fd, &st); err != nil {
		return errnoOf(err)
	}
	mode := uint32(st.Mode)
	if killed := posix.KillSuidgid(mode); killed != mode {
		return errnoOf(unix.Chmod(procPath(fd), killed&0o7777))
	}
	return 0
}

// Extended attributes go through the inode's proc link, which names that
// very inode (there is no xattr call taking an O_PATH descriptor before
// Linux 6.13). A symlink's proc link would be followed to its target, so
// symlinks have none here (ext4 refuses user xattrs on them too).

var _ = (gofs.NodeGetxattrer)((*Node)(nil))

func (n *Node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	fd, done, errno := n.fd()
	if errno != 0 {
		return 0, errno
	}
	defer done()
	if n.isLink() {
		return 0, syscall.ENODATA
	}
	sz, err := unix.Getxattr(procPath(fd), attr, dest)
	return uint32(max(sz, 0)), errnoOf(err)
}

var _ = (gofs.NodeListxattrer)((*Node)(nil))

func (n *Node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	fd, done, errno := n.fd()
	if errno != 0 {
		return 0, errno
	}
	defer done()
	if n.isLink() {
		return 0, 0
	}
	sz, err := unix.Listxattr(procPath(fd), dest)
	return uint32(max(sz, 0)), errnoOf(err)
}

var _ = (gofs.NodeSetxattrer)((*Node)(nil))

func (n *Node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	fd, done, errno := n.writable()
	if errno != 0 {
		return errno
	}
	defer done()
	if n.isLink() {
		return syscall.EPERM
	}
	return errnoOf(unix.Setxattr(procPath(fd), attr, data, int(flags)))
}

var _ = (gofs.NodeRemovexattrer)((*Node)(nil))

func (n *Node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	fd, done, errno := n.writable()
	if errno != 0 {
		return errno
	}
	defer done()
	if n.isLink() {
		return syscall.ENODATA
	}
	return errnoOf(unix.Removexattr(procPath(fd), attr))
}
