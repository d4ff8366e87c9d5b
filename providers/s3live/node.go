package s3live

import (
	"context"
	"sort"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/cache"
	"github.com/amlfs/amlfs/fuse/posix"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is the kernel's inode for an ent. The ent holds the state; nodes
// come and go as the kernel remembers and forgets.
type node struct {
	gofs.Inode
	l *Live
	e *ent
	// openedVer is the ent's ver at the last open: the kernel's pages of
	// the file are kept across opens while the object has not changed.
	openedVer uint64
}

// Root is the node to graft at the mount's prefix.
func (l *Live) Root() gofs.InodeEmbedder { return l.root }

// RootAttr is the stable identity of the root.
func (l *Live) RootAttr() gofs.StableAttr {
	return gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: l.rootE.ino}
}

func (n *node) ro() bool { return n.l.o.RO }

// attrLocked fills out from the ent. The caller holds l.mu.
func (n *node) attrLocked(e *ent, out *fuse.Attr) {
	out.Ino = e.ino
	out.Mode = e.mode
	out.Uid, out.Gid = e.uid, e.gid
	out.Nlink = 1
	if e.isDir() {
		// 2 and one per subdirectory's "..", of what is listed.
		out.Nlink = 2
		for _, c := range e.children {
			if c.isDir() {
				out.Nlink++
			}
		}
	}
	if e.gone {
		out.Nlink = 0
	}
	n.l.syncDirtyLocked(e)
	size := e.size
	if e.mode&syscall.S_IFMT == syscall.S_IFLNK && e.link != "" {
		size = int64(len(e.link))
	}
	out.Size = uint64(size)
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = 1 << 20
	ctime := e.mtime
	if e.ctime.After(ctime) {
		ctime = e.ctime
	}
	atime := e.mtime
	if !e.atime.IsZero() {
		atime = e.atime
	}
	out.SetTimes(&atime, &e.mtime, &ctime)
}

func (n *node) entryOut(e *ent, out *fuse.EntryOut) {
	n.attrLocked(e, &out.Attr)
	out.SetEntryTimeout(n.l.o.TTL)
	out.SetAttrTimeout(n.l.o.TTL)
}

func (n *node) child(ctx context.Context, e *ent) *gofs.Inode {
	return n.NewInode(ctx, &node{l: n.l, e: e}, gofs.StableAttr{Mode: e.mode & syscall.S_IFMT, Ino: e.ino})
}

// same returns the ent of another node of this mount, or false when the
// node belongs to another provider (EXDEV).
func (n *node) same(other gofs.InodeEmbedder) (*node, bool) {
	o, ok := other.(*node)
	return o, ok && o.l == n.l
}

var (
	_ = (gofs.NodeLookuper)((*node)(nil))
	_ = (gofs.NodeReaddirer)((*node)(nil))
	_ = (gofs.NodeGetattrer)((*node)(nil))
	_ = (gofs.NodeSetattrer)((*node)(nil))
	_ = (gofs.NodeOpener)((*node)(nil))
	_ = (gofs.NodeCreater)((*node)(nil))
	_ = (gofs.NodeMkdirer)((*node)(nil))
	_ = (gofs.NodeUnlinker)((*node)(nil))
	_ = (gofs.NodeRmdirer)((*node)(nil))
	_ = (gofs.NodeRenamer)((*node)(nil))
	_ = (gofs.NodeSymlinker)((*node)(nil))
	_ = (gofs.NodeReadlinker)((*node)(nil))
	_ = (gofs.NodeLinker)((*node)(nil))
	_ = (gofs.NodeFsyncer)((*node)(nil))
	_ = (gofs.NodeStatfser)((*node)(nil))
	_ = (gofs.NodeMknoder)((*node)(nil))
)

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := n.l.loadDir(ctx, n.e); errno != 0 {
		return nil, errno
	}
	n.l.mu.Lock()
	c := n.e.children[name]
	tooLong := c == nil && n.l.keyTooLongLocked(n.e, name, 0)
	n.l.mu.Unlock()
	if tooLong {
		return nil, syscall.ENAMETOOLONG // no object can have that key
	}
	if c == nil {
		out.SetEntryTimeout(n.l.o.TTL) // a miss is trusted for the TTL too
		return nil, syscall.ENOENT
	}
	if errno := n.l.head(ctx, c); errno != 0 {
		if errno == syscall.ENOENT {
			out.SetEntryTimeout(n.l.o.TTL)
		}
		return nil, errno
	}
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	if c.gone {
		return nil, syscall.ENOENT
	}
	n.entryOut(c, out)
	return n.child(ctx, c), 0
}

func (n *node) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	if errno := n.l.loadDir(ctx, n.e); errno != 0 {
		return nil, errno
	}
	n.l.headAll(ctx, n.e)
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	list := make([]fuse.DirEntry, 0, len(n.e.children)+2)
	list = append(list, fuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR, Ino: n.e.ino})
	parent := n.e.ino
	if n.e.parent != nil {
		parent = n.e.parent.ino
	}
	list = append(list, fuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR, Ino: parent})
	for name, c := range n.e.children {
		list = append(list, fuse.DirEntry{Name: name, Mode: c.mode & syscall.S_IFMT, Ino: c.ino})
	}
	sort.Slice(list[2:], func(i, j int) bool { return list[2+i].Name < list[2+j].Name })
	return gofs.NewListDirStream(list), 0
}

func (n *node) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno := n.l.head(ctx, n.e); errno != 0 {
		return errno
	}
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	n.attrLocked(n.e, &out.Attr)
	out.SetTimeout(n.l.o.TTL)
	return 0
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	// A bucket has no size: report plenty of room.
	const blocks = 1 << 40
	out.Bsize, out.Frsize = 4096, 4096
	out.Blocks, out.Bfree, out.Bavail = blocks, blocks, blocks
	out.Files, out.Ffree = 1<<40, 1<<40
	out.NameLen = NameMax
	return 0
}

// killSuidgidLocked clears setuid and setgid as an unprivileged write
// does, and reports whether that changed e's mode.
func killSuidgidLocked(e *ent) bool {
	m := posix.KillSuidgid(e.mode)
	changed := m != e.mode
	e.mode = m
	return changed
}

// touchLocked records a change of e's metadata to upload.
func (n *node) touchLocked(e *ent) {
	e.gen++
	e.ctime = time.Now()
	if !e.dirty {
		e.metaDirty = true
	}
}

func (n *node) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.l.q.touch()
	if n.ro() {
		return syscall.EROFS
	}
	e := n.e
	if errno := n.l.head(ctx, e); errno != 0 {
		return errno
	}
	if size, ok := in.GetSize(); ok {
		if e.isDir() {
			return syscall.EISDIR
		}
		if errno := n.l.writable(ctx, e, size == 0); errno != 0 {
			return errno
		}
		n.l.mu.Lock()
		err := e.data.Truncate(int64(size))
		e.gen++
		e.ctime = time.Now()
		n.l.mu.Unlock()
		if err != nil {
			// EFBIG past the cache disk's largest file, as on ext4.
			return n.l.errno("truncate", n.l.keyOf(e), err)
		}
	}
	n.l.mu.Lock()
	changed := false
	if m, ok := in.GetMode(); ok {
		e.mode = e.mode&syscall.S_IFMT | m&0o7777
		changed = true
	}
	if u, ok := in.GetUID(); ok {
		e.uid, changed = u, true
	}
	if g, ok := in.GetGID(); ok {
		e.gid, changed = g, true
	}
	if at, ok := in.GetATime(); ok {
		e.atime = at
		e.ctime = time.Now()
	}
	if mt, ok := in.GetMTime(); ok {
		e.mtime, changed = mt, true
		if e.dirty && e.data != nil {
			// A dirty file's mtime is its cache file's (the kernel
			// may write it directly).
			e.data.SetMTime(mt)
		}
	}
	if in.Valid&fuse.FATTR_KILL_SUIDGID != 0 && killSuidgidLocked(e) {
		// The kernel asks this of an unprivileged truncate or chown.
		changed = true
	}
	if changed {
		n.touchLocked(e)
	}
	queue := (changed || e.dirty) && e.opens == 0
	n.attrLocked(e, &out.Attr)
	n.l.mu.Unlock()
	out.SetTimeout(n.l.o.TTL)
	if queue {
		n.l.enqueuePut(e, n.l.o.WriteBack)
	}
	return 0
}

// writable makes e's cached file dirty (pinned, every byte present), so
// that it can be written: empty when trunc is set, else with the object's
// bytes fetched first.
func (l *Live) writable(ctx context.Context, e *ent, trunc bool) syscall.Errno {
	for range 3 {
		l.mu.Lock()
		if e.dirty && e.data != nil {
			if trunc {
				e.data.Truncate(0)
				e.gen++
			}
			l.mu.Unlock()
			return 0
		}
		if e.ptData != nil && e.ptData == e.data {
			// The kernel has this file open directly: change it in
			// place (it is whole, or it would not be).
			err := e.data.Pin()
			if err == nil && trunc {
				err = e.data.Truncate(0)
			}
			if err != nil {
				l.mu.Unlock()
				return l.errno("cache", l.key(e), err)
			}
			e.dirty = true
			e.gen++
			l.mu.Unlock()
			return 0
		}
		if trunc || !e.remote || e.size == 0 {
			old := e.data
			f, err := l.o.Cache.NewDirty()
			if err != nil {
				l.mu.Unlock()
				return l.errno("cache", l.key(e), err)
			}
			e.data, e.dirty, e.size = f, true, 0
			e.gen++
			l.mu.Unlock()
			if old != nil {
				old.Drop()
			}
			return 0
		}
		f, errno := l.dataLocked(e)
		key := l.key(e)
		l.mu.Unlock()
		if errno != 0 {
			return errno
		}
		n := (f.Size() + cache.ChunkSize - 1) / cache.ChunkSize
		if n > 0 {
			if err := l.fill(ctx, e, f, 0, n-1, true); err != nil {
				return l.errno("read", key, err)
			}
		}
		l.mu.Lock()
		if e.data == f && f.Pin() == nil {
			e.dirty = true
			e.gen++
			l.mu.Unlock()
			return 0
		}
		l.mu.Unlock()
		// Evicted while it was fetched (a cache smaller than the
		// file), or replaced: try again.
	}
	return syscall.ENOSPC
}

// dataLocked returns e's cached file, made empty if there is none.
func (l *Live) dataLocked(e *ent) (*cache.File, syscall.Errno) {
	if e.data != nil {
		return e.data, 0
	}
	f, err := l.o.Cache.NewFile(e.size)
	if err != nil {
		return nil, l.errno("cache", l.key(e), err)
	}
	e.data = f
	return f, 0
}

const writeFlags = syscall.O_WRONLY | syscall.O_RDWR | syscall.O_TRUNC | syscall.O_APPEND

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	e := n.e
	if flags&writeFlags != 0 && n.ro() {
		return nil, 0, syscall.EROFS
	}
	if errno := n.l.head(ctx, e); errno != 0 {
		return nil, 0, errno
	}
	if flags&syscall.O_TRUNC != 0 {
		// Other writes make the file writable at the first write, so
		// an open that writes nothing (touch) uploads nothing.
		if errno := n.l.writable(ctx, e, true); errno != 0 {
			return nil, 0, errno
		}
	}
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	if e.gone {
		return nil, 0, syscall.ENOENT
	}
	f, errno := n.l.dataLocked(e)
	if errno != 0 {
		return nil, 0, errno
	}
	if caller, ok := fuse.FromContext(ctx); ok && caller.Uid != 0 && flags&writeFlags != 0 {
		// A write by an unprivileged caller clears setuid and setgid.
		// At open, as the workspace does: passthrough writes bypass
		// amlfs.
		if killSuidgidLocked(e) {
			n.touchLocked(e)
		}
	}
	e.opens++
	var fl uint32
	if n.openedVer == e.ver {
		fl |= fuse.FOPEN_KEEP_CACHE
	}
	n.openedVer = e.ver
	h := &handle{n: n}
	// A wholly cached file is read (and, once truncated, written) by
	// the kernel itself: passthrough to the cache file. Plain writes to
	// an existing object go through amlfs, so that an open that writes
	// nothing uploads nothing.
	write := flags&writeFlags != 0
	if (!write || e.dirty) && (e.ptData == nil || e.ptData == f) && f.Hold() {
		return n.l.passthroughLocked(e, h, write), fl, 0
	}
	return h, fl, 0
}

// passthroughLocked makes h a passthrough handle of e's cache file,
// which the caller has held.
func (l *Live) passthroughLocked(e *ent, h *handle, write bool) gofs.FileHandle {
	e.ptData = e.data
	e.ptOpens++
	h.pt, h.ptWrite = e.data, write
	if write {
		e.ptWriters++
	}
	return &ptHandle{handle: h}
}

// ptHandle is a handle the kernel reads and writes itself, on the cache
// file (FUSE passthrough).
type ptHandle struct{ *handle }

var _ = (gofs.FilePassthroughFder)((*ptHandle)(nil))

func (h *ptHandle) PassthroughFd() (int, bool) { return h.pt.Fd(), true }

var _ = (gofs.NodeFlusher)((*node)(nil))

// Flush answers ENOSYS, after which the kernel stops sending FLUSH (as the
// workspace does): close needs nothing from amlfs but the release.
func (n *node) Flush(ctx context.Context, f gofs.FileHandle) syscall.Errno {
	return syscall.ENOSYS
}

func (n *node) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	return n.l.fsync(ctx, n.e)
}

// fsync uploads e now if it has changes, and returns when the bucket has
// them.
func (l *Live) fsync(ctx context.Context, e *ent) syscall.Errno {
	for range 5 {
		l.mu.Lock()
		if !e.dirty && !e.metaDirty || e.gone {
			l.mu.Unlock()
			return 0
		}
		// Every write before this fsync is in what an upload that
		// starts from now on reads: that upload is enough.
		gen := e.gen
		key := l.key(e)
		l.mu.Unlock()
		ch := l.enqueuePut(e, 0)
		select {
		case err := <-ch:
			if err != nil {
				return l.errno("fsync", key, err)
			}
		case <-ctx.Done():
			return syscall.EINTR
		}
		l.mu.Lock()
		done := e.upGen >= gen
		l.mu.Unlock()
		if done {
			return 0
		}
	}
	return 0
}
