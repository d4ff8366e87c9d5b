package s3live

import (
	"context"
	"io"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/amlfs/amlfs/s3client"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/hanwen/go-fuse/v2/fuse"
)

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
