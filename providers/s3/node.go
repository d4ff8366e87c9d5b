package s3

import (
	"context"
	"errors"
	"io"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/cache"
	"github.com/amlfs/amlfs/fuse/posix"
	"github.com/amlfs/amlfs/s3client"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
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

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.ro() {
		return nil, nil, 0, syscall.EROFS // before making a cache file for nothing
	}
	f, err := n.l.o.Cache.NewDirty()
	if err != nil {
		return nil, nil, 0, n.l.errno("cache", name, err)
	}
	ch, c, errno := n.add(ctx, name, syscall.S_IFREG|mode&0o7777, out, func(c *ent) {
		c.data, c.dirty, c.opens = f, true, 1
	})
	if errno != 0 {
		f.Drop()
		return nil, nil, 0, errno
	}
	h := &handle{n: ch.Operations().(*node)}
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	if f.Hold() {
		return ch, n.l.passthroughLocked(c, h, true), 0, 0
	}
	return ch, h, 0, 0
}

// changing starts a change of this directory's entries: it counts as
// activity for the write-back queue, is refused on a read-only mount, and
// needs the directory's listing.
func (n *node) changing(ctx context.Context) syscall.Errno {
	n.l.q.touch()
	if n.ro() {
		return syscall.EROFS
	}
	return n.l.loadDir(ctx, n.e)
}

// add makes a child name here, set up by init under the lock, unless the
// mount is read-only or the name is taken.
func (n *node) add(ctx context.Context, name string, mode uint32, out *fuse.EntryOut, init func(c *ent)) (*gofs.Inode, *ent, syscall.Errno) {
	if errno := n.changing(ctx); errno != 0 {
		return nil, nil, errno
	}
	n.l.mu.Lock()
	defer n.l.mu.Unlock()
	if n.e.children[name] != nil {
		return nil, nil, syscall.EEXIST
	}
	sub := 0
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		sub = 1
	}
	if n.l.keyTooLongLocked(n.e, name, sub) {
		return nil, nil, syscall.ENAMETOOLONG
	}
	c := n.newEntLocked(ctx, name, mode)
	init(c)
	n.entryOut(c, out)
	return n.child(ctx, c), c, 0
}

// newEntLocked adds a new child made here, owned by the caller.
func (n *node) newEntLocked(ctx context.Context, name string, mode uint32) *ent {
	c := &ent{name: name, parent: n.e, ino: n.l.newIno(), mode: mode, uid: n.l.o.UID, gid: n.l.o.GID, mtime: time.Now(), metaKnown: true}
	if caller, ok := fuse.FromContext(ctx); ok {
		c.uid, c.gid = caller.Uid, caller.Gid
	}
	n.e.children[name] = c
	n.e.mtime, n.e.ctime, c.changed = c.mtime, c.mtime, c.mtime
	return c
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ch, c, errno := n.add(ctx, name, syscall.S_IFDIR|mode&0o7777, out, func(c *ent) {
		c.children, c.listedAt, c.metaDirty = map[string]*ent{}, time.Now(), true
	})
	if errno == 0 {
		n.l.enqueuePut(c, n.l.o.WriteBack)
	}
	return ch, errno
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ro() {
		return nil, syscall.EROFS
	}
	return nil, syscall.EPERM // a bucket holds files, directories and symlinks
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ch, c, errno := n.add(ctx, name, syscall.S_IFLNK|0o777, out, func(c *ent) {
		c.link, c.size, c.metaDirty = target, int64(len(target)), true
	})
	if errno == 0 {
		n.l.enqueuePut(c, n.l.o.WriteBack)
	}
	return ch, errno
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	n.l.mu.Lock()
	link, remote, key := n.e.link, n.e.remote, n.l.key(n.e)
	n.l.mu.Unlock()
	if link != "" || !remote {
		return []byte(link), 0
	}
	out, err := s3client.Get(ctx, n.l.o.Client, &s3.GetObjectInput{Bucket: &n.l.o.Bucket, Key: &key})
	if err != nil {
		return nil, n.l.errno("readlink", key, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(io.LimitReader(out.Body, 4096))
	if err != nil {
		return nil, n.l.errno("readlink", key, err)
	}
	n.l.mu.Lock()
	n.e.link = string(data)
	n.l.mu.Unlock()
	return data, 0
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if _, ok := n.same(target); !ok {
		return nil, syscall.EXDEV
	}
	if n.ro() {
		return nil, syscall.EROFS
	}
	return nil, syscall.EPERM // objects have no hard links
}

// removeLocked takes c out of its directory and queues the delete of its
// key.
func (n *node) removeLocked(c *ent) string {
	key := n.l.key(c)
	n.l.tombs[key] = time.Time{}
	delete(n.e.children, c.name)
	c.gone = true
	n.e.mtime = time.Now()
	n.e.ctime, c.ctime = n.e.mtime, n.e.mtime
	if c.data != nil && c.opens == 0 {
		c.data.Drop()
		c.data = nil
	}
	return key
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := n.changing(ctx); errno != 0 {
		return errno
	}
	n.l.mu.Lock()
	c := n.e.children[name]
	if c == nil {
		n.l.mu.Unlock()
		return syscall.ENOENT
	}
	if c.isDir() {
		n.l.mu.Unlock()
		return syscall.EISDIR
	}
	key := n.removeLocked(c)
	n.l.mu.Unlock()
	n.l.enqueueDel(key)
	return 0
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := n.changing(ctx); errno != 0 {
		return errno
	}
	n.l.mu.Lock()
	c := n.e.children[name]
	n.l.mu.Unlock()
	if c == nil {
		return syscall.ENOENT
	}
	if !c.isDir() {
		return syscall.ENOTDIR
	}
	if errno := n.l.loadDir(ctx, c); errno != 0 {
		return errno
	}
	n.l.mu.Lock()
	if len(c.children) > 0 {
		n.l.mu.Unlock()
		return syscall.ENOTEMPTY
	}
	if n.e.children[name] != c {
		n.l.mu.Unlock()
		return syscall.ENOENT
	}
	key := n.removeLocked(c)
	n.l.mu.Unlock()
	n.l.enqueueDel(key)
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	n.l.q.touch()
	np, ok := n.same(newParent)
	if !ok {
		return syscall.EXDEV
	}
	if n.ro() {
		return syscall.EROFS
	}
	if flags&^uint32(1) != 0 { // only RENAME_NOREPLACE
		return syscall.EINVAL
	}
	for _, d := range []*node{n, np} {
		if errno := n.l.loadDir(ctx, d.e); errno != 0 {
			return errno
		}
	}
	l := n.l
	l.mu.Lock()
	c := n.e.children[name]
	if c == nil {
		l.mu.Unlock()
		return syscall.ENOENT
	}
	old := np.e.children[newName]
	if old == c {
		l.mu.Unlock()
		return 0
	}
	if old != nil {
		switch {
		case flags&1 != 0:
			l.mu.Unlock()
			return syscall.EEXIST
		case c.isDir() && !old.isDir():
			l.mu.Unlock()
			return syscall.ENOTDIR
		case !c.isDir() && old.isDir():
			l.mu.Unlock()
			return syscall.EISDIR
		}
	}
	for p := np.e; p != nil; p = p.parent {
		if p == c {
			l.mu.Unlock()
			return syscall.EINVAL // into itself
		}
	}
	if l.keyTooLongLocked(np.e, newName, longestBelowLocked(c)) {
		l.mu.Unlock()
		return syscall.ENAMETOOLONG
	}
	fromKey := l.key(c)
	dir := c.isDir()
	clean := !c.dirty && c.remote && !dir
	l.mu.Unlock()

	if old != nil && old.isDir() {
		if errno := l.loadDir(ctx, old); errno != 0 {
			return errno
		}
		l.mu.Lock()
		full := len(old.children) > 0
		l.mu.Unlock()
		if full {
			return syscall.ENOTEMPTY
		}
	}

	// Server side first, so a failure leaves the tree as it was. What
	// is queued at either end lands first: at the source, so that the
	// copy takes it; at the destination (the delete left by a rename
	// away from there, say), so that it cannot land after the copy and
	// undo it.
	l.mu.Lock()
	toKey := l.key(np.e) + newName
	l.mu.Unlock()
	if dir {
		toKey += "/"
	}
	if dir || clean {
		for _, k := range []string{fromKey, toKey} {
			if err := l.q.flush(ctx, k, true); err != nil {
				return l.errno("rename", k, err)
			}
		}
	}
	if dir {
		if err := l.moveKeys(ctx, fromKey, toKey); err != nil {
			return l.errno("rename", fromKey, err)
		}
	} else if clean {
		if _, err := l.o.Client.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &l.o.Bucket, Key: &toKey, CopySource: aws.String(s3client.CopySource(l.o.Bucket, fromKey))}); err != nil {
			return l.errno("rename", fromKey, err)
		}
	}

	l.mu.Lock()
	if n.e.children[name] != c {
		l.mu.Unlock()
		return syscall.ENOENT // raced with another change
	}
	if old = np.e.children[newName]; old != nil {
		// Its key is overwritten: by the copy, or by c's upload.
		np.removeLocked(old)
		if dir || clean {
			delete(l.tombs, toKey) // the copy is there already
		}
	}
	delete(n.e.children, name)
	c.name, c.parent = newName, np.e
	np.e.children[newName] = c
	now := time.Now()
	c.changed = now
	n.e.mtime, np.e.mtime = now, now
	n.e.ctime, np.e.ctime, c.ctime = now, now, now
	wasRemote := c.remote
	queuePut := !dir && (!clean || c.metaDirty) && c.opens == 0
	if !dir && !clean {
		c.remote = false // the new key has no object yet
	}
	l.mu.Unlock()

	if !dir && (clean || wasRemote) {
		l.enqueueDel(fromKey)
	}
	if queuePut {
		l.enqueuePut(c, l.o.WriteBack)
	}
	return 0
}

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

// handle is an open file: it tracks sequential reads for readahead.
type handle struct {
	n *node
	// pt is the cache file the kernel uses directly (passthrough), held
	// until release; ptWrite if it may write it.
	pt      *cache.File
	ptWrite bool

	mu     sync.Mutex
	next   int64 // GUARDED_BY(mu): the end of the furthest read so far
	window int64 // GUARDED_BY(mu): readahead, grown while reads are sequential
}

var (
	_ = (gofs.FileReader)((*handle)(nil))
	_ = (gofs.FileWriter)((*handle)(nil))
	_ = (gofs.FileReleaser)((*handle)(nil))
	_ = (gofs.FileFsyncer)((*handle)(nil))
	_ = (gofs.FileGetattrer)((*handle)(nil))
)

const (
	maxReadahead = 128 << 20
	seqSlack     = 4 << 20
)

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	l, e := h.n.l, h.n.e
	end := off + int64(len(dest))
	// The kernel reads ahead several requests at once, so they arrive
	// a little out of order: near the furthest read so far counts as
	// sequential.
	h.mu.Lock()
	if d := off - h.next; h.next > 0 && d > -seqSlack && d < seqSlack {
		h.window = min(max(h.window*2, 2*cache.ChunkSize), maxReadahead)
	} else if off != 0 {
		h.window = 0
	}
	h.next = max(h.next, end)
	if off == 0 {
		h.next = end
	}
	window := h.window
	h.mu.Unlock()
	for try := range 4 {
		l.mu.Lock()
		f, errno := l.dataLocked(e)
		l.mu.Unlock()
		if errno != 0 {
			return nil, errno
		}
		size := f.Size()
		n, ok, err := f.ReadAt(dest, off)
		if errors.Is(err, cache.ErrDropped) {
			continue // the object changed: read the new one
		}
		if err != nil {
			return nil, l.errno("read", l.keyOf(e), err)
		}
		ra := min(end+window, size)
		if try == 0 {
			if ok {
				l.hits.Add(1)
			} else {
				l.misses.Add(1)
			}
		}
		if ok {
			if window > 0 && ra > end {
				l.readahead(ctx, e, f, end, ra)
			}
			return fuse.ReadResultData(dest[:n]), 0
		}
		if window > 0 && ra > off {
			// Ask for the readahead along with what is needed now.
			l.readahead(ctx, e, f, off, ra)
		}
		if err := l.fill(ctx, e, f, off/cache.ChunkSize, (min(end, size)-1)/cache.ChunkSize, true); err != nil {
			return nil, l.errno("read", l.keyOf(e), err)
		}
	}
	return nil, syscall.EIO
}

// readahead starts fetching [off, end) of e in the background, in whole
// maxFetch-aligned blocks, so that a growing window asks for a few large
// ranges rather than many small ones.
func (l *Live) readahead(ctx context.Context, e *ent, f *cache.File, off, end int64) {
	const blk = maxFetch / cache.ChunkSize
	first, last := off/cache.ChunkSize, (end-1)/cache.ChunkSize
	first -= first % blk
	last += blk - 1 - last%blk
	if n := (f.Size() + cache.ChunkSize - 1) / cache.ChunkSize; last >= n {
		last = n - 1
	}
	l.fill(ctx, e, f, first, last, false)
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	l, e := h.n.l, h.n.e
	// An fsync while the file is open uploads it and makes it clean:
	// writing again needs it dirty again.
	if errno := l.writable(ctx, e, false); errno != 0 {
		return 0, errno
	}
	l.mu.Lock()
	f := e.data
	l.mu.Unlock()
	n, err := f.WriteAt(data, off)
	l.mu.Lock()
	e.gen++
	e.ctime = time.Now()
	l.mu.Unlock()
	if err != nil {
		return uint32(n), l.errno("write", "", err)
	}
	return uint32(n), 0
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.n.Getattr(ctx, nil, out)
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.n.l.fsync(ctx, h.n.e)
}

// Release queues the upload of a changed file once its last handle closes.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.n.l.q.touch()
	l, e := h.n.l, h.n.e
	l.mu.Lock()
	e.opens--
	if h.pt != nil {
		h.pt.Unhold()
		e.ptOpens--
		if h.ptWrite {
			// The kernel wrote the cache file directly.
			e.ptWriters--
			e.gen++
		}
		if e.ptOpens == 0 {
			if e.ptData != e.data {
				e.ptData.Drop() // replaced while open (the object changed)
			}
			e.ptData = nil
		}
	}
	upload := e.opens == 0 && (e.dirty || e.metaDirty) && !e.gone
	if e.opens == 0 && e.gone && e.data != nil {
		e.data.Drop()
		e.data = nil
	}
	l.mu.Unlock()
	if upload {
		l.enqueuePut(e, l.o.WriteBack)
	}
	return 0
}
