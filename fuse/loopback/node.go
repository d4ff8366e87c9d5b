package loopback

import (
	"context"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Node is a loopback inode. Wrappers embed it and override what they add;
// Loopback finds it again behind a wrapper.
type Node struct {
	gofs.Inode
	root *Root
	// r is the node's claim on its backing inode. It changes only for
	// the tree's root, when Reroot moves it to a new backing directory.
	r atomic.Pointer[ref]
}

func newNode(root *Root, b *backing) *Node {
	n := &Node{root: root}
	n.claim(b)
	return n
}

// claim points the node at b, which the caller holds a reference of.
func (n *Node) claim(b *backing) *ref {
	r := &ref{root: n.root, b: b}
	r.held.Store(true)
	runtime.AddCleanup(n, (*ref).drop, r)
	return n.r.Swap(r)
}

// Loopback returns the node itself; through a wrapper that embeds it, the
// loopback node of an InodeEmbedder.
func (n *Node) Loopback() *Node { return n }

// BackingIno is the inode number of the node's backing file.
func (n *Node) BackingIno() uint64 { return n.r.Load().b.key.ino }

// ParentIno is the backing inode number of the directory the node was
// last found in (0 if none: unlinked, or the root). A file of several
// links has one of them.
func (n *Node) ParentIno() uint64 {
	_, p := n.Parent()
	if p == nil {
		return 0
	}
	if l, ok := p.Operations().(interface{ Loopback() *Node }); ok {
		return l.Loopback().BackingIno()
	}
	return 0
}

// Tree returns the tree the node belongs to.
func (n *Node) Tree() *Root { return n.root }

type loopbacker interface{ Loopback() *Node }

// sameTree returns other's loopback node if it is of this tree (a rename or
// link to anything else crosses filesystems: EXDEV).
func (n *Node) sameTree(other gofs.InodeEmbedder) (*Node, bool) {
	o, ok := other.(loopbacker)
	if !ok || o.Loopback().root != n.root {
		return nil, false
	}
	return o.Loopback(), true
}

// fd returns the node's O_PATH descriptor, open until done is called: an
// operation calls done when it no longer uses it. A descriptor shed to
// stay within the budget is opened again by its file handle.
func (n *Node) fd() (int, func(), syscall.Errno) {
	r := n.r.Load()
	if !r.held.Load() {
		// go-fuse reused the node after forgetting it.
		if !n.root.revive(r.b) {
			return -1, noop, syscall.ESTALE
		}
		if !r.held.CompareAndSwap(false, true) {
			n.root.release(r.b)
		}
	}
	fd, errno := n.root.use(r.b)
	if errno != 0 {
		return -1, noop, errno
	}
	return fd, func() { n.root.done(r.b) }, 0
}

func noop() {}

// Fd returns the node's O_PATH descriptor, for wrappers that act on the
// backing inode themselves; it stays open until done is called.
func (n *Node) Fd() (int, func(), syscall.Errno) { return n.fd() }

var _ = (gofs.NodeOnForgetter)((*Node)(nil))

// OnForget drops the node's claim on its backing descriptor.
func (n *Node) OnForget() { n.r.Load().drop() }

// StableAttrOf is the identity of the node for a graft (NewPersistentInode).
func (n *Node) StableAttrOf() (gofs.StableAttr, error) {
	fd, done, errno := n.fd()
	if errno != 0 {
		return gofs.StableAttr{}, errno
	}
	defer done()
	var st unix.Statx_t
	if err := statFd(fd, &st); err != nil {
		return gofs.StableAttr{}, err
	}
	return n.root.stableAttr(&st), nil
}

// ChildAttr is the identity the node would give the backing entry name in
// it now, by its descriptor: a wrapper that knows a child of that name
// compares the two to tell whether the name still names that inode.
func (n *Node) ChildAttr(name string) (gofs.StableAttr, error) {
	fd, done, errno := n.fd()
	if errno != 0 {
		return gofs.StableAttr{}, errno
	}
	defer done()
	var st unix.Statx_t
	if err := statAt(fd, name, &st); err != nil {
		return gofs.StableAttr{}, err
	}
	return n.root.stableAttr(&st), nil
}

func (n *Node) isLink() bool { return n.StableAttr().Mode == syscall.S_IFLNK }

// fill sets a reply's attributes from the backing inode's.
func (r *Root) fill(st *unix.Statx_t, a *fuse.Attr) {
	var ctime unix.StatxTimestamp
	a.Ino, ctime = r.shown(st)
	a.Size = st.Size
	a.Blocks = st.Blocks
	a.Atime, a.Atimensec = uint64(st.Atime.Sec), st.Atime.Nsec
	a.Mtime, a.Mtimensec = uint64(st.Mtime.Sec), st.Mtime.Nsec
	a.Ctime, a.Ctimensec = uint64(ctime.Sec), ctime.Nsec
	a.Mode = uint32(st.Mode)
	a.Nlink = st.Nlink
	a.Uid, a.Gid = st.Uid, st.Gid
	a.Rdev = uint32(unix.Mkdev(st.Rdev_major, st.Rdev_minor))
	a.Blksize = st.Blksize
}

func (r *Root) entry(st *unix.Statx_t, out *fuse.EntryOut) {
	r.fill(st, &out.Attr)
	r.entryTimeouts(out)
}

func (r *Root) entryTimeouts(out *fuse.EntryOut) {
	if r.opts.EntryTimeout > 0 {
		out.SetEntryTimeout(r.opts.EntryTimeout)
	}
	if r.opts.AttrTimeout > 0 {
		out.SetAttrTimeout(r.opts.AttrTimeout)
	}
}

func (r *Root) attrTimeout(out *fuse.AttrOut) {
	if r.opts.AttrTimeout > 0 {
		out.SetTimeout(r.opts.AttrTimeout)
	}
}

// child makes the node of a backing inode found or made in n, holding b.
func (n *Node) child(ctx context.Context, b *backing, st *unix.Statx_t, out *fuse.EntryOut) *gofs.Inode {
	n.root.entry(st, out)
	nn := newNode(n.root, b)
	var ops gofs.InodeEmbedder = nn
	if w := n.root.opts.Wrap; w != nil {
		ops = w(nn)
	}
	return n.NewInode(ctx, ops, n.root.stableAttr(st))
}

// adopt makes the node of a backing inode that fd (any descriptor of it,
// which adopt closes) refers to.
func (n *Node) adopt(ctx context.Context, fd int, st *unix.Statx_t, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	b := n.root.acquire(st, -1)
	if b == nil {
		// The /proc link is resolved by the kernel to the very inode
		// fd refers to, never by walking a path, so following it is
		// safe (O_NOFOLLOW would open the link itself).
		pfd, err := n.root.openFd(func() (int, error) { return unix.Open(procPath(fd), unix.O_PATH|unix.O_CLOEXEC, 0) })
		if err != nil {
			return nil, errnoOf(err)
		}
		b = n.root.acquire(st, pfd)
	}
	return n.child(ctx, b, st, out), 0
}

// lookupAt makes the node of the backing entry name in directory pfd.
func (n *Node) lookupAt(ctx context.Context, pfd int, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	var st unix.Statx_t
	if err := statAt(pfd, name, &st); err != nil {
		return nil, errnoOf(err)
	}
	if b := n.root.acquire(&st, -1); b != nil {
		return n.child(ctx, b, &st, out), 0
	}
	fd, err := n.root.openFd(func() (int, error) { return unix.Openat(pfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0) })
	if err != nil {
		return nil, errnoOf(err)
	}
	if err := statFd(fd, &st); err != nil {
		unix.Close(fd)
		return nil, errnoOf(err)
	}
	return n.child(ctx, n.root.acquire(&st, fd), &st, out), 0
}

var _ = (gofs.NodeLookuper)((*Node)(nil))

func (n *Node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	pfd, done, errno := n.fd()
	if errno != 0 {
		return nil, errno
	}
	defer done()
	ch, errno := n.lookupAt(ctx, pfd, name, out)
	if errno == syscall.ENOENT {
		// go-fuse answers a miss that has no entry time set as a
		// negative entry, kept for the mount's negative timeout; one with
		// a time set goes out as ENOENT, which the kernel does not keep.
		// A tree amlfs alone changes keeps its misses (git looks for a
		// .gitignore in every directory at every status); a shared tree,
		// which others change, does not.
		out.SetEntryTimeout(0)
		if n.root.opts.Shared {
			out.SetEntryTimeout(time.Nanosecond)
		}
	}
	return ch, errno
}

var _ = (gofs.NodeGetattrer)((*Node)(nil))

func (n *Node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fd, done, errno := n.fd()
	if errno != 0 {
		return errno
	}
	defer done()
	if fh, ok := f.(*File); ok {
		fd = fh.fd
	}
	var st unix.Statx_t
	if err := statFd(fd, &st); err != nil {
		return errnoOf(err)
	}
	n.root.fill(&st, &out.Attr)
	n.root.attrTimeout(out)
	return 0
}

var _ = (gofs.NodeStatxer)((*Node)(nil))

func (n *Node) Statx(ctx context.Context, f gofs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	fd, done, errno := n.fd()
	if errno != 0 {
		return errno
	}
	defer done()
	if fh, ok := f.(*File); ok {
		fd = fh.fd
	}
	var st unix.Statx_t
	sync := int(flags) & (unix.AT_STATX_FORCE_SYNC | unix.AT_STATX_DONT_SYNC)
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW|sync, int(mask)|statxMask, &st); err != nil {
		return errnoOf(err)
	}
	out.FromStatx(&st)
	ino, ctime := n.root.shown(&st)
	out.Ino = ino
	if st.Mask&unix.STATX_CTIME != 0 {
		out.Ctime.FromStatxTimestamp(&ctime)
	}
	if n.root.opts.AttrTimeout > 0 {
		out.SetTimeout(n.root.opts.AttrTimeout)
	}
	return 0
}

var _ = (gofs.NodeStatfser)((*Node)(nil))

func (n *Node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	fd, done, errno := n.fd()
	if errno != 0 {
		return errno
	}
	defer done()
	var s syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &s); err != nil {
		return errnoOf(err)
	}
	out.FromStatfsT(&s)
	return 0
}

var _ = (gofs.NodeReadlinker)((*Node)(nil))

func (n *Node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	fd, done, errno := n.fd()
	if errno != 0 {
		return nil, errno
	}
	defer done()
	for l := 256; ; l *= 2 {
		buf := make([]byte, l)
		sz, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return nil, errnoOf(err)
		}
		if sz < len(buf) {
			return buf[:sz], 0
		}
	}
}

// writeFlags are the open flags that can change a file.
const writeFlags = syscall.O_WRONLY | syscall.O_RDWR | syscall.O_TRUNC | syscall.O_APPEND

// openFlags are the flags of the daemon's own descriptor for a kernel
// open: O_APPEND dropped, since writes come with their offsets, and the
// kernel's FMODE_EXEC.
func openFlags(flags uint32) int {
	// O_NOFOLLOW was applied by the kernel at lookup; on the reopen of a
	// /proc/self/fd link it would refuse the link itself.
	return int(flags&^(syscall.O_APPEND|fuse.FMODE_EXEC|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOCTTY|syscall.O_NOFOLLOW)) | unix.O_CLOEXEC
}

var _ = (gofs.NodeOpener)((*Node)(nil))

func (n *Node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.root.opts.ReadOnly && flags&writeFlags != 0 {
		return nil, 0, syscall.EROFS
	}
	fd, done, errno := n.fd()
	if errno != 0 {
		return nil, 0, errno
	}
	defer done()
	hfd, err := n.root.openFd(func() (int, error) { return unix.Open(procPath(fd), openFlags(flags), 0) })
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	if n.root.opts.Shared && !n.r.Load().b.tmp.Load() {
		var st unix.Statx_t
		if err := statFd(hfd, &st); err != nil || st.Nlink == 0 {
			unix.Close(hfd)
			return nil, 0, syscall.ENOENT
		}
	}
	if flags&writeFlags != 0 {
		// With passthrough the kernel writes to the backing file with
		// the daemon's credentials, which would keep setuid and setgid
		// where a write by an unprivileged caller must clear them.
		if caller, ok := fuse.FromContext(ctx); ok && caller.Uid != 0 {
			if errno := killSuidgid(hfd); errno != 0 {
				unix.Close(hfd)
				return nil, 0, errno
			}
		}
	}
	return n.root.newFile(hfd, n.r.Load().b, flags, n.ParentIno()), 0, 0
}

var _ = (gofs.NodeCreater)((*Node)(nil))

func (n *Node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	ds, errno := n.openDir()
	var fl uint32
	if n.root.opts.CacheListings {
		fl = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
	}
	return ds, fl, errno
}

var _ = (gofs.NodeReaddirer)((*Node)(nil))

func (n *Node) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	return n.openDir()
}

var _ = (gofs.NodeFlusher)((*Node)(nil))

// Flush answers ENOSYS, after which the kernel stops sending FLUSH on every
// close: the backing file needs none, and locks are the kernel's own.
func (n *Node) Flush(ctx context.Context, f gofs.FileHandle) syscall.Errno {
	return syscall.ENOSYS
}

// errnoOf maps a system call's error; they are all syscall.Errno here.
func errnoOf(err error) syscall.Errno { return amlerr.Errno(err) }
