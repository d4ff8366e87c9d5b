package loopback

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

func (n *Node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.root.opts.ReadOnly {
		return nil, nil, 0, syscall.EROFS
	}
	pfd, done, errno := n.fd()
	if errno != 0 {
		return nil, nil, 0, errno
	}
	defer done()
	hfd, err := n.root.openFd(func() (int, error) {
		return unix.Openat(pfd, name, openFlags(flags)|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, mode)
	})
	created := err == nil
	if err == unix.EEXIST && flags&syscall.O_EXCL == 0 {
		// The kernel's entry was stale (a host-side create): open
		// what is there, as the caller may.
		hfd, err = n.openExisting(ctx, pfd, name, flags)
	}
	if err != nil {
		return nil, nil, 0, errnoOf(err)
	}
	var st unix.Statx_t
	if err := statFd(hfd, &st); err != nil {
		unix.Close(hfd)
		return nil, nil, 0, errnoOf(err)
	}
	if created {
		if errno := n.own(ctx, pfd, hfd, &st, mode); errno != 0 {
			unix.Close(hfd)
			return nil, nil, 0, errno
		}
	}
	ch, errno := n.adopt(ctx, hfd, &st, out)
	if errno != 0 {
		unix.Close(hfd)
		return nil, nil, 0, errno
	}
	return ch, n.root.newFile(hfd, backingOf(ch), flags, n.BackingIno()), 0, 0
}

// openExisting opens the existing regular file name for a CREATE without
// O_EXCL, after checking the caller's permission by the file's mode (the
// kernel checked only the directory's).
func (n *Node) openExisting(ctx context.Context, pfd int, name string, flags uint32) (int, error) {
	hfd, err := n.root.openFd(func() (int, error) { return unix.Openat(pfd, name, openFlags(flags)|unix.O_NOFOLLOW, 0) })
	if err != nil {
		return -1, err
	}
	var st unix.Statx_t
	if err := statFd(hfd, &st); err != nil {
		unix.Close(hfd)
		return -1, err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		unix.Close(hfd)
		return -1, unix.EISDIR
	}
	if caller, ok := fuse.FromContext(ctx); ok && caller.Uid != 0 {
		perm := uint32(st.Mode) & 0o7
		switch {
		case caller.Uid == st.Uid:
			perm = uint32(st.Mode) >> 6 & 0o7
		case caller.Gid == st.Gid:
			perm = uint32(st.Mode) >> 3 & 0o7
		}
		want := uint32(0o4)
		switch flags & syscall.O_ACCMODE {
		case syscall.O_WRONLY:
			want = 0o2
		case syscall.O_RDWR:
			want = 0o6
		}
		if flags&syscall.O_TRUNC != 0 {
			want |= 0o2
		}
		if perm&want != want {
			unix.Close(hfd)
			return -1, unix.EACCES
		}
	}
	return hfd, nil
}

// own gives a new backing inode (fd: any descriptor of it, in directory
// pfd) to the caller, as the kernel would have: the caller's uid, and its
// gid unless the directory is setgid. A chown clears setuid and setgid;
// the mode asked for is then put back (the kernel already stripped what the
// caller may not set).
func (n *Node) own(ctx context.Context, pfd, fd int, st *unix.Statx_t, mode uint32) syscall.Errno {
	caller, ok := fuse.FromContext(ctx)
	if n.root.euid != 0 || !ok {
		return 0
	}
	uid, gid := int(caller.Uid), int(caller.Gid)
	if uint32(gid) != st.Gid {
		var pst unix.Statx_t
		if err := statFd(pfd, &pst); err != nil {
			return errnoOf(err)
		}
		if pst.Mode&syscall.S_ISGID != 0 {
			gid = -1
		}
	}
	if uint32(uid) == st.Uid && (gid == -1 || uint32(gid) == st.Gid) {
		return 0
	}
	if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errnoOf(err)
	}
	typ := uint32(st.Mode) & syscall.S_IFMT
	if mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 && typ != syscall.S_IFDIR && typ != syscall.S_IFLNK {
		if err := unix.Chmod(procPath(fd), mode&0o7777); err != nil {
			return errnoOf(err)
		}
	}
	if err := statFd(fd, st); err != nil {
		return errnoOf(err)
	}
	return 0
}

// made finishes a mkdir, mknod or symlink of name in pfd: it opens the new
// entry by handle, gives it to the caller and makes its node. A new entry
// is the daemon's; anything else found there (swapped in since) is not
// given away.
func (n *Node) made(ctx context.Context, pfd int, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	fd, err := n.root.openFd(func() (int, error) { return unix.Openat(pfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0) })
	if err != nil {
		return nil, errnoOf(err)
	}
	var st unix.Statx_t
	if err := statFd(fd, &st); err != nil {
		unix.Close(fd)
		return nil, errnoOf(err)
	}
	if int(st.Uid) == n.root.euid && uint32(st.Mode)&syscall.S_IFMT == mode&syscall.S_IFMT {
		if errno := n.own(ctx, pfd, fd, &st, mode); errno != 0 {
			unix.Close(fd)
			return nil, errno
		}
	}
	return n.child(ctx, n.root.acquire(&st, fd), &st, out), 0
}

// writable returns the node's descriptor for a change, or EROFS.
func (n *Node) writable() (int, func(), syscall.Errno) {
	if n.root.opts.ReadOnly {
		return -1, noop, syscall.EROFS
	}
	return n.fd()
}

var _ = (gofs.NodeMkdirer)((*Node)(nil))

func (n *Node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	pfd, done, errno := n.writable()
	if errno != 0 {
		return nil, errno
	}
	defer done()
	if err := unix.Mkdirat(pfd, name, mode); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, pfd, name, mode|syscall.S_IFDIR, out)
}

var _ = (gofs.NodeMknoder)((*Node)(nil))

func (n *Node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	pfd, done, errno := n.writable()
	if errno != 0 {
		return nil, errno
	}
	defer done()
	if err := unix.Mknodat(pfd, name, mode, int(rdev)); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, pfd, name, mode, out)
}

var _ = (gofs.NodeSymlinker)((*Node)(nil))

func (n *Node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	pfd, done, errno := n.writable()
	if errno != 0 {
		return nil, errno
	}
	defer done()
	if err := unix.Symlinkat(target, pfd, name); err != nil {
		return nil, errnoOf(err)
	}
	return n.made(ctx, pfd, name, syscall.S_IFLNK|0o777, out)
}

var _ = (gofs.NodeLinker)((*Node)(nil))

func (n *Node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	pfd, done, errno := n.writable()
	if errno != 0 {
		return nil, errno
	}
	defer done()
	t, ok := n.sameTree(target)
	if !ok {
		return nil, syscall.EXDEV
	}
	tfd, doneT, errno := t.fd()
	if errno != 0 {
		return nil, errno
	}
	defer doneT()
	err := unix.Linkat(tfd, "", pfd, name, unix.AT_EMPTY_PATH)
	if err == unix.ENOENT && n.root.euid != 0 {
		// AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the inode's proc
		// link names the same inode.
		err = unix.Linkat(unix.AT_FDCWD, procPath(tfd), pfd, name, unix.AT_SYMLINK_FOLLOW)
	}
	if err != nil {
		return nil, errnoOf(err)
	}
	var st unix.Statx_t
	if err := statFd(tfd, &st); err != nil {
		return nil, errnoOf(err)
	}
	return n.adopt(ctx, tfd, &st, out)
}

var _ = (gofs.NodeUnlinker)((*Node)(nil))

func (n *Node) Unlink(ctx context.Context, name string) syscall.Errno {
	pfd, done, errno := n.writable()
	if errno != 0 {
		return errno
	}
	defer done()
	return errnoOf(unix.Unlinkat(pfd, name, 0))
}

var _ = (gofs.NodeRmdirer)((*Node)(nil))

func (n *Node) Rmdir(ctx context.Context, name string) syscall.Errno {
	pfd, done, errno := n.writable()
	if errno != 0 {
		return errno
	}
	defer done()
	return errnoOf(unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR))
}

var _ = (gofs.NodeRenamer)((*Node)(nil))

func (n *Node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	pfd, done, errno := n.writable()
	if errno != 0 {
		return errno
	}
	defer done()
	np, ok := n.sameTree(newParent)
	if !ok {
		return syscall.EXDEV
	}
	npfd, doneNp, errno := np.fd()
	if errno != 0 {
		return errno
	}
	defer doneNp()
	return errnoOf(unix.Renameat2(pfd, name, npfd, newName, uint(flags)))
}

var _ = (gofs.NodeTmpfiler)((*Node)(nil))

func (n *Node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	pfd, done, errno := n.writable()
	if errno != 0 {
		return nil, nil, 0, errno
	}
	defer done()
	hfd, err := n.root.openFd(func() (int, error) { return unix.Openat(pfd, ".", openFlags(flags)|unix.O_TMPFILE, mode) })
	if err != nil {
		return nil, nil, 0, errnoOf(err)
	}
	var st unix.Statx_t
	if err := statFd(hfd, &st); err != nil {
		unix.Close(hfd)
		return nil, nil, 0, errnoOf(err)
	}
	if errno := n.own(ctx, pfd, hfd, &st, mode); errno != 0 {
		unix.Close(hfd)
		return nil, nil, 0, errno
	}
	ch, errno := n.adopt(ctx, hfd, &st, out)
	if errno != 0 {
		unix.Close(hfd)
		return nil, nil, 0, errno
	}
	b := backingOf(ch)
	b.tmp.Store(true)
	return ch, n.root.newFile(hfd, b, flags, 0), 0, 0
}

var _ = (gofs.NodeOpendirHandler)((*Node)(nil))

// backingOf is the backing inode of a node this tree made (child, adopt).
func backingOf(ch *gofs.Inode) *backing {
	return ch.Operations().(loopbacker).Loopback().r.Load().b
}
