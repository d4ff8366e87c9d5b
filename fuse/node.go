package fuse

import (
	"context"
	"path"
	"strings"
	"syscall"

	"github.com/amlfs/amlfs/fuse/loopback"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is the workspace's node over the per-mount working directory. The
// handle-based loopback does the POSIX work (and refuses changes to a
// read-only root); node adds what the workspace needs around it: lazy
// restore before a file or directory is used, the checkpoint barrier, change
// tracking so that an unchanged workspace is not saved again, and the live
// mounts grafted at their prefixes.
type node struct {
	*loopback.Node
	fs *FS
}

// mutate runs a change under the barrier's read side and records it, as
// a change of n if it is a directory, else of its directory; and of the
// directories also given.
func (n *node) mutate(also ...*node) func() {
	dirs := make([]uint64, 0, 1+len(also))
	if n.IsDir() {
		dirs = append(dirs, n.BackingIno())
	} else if p := n.ParentIno(); p != 0 {
		dirs = append(dirs, p)
	} // else: in no directory (unlinked), a change of no listing
	for _, a := range also {
		dirs = append(dirs, a.BackingIno())
	}
	return n.fs.hold(dirs...)
}

const writeFlags = syscall.O_WRONLY | syscall.O_RDWR | syscall.O_TRUNC | syscall.O_APPEND

var _ = (gofs.NodeOpener)((*node)(nil))

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if errno := n.ensure(ctx); errno != 0 {
		return nil, 0, errno
	}
	if flags&writeFlags != 0 {
		// With passthrough the kernel writes to the backing file
		// directly, so an open for writing counts as a change.
		defer n.mutate()()
	}
	return n.Node.Open(ctx, flags)
}

var _ = (gofs.NodeWriter)((*node)(nil))

func (n *node) Write(ctx context.Context, f gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	defer n.mutate()()
	return f.(gofs.FileWriter).Write(ctx, data, off)
}

var _ = (gofs.NodeCreater)((*node)(nil))

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := n.ensureDir(ctx); errno != 0 {
		return nil, nil, 0, errno
	}
	defer n.mutate()()
	return n.Node.Create(ctx, name, flags, mode, out)
}

var _ = (gofs.NodeMkdirer)((*node)(nil))

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := n.ensureDir(ctx); errno != 0 {
		return nil, errno
	}
	defer n.mutate()()
	return n.Node.Mkdir(ctx, name, mode, out)
}

var _ = (gofs.NodeMknoder)((*node)(nil))

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := n.ensureDir(ctx); errno != 0 {
		return nil, errno
	}
	defer n.mutate()()
	return n.Node.Mknod(ctx, name, mode, rdev, out)
}

var _ = (gofs.NodeSymlinker)((*node)(nil))

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := n.ensureDir(ctx); errno != 0 {
		return nil, errno
	}
	defer n.mutate()()
	return n.Node.Symlink(ctx, target, name, out)
}

var _ = (gofs.NodeLinker)((*node)(nil))

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := n.ensureDir(ctx); errno != 0 {
		return nil, errno
	}
	defer n.mutate()()
	return n.Node.Link(ctx, target, name, out)
}

var _ = (gofs.NodeUnlinker)((*node)(nil))

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := n.ensureDir(ctx); errno != 0 {
		return errno
	}
	defer n.mutate()()
	return n.Node.Unlink(ctx, name)
}

var _ = (gofs.NodeRmdirer)((*node)(nil))

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := n.ensureDir(ctx); errno != 0 {
		return errno
	}
	if n.liveChild(name) != nil {
		return syscall.EBUSY
	}
	// An unpopulated directory is empty on disk but not in the revision.
	if errno := n.ensureChildDir(ctx, name); errno != 0 {
		return errno
	}
	defer n.mutate()()
	return n.Node.Rmdir(ctx, name)
}

var _ = (gofs.NodeRenamer)((*node)(nil))

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if errno := n.ensureDir(ctx); errno != 0 {
		return errno
	}
	p, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV // into a live mount
	}
	if n.liveChild(name) != nil || p.liveChild(newName) != nil {
		return syscall.EBUSY
	}
	// Both parents, and a directory moved or replaced, must be whole
	// before they change.
	if errno := p.ensureDir(ctx); errno != 0 {
		return errno
	}
	if errno := n.ensureChildDir(ctx, name); errno != 0 {
		return errno
	}
	if errno := p.ensureChildDir(ctx, newName); errno != 0 {
		return errno
	}
	defer n.mutate(p)()
	return n.Node.Rename(ctx, name, p, newName, flags)
}

var _ = (gofs.NodeSetattrer)((*node)(nil))

func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, resize := in.GetSize(); resize {
		if errno := n.ensure(ctx); errno != 0 {
			return errno
		}
	}
	defer n.mutate()()
	return n.Node.Setattr(ctx, f, in, out)
}

// ensure has the content provider put a lazily restored file's bytes in
// place before anything can read or resize it.
func (n *node) ensure(ctx context.Context) syscall.Errno {
	if n.fs.content == nil || n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG || !n.fs.content.Active() {
		return 0
	}
	// By the node's own descriptor: no path is resolved.
	fd, done, errno := n.Fd()
	if errno != 0 {
		return errno
	}
	defer done()
	if err := n.fs.content.Fill(ctx, fd); err != nil {
		return ToErrno(n.fs.log, "fetch", n.Path(nil), err)
	}
	return 0
}

// ensureDir has the content provider make a lazily restored directory's
// entries before anything looks inside or changes it.
func (n *node) ensureDir(ctx context.Context) syscall.Errno { return n.ensureChildDir(ctx, "") }

// ensureChildDir does ensureDir for n's child name, if it is a directory
// ("" for n itself).
func (n *node) ensureChildDir(ctx context.Context, name string) syscall.Errno {
	if n.fs.content == nil || !n.fs.content.Active() {
		return 0
	}
	rel := path.Join(n.Path(nil), name)
	return ToErrno(n.fs.log, "populate", rel, n.fs.content.EnsureDir(ctx, rel))
}

var _ = (gofs.NodeLookuper)((*node)(nil))

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if lm := n.liveChild(name); lm != nil {
		return n.graft(ctx, lm, name, out)
	}
	if errno := n.ensureDir(ctx); errno != 0 {
		return nil, errno
	}
	// A child directory still to be populated is populated first, or,
	// when the background prefetch is populating it, waited for: while
	// its placeholders are made its mtime is the moment's, and the kernel
	// would keep that one for --kernel-cache.
	if errno := n.ensureChildDir(ctx, name); errno != 0 {
		return nil, errno
	}
	return n.Node.Lookup(ctx, name, out)
}

// liveChild returns the live mount grafted at n's child name, if any.
func (n *node) liveChild(name string) *liveMount {
	// Only a name that ends some prefix is worth the walk up to the root.
	if !n.fs.liveNames[name] {
		return nil
	}
	return n.fs.live[path.Join(n.Path(nil), name)]
}

// graft returns the live mount's root in place of the workspace directory.
func (n *node) graft(ctx context.Context, lm *liveMount, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ch := n.liveInode(ctx, lm)
	// Attributes only once the root is part of the tree: a loopback
	// node finds its path through it.
	if g, ok := lm.Root.(gofs.NodeGetattrer); ok {
		var ao fuse.AttrOut
		if errno := g.Getattr(ctx, nil, &ao); errno != 0 {
			return nil, errno
		}
		out.Attr = ao.Attr
	}
	return ch, 0
}

// liveInode is the inode of the live mount's root, made on first use.
func (n *node) liveInode(ctx context.Context, lm *liveMount) *gofs.Inode {
	n.fs.liveMu.Lock()
	defer n.fs.liveMu.Unlock()
	if lm.inode == nil {
		lm.inode = n.NewPersistentInode(ctx, lm.Root, lm.Attr)
	}
	return lm.inode
}

var _ = (gofs.NodeOpendirHandler)((*node)(nil))

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if errno := n.ensureDir(ctx); errno != 0 {
		return nil, 0, errno
	}
	fh, fl, errno := n.Node.OpendirHandle(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return n.liveDir(ctx, fh.(loopback.DirHandle)), fl, 0
}

var _ = (gofs.NodeReaddirer)((*node)(nil))

func (n *node) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	if errno := n.ensureDir(ctx); errno != 0 {
		return nil, errno
	}
	ds, errno := n.Node.Readdir(ctx)
	if errno != 0 {
		return nil, errno
	}
	return n.liveDir(ctx, ds.(loopback.DirHandle)), 0
}

// liveDir lists a directory that holds live mounts with each mount's root
// inode number in place of the hidden workspace directory's, as lstat of
// the name reports it (find, du and os.scandir compare the two).
func (n *node) liveDir(ctx context.Context, d loopback.DirHandle) loopback.DirHandle {
	if len(n.fs.live) == 0 {
		return d
	}
	here := n.Path(nil)
	if !n.fs.liveDirs[here] {
		return d
	}
	return &liveDirStream{DirHandle: d, ino: func(name string) (uint64, bool) {
		lm := n.fs.live[path.Join(here, name)]
		if lm == nil || !n.fs.liveNames[name] {
			return 0, false
		}
		return n.liveInode(ctx, lm).StableAttr().Ino, true
	}}
}

type liveDirStream struct {
	loopback.DirHandle
	ino func(name string) (uint64, bool)
}

func (d *liveDirStream) fix(e *fuse.DirEntry) {
	if ino, ok := d.ino(e.Name); ok {
		e.Ino = ino
	}
}

func (d *liveDirStream) Next() (fuse.DirEntry, syscall.Errno) {
	e, errno := d.DirHandle.Next()
	if errno == 0 {
		d.fix(&e)
	}
	return e, errno
}

func (d *liveDirStream) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	e, errno := d.DirHandle.Readdirent(ctx)
	if e != nil {
		d.fix(e)
	}
	return e, errno
}

// internalXattr names amlfs's own markers in the working tree; the mount
// neither shows nor lets anyone change them.
func internalXattr(attr string) bool {
	return strings.HasPrefix(attr, "user.amlfs.") || strings.HasPrefix(attr, "trusted.amlfs.")
}

var _ = (gofs.NodeGetxattrer)((*node)(nil))

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr == ControlXattr && n.fs.control != "" && n.IsRoot() {
		if len(dest) < len(n.fs.control) {
			return uint32(len(n.fs.control)), map[bool]syscall.Errno{true: 0, false: syscall.ERANGE}[len(dest) == 0]
		}
		return uint32(copy(dest, n.fs.control)), 0
	}
	if internalXattr(attr) {
		return 0, syscall.ENODATA
	}
	return n.Node.Getxattr(ctx, attr, dest)
}

// ControlXattr is the virtual xattr of the mount root that names the
// daemon's control socket.
const ControlXattr = "user.amlfs.control"

var _ = (gofs.NodeListxattrer)((*node)(nil))

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	buf := make([]byte, 64<<10)
	sz, errno := n.Node.Listxattr(ctx, buf)
	if errno != 0 {
		return 0, errno
	}
	var out []byte
	for _, name := range strings.Split(string(buf[:sz]), "\x00") {
		if name != "" && !internalXattr(name) {
			out = append(append(out, name...), 0)
		}
	}
	if len(dest) == 0 {
		return uint32(len(out)), 0
	}
	if len(out) > len(dest) {
		return uint32(len(out)), syscall.ERANGE
	}
	return uint32(copy(dest, out)), 0
}

var _ = (gofs.NodeSetxattrer)((*node)(nil))

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if internalXattr(attr) {
		return syscall.EPERM
	}
	defer n.mutate()()
	return n.Node.Setxattr(ctx, attr, data, flags)
}

var _ = (gofs.NodeRemovexattrer)((*node)(nil))

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if internalXattr(attr) {
		return syscall.ENODATA
	}
	defer n.mutate()()
	return n.Node.Removexattr(ctx, attr)
}

var _ = (gofs.NodeAllocater)((*node)(nil))

func (n *node) Allocate(ctx context.Context, f gofs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	defer n.mutate()()
	return n.Node.Allocate(ctx, f, off, size, mode)
}

var _ = (gofs.NodeCopyFileRanger)((*node)(nil))

func (n *node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, len uint64, flags uint64) (uint32, syscall.Errno) {
	if dst, ok := out.Operations().(*node); ok {
		defer dst.mutate()()
	} else {
		defer n.mutate()()
	}
	return n.Node.CopyFileRange(ctx, fhIn, offIn, out, fhOut, offOut, len, flags)
}

var _ = (gofs.NodeTmpfiler)((*node)(nil))

func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := n.ensureDir(ctx); errno != 0 {
		return nil, nil, 0, errno
	}
	defer n.mutate()()
	return n.Node.Tmpfile(ctx, flags, mode, out)
}
