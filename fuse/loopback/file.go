package loopback

import (
	"context"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// File is an open backing file. go-fuse's LoopbackFile does the I/O and
// offers the descriptor for passthrough; File keeps the descriptor for the
// node's calls and refuses what must not run with the daemon's privileges.
//
// Locks never reach it: amlfs leaves flock and POSIX record locks to the
// kernel's own lock manager on the FUSE inode (the mount does not ask for
// FUSE lock requests), which is ext4's behaviour exactly: a lock dies with
// the last descriptor of its holder, a waiter is interruptible, F_GETLK
// reports the holder's pid, and no descriptor the daemon or the kernel's
// passthrough keeps can hold one.
type File struct {
	*gofs.LoopbackFile
	fd int
	// writer is the backing inode this handle may write, counted in its
	// writers until Release (nil for a read-only handle), opened in the
	// directory of backing inode dir (Options.Writers).
	writer  *backing
	dir     uint64
	writers func(dir uint64, delta int)
	// of is the backing inode open, counted in its files until Release.
	of *backing
}

// newFile wraps the backing file fd, open with flags, of the inode b, in
// the directory of backing inode dir (0: not known).
func (r *Root) newFile(fd int, b *backing, flags uint32, dir uint64) *File {
	lf := gofs.NewLoopbackFile(fd).(*gofs.LoopbackFile)
	f := &File{LoopbackFile: lf, fd: fd, of: b}
	b.files.Add(1)
	if flags&writeFlags != 0 || flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		f.writer = b
		b.writers.Add(1)
		if f.writers = r.opts.Writers; f.writers != nil {
			f.dir = dir
			f.writers(dir, 1)
		}
	}
	return f
}

var _ = (gofs.FileReleaser)((*File)(nil))

// Release closes the backing file and stops counting it as a writer.
func (f *File) Release(ctx context.Context) syscall.Errno {
	errno := f.LoopbackFile.Release(ctx)
	if f.of != nil {
		f.of.files.Add(-1)
		f.of = nil
	}
	if f.writer != nil {
		f.writer.writers.Add(-1)
		f.writer = nil
		if f.writers != nil {
			f.writers(f.dir, -1)
		}
	}
	return errno
}

var _ = (gofs.FileIoctler)((*File)(nil))

// Ioctl refuses every ioctl: run by the daemon, one such as FS_IOC_SETFLAGS
// (chattr +i) would act with root's capabilities for any caller.
func (f *File) Ioctl(ctx context.Context, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}

var _ = (gofs.NodeAllocater)((*Node)(nil))

func (n *Node) Allocate(ctx context.Context, f gofs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if n.root.opts.ReadOnly {
		return syscall.EROFS
	}
	fh, ok := f.(*File)
	if !ok {
		return syscall.EBADF
	}
	return fh.Allocate(ctx, off, size, mode)
}

var _ = (gofs.NodeCopyFileRanger)((*Node)(nil))

func (n *Node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	if n.root.opts.ReadOnly {
		return 0, syscall.EROFS
	}
	if _, ok := n.sameTree(out.Operations()); !ok {
		return 0, syscall.EXDEV
	}
	in, ok1 := fhIn.(*File)
	o, ok2 := fhOut.(*File)
	if !ok1 || !ok2 {
		return 0, syscall.EBADF
	}
	i, j := int64(offIn), int64(offOut)
	c, err := unix.CopyFileRange(in.fd, &i, o.fd, &j, int(length), int(flags))
	return uint32(max(c, 0)), errnoOf(err)
}

// dirStream lists a backing directory, with the inode numbers the mount
// shows (the same as lookups give, tag and device mixed in). It opens the
// backing directory at its first use: where the kernel keeps listings
// (CacheListings), most opens of a directory read nothing, and cost no
// descriptor. A directory removed in between fails to list with ENOENT,
// as reading an open directory of ext4 that was removed since does.
type dirStream struct {
	n     *Node
	mix   uint64
	shown Shown // nil for none

	mu     sync.Mutex
	ds     dirFile       // GUARDED_BY(mu): nil until opened
	err    syscall.Errno // GUARDED_BY(mu): why it could not open
	closed bool          // GUARDED_BY(mu)
}

// DirHandle is what OpendirHandle returns: a stream of entries that is
// also the directory's file handle.
type DirHandle = dirFile

type dirFile interface {
	gofs.DirStream
	gofs.FileReaddirenter
	gofs.FileSeekdirer
	gofs.FileReleasedirer
	gofs.FileFsyncdirer
}

func (n *Node) openDir() (*dirStream, syscall.Errno) {
	// The node must still stand for an inode (go-fuse may reuse a
	// forgotten one).
	_, done, errno := n.fd()
	if errno != 0 {
		return nil, errno
	}
	done()
	dev := n.r.Load().b.key.dev
	return &dirStream{n: n, mix: n.root.mix(dev), shown: n.root.shownOn(dev)}, 0
}

// stream opens the backing directory on first use.
func (d *dirStream) stream() (dirFile, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ds != nil || d.err != 0 {
		return d.ds, d.err
	}
	if d.closed {
		return nil, syscall.EBADF
	}
	fd, done, errno := d.n.fd()
	if errno != 0 {
		d.err = errno
		return nil, errno
	}
	defer done()
	dfd, err := d.n.root.openFd(func() (int, error) { return unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0) })
	if err != nil {
		d.err = errnoOf(err)
		return nil, d.err
	}
	ds, errno := gofs.NewLoopbackDirStreamFd(dfd)
	if errno != 0 {
		unix.Close(dfd)
		d.err = errno
		return nil, errno
	}
	d.ds = ds.(dirFile)
	return d.ds, 0
}

// ino is the number to show for an entry's backing number.
func (d *dirStream) ino(ino uint64) uint64 {
	if d.shown != nil {
		ino = d.shown.DirIno(ino)
	}
	return ino ^ d.mix
}

func (d *dirStream) HasNext() bool {
	ds, errno := d.stream()
	return errno != 0 || ds.HasNext() // an error is the next "entry"
}

func (d *dirStream) Next() (fuse.DirEntry, syscall.Errno) {
	ds, errno := d.stream()
	if errno != 0 {
		return fuse.DirEntry{}, errno
	}
	e, errno := ds.Next()
	e.Ino = d.ino(e.Ino)
	return e, errno
}

func (d *dirStream) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	ds, errno := d.stream()
	if errno != 0 {
		return nil, errno
	}
	e, errno := ds.Readdirent(ctx)
	if e != nil {
		e.Ino = d.ino(e.Ino)
	}
	return e, errno
}

func (d *dirStream) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	ds, errno := d.stream()
	if errno != 0 {
		return errno
	}
	return ds.Seekdir(ctx, off)
}

// Close and Releasedir end the stream (go-fuse calls one of them once).
func (d *dirStream) Close() { d.Releasedir(context.Background(), 0) }

func (d *dirStream) Releasedir(ctx context.Context, flags uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.closed = true
	if d.ds != nil {
		d.ds.Releasedir(ctx, flags)
	}
}

func (d *dirStream) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	ds, errno := d.stream()
	if errno != 0 {
		return errno
	}
	return ds.Fsyncdir(ctx, flags)
}
