// Package local is the host-directory live mount (file:///host/dir): a
// go-fuse loopback over the directory, optionally read-only, whose kernel
// caches follow changes made on the host. Durability is the host
// directory's own; nothing here is part of workspace revisions.
//
// Host changes reach the mount two ways. Every directory the mount has
// looked into is watched with fsnotify (up to MaxWatches), and an event
// invalidates the kernel's entry for the name and the cached attributes
// and pages of the file. Beyond the watch limit, entries and attributes
// expire after Timeout (1 s by default). File bytes need neither: with
// passthrough the kernel reads the host file itself.
package local

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	amlfuse "github.com/amlfs/amlfs/fuse"
	"github.com/fsnotify/fsnotify"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Options configure a local provider.
type Options struct {
	Dir string
	RO  bool
	// Timeout is the kernel's entry and attribute cache time for this
	// mount (default 1 s): the bound on staleness where no watch is.
	Timeout time.Duration
	// MaxWatches bounds the directories watched (default 8192; negative:
	// none, so only Timeout bounds staleness).
	MaxWatches int
	Log        *slog.Logger
	// Tag (1 or more) sets this mount's inode number space apart from the
	// workspace's and other live mounts', even over the same host
	// directory: inode numbers get Tag in bits 48-63. The kernel and
	// go-fuse key inodes by number, so sharing one would merge nodes.
	Tag uint16
}

// Provider serves one host directory.
type Provider struct {
	opts    Options
	root    *node
	watcher *fsnotify.Watcher

	mu      sync.Mutex
	watched map[string]bool // GUARDED_BY(mu): absolute dirs
	full    bool            // GUARDED_BY(mu): the limit was hit (logged once)
	done    chan struct{}
}

// New checks the directory and builds the provider's root node.
func New(opts Options) (*Provider, error) {
	if opts.Timeout == 0 {
		opts.Timeout = time.Second
	}
	if opts.MaxWatches == 0 {
		opts.MaxWatches = 8192
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	fi, err := os.Stat(opts.Dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", opts.Dir)
	}
	lroot, err := gofs.NewLoopbackRoot(opts.Dir)
	if err != nil {
		return nil, err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("fsnotify: %w", err)
	}
	p := &Provider{opts: opts, watcher: w, watched: map[string]bool{}, done: make(chan struct{})}
	ln := lroot.(*gofs.LoopbackNode)
	// go-fuse numbers a loopback inode rot32(st.Dev) ^ rot32(root.Dev) ^
	// st.Ino; flipping bits 16-31 of root.Dev flips bits 48-63 of every
	// inode number of this mount.
	ln.RootData.Dev ^= uint64(opts.Tag) << 16
	p.root = &node{LoopbackNode: ln, p: p}
	ln.RootData.RootNode = p.root
	go p.watch()
	return p, nil
}

// Root is the node to graft at the mount's prefix.
func (p *Provider) Root() gofs.InodeEmbedder { return p.root }

// RootAttr is the stable identity of the root node.
func (p *Provider) RootAttr() (gofs.StableAttr, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(p.opts.Dir, &st); err != nil {
		return gofs.StableAttr{}, err
	}
	return gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: st.Ino ^ uint64(p.opts.Tag)<<48}, nil
}

// Health reports whether the host directory is reachable.
func (p *Provider) Health() error {
	fi, err := os.Stat(p.opts.Dir)
	if err == nil && !fi.IsDir() {
		err = fmt.Errorf("%s is not a directory", p.opts.Dir)
	}
	return err
}

// Close stops watching.
func (p *Provider) Close() error {
	err := p.watcher.Close()
	<-p.done
	return err
}

// watchDir starts watching abs, a directory the kernel now caches entries of.
func (p *Provider) watchDir(abs string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watched[abs] {
		return
	}
	if p.opts.MaxWatches < 0 {
		return
	}
	if len(p.watched) >= p.opts.MaxWatches {
		if !p.full {
			p.full = true
			p.opts.Log.Warn("local mount: watch limit reached; further directories rely on the cache timeout", "op", "watch", "path", p.opts.Dir, "maxWatches", p.opts.MaxWatches, "timeout", p.opts.Timeout)
		}
		return
	}
	if err := p.watcher.Add(abs); err != nil {
		p.opts.Log.Warn("local mount: watch", "op", "watch", "path", abs, "err", err)
		return
	}
	p.watched[abs] = true
}

func (p *Provider) watch() {
	defer close(p.done)
	for {
		select {
		case ev, ok := <-p.watcher.Events:
			if !ok {
				return
			}
			p.invalidate(ev)
		case err, ok := <-p.watcher.Errors:
			if !ok {
				return
			}
			// An overflow loses events; the cache timeout still
			// bounds how long an entry can stay stale.
			p.opts.Log.Warn("local mount: watch error", "op", "watch", "path", p.opts.Dir, "err", err)
		}
	}
}

// invalidate drops the kernel's cached entry for the event's name, and the
// attributes and pages of the file if the kernel knows it.
func (p *Provider) invalidate(ev fsnotify.Event) {
	rel, err := filepath.Rel(p.opts.Dir, ev.Name)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return
	}
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		p.mu.Lock()
		if p.watched[ev.Name] {
			delete(p.watched, ev.Name)
			p.watcher.Remove(ev.Name)
		}
		p.mu.Unlock()
	}
	parent := p.root.EmbeddedInode()
	parts := strings.Split(filepath.ToSlash(rel), "/")
	for _, name := range parts[:len(parts)-1] {
		if parent = parent.GetChild(name); parent == nil {
			return // the kernel knows nothing below: nothing cached
		}
	}
	name := parts[len(parts)-1]
	if child := parent.GetChild(name); child != nil && !ev.Has(fsnotify.Create) {
		child.NotifyContent(0, 0)
	}
	if !ev.Has(fsnotify.Write) {
		parent.NotifyEntry(name)
	}
}

// Refresh drops what the kernel caches of rel (a path below the mount's
// root; "" for all of it) and of everything beneath it that the kernel
// knows: entries, attributes and pages. The next access reads the host.
func (p *Provider) Refresh(rel string) error {
	amlfuse.Invalidate(p.root.EmbeddedInode(), rel)
	return nil
}

// node is the loopback node of a local mount.
type node struct {
	*gofs.LoopbackNode
	p *Provider
}

var _ = (gofs.NodeWrapChilder)((*node)(nil))

func (n *node) WrapChild(ctx context.Context, ops gofs.InodeEmbedder) gofs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*gofs.LoopbackNode), p: n.p}
}

// abs is the node's host path.
func (n *node) abs() string {
	return filepath.Join(n.p.opts.Dir, n.Path(n.p.root.EmbeddedInode()))
}

func (n *node) entry(out *fuse.EntryOut) {
	out.SetEntryTimeout(n.p.opts.Timeout)
	out.SetAttrTimeout(n.p.opts.Timeout)
}

// Same reports whether other belongs to this provider (rename and link
// across providers give EXDEV).
func (n *node) same(other gofs.InodeEmbedder) (*gofs.LoopbackNode, bool) {
	o, ok := other.(*node)
	if !ok || o.p != n.p {
		return nil, false
	}
	return o.LoopbackNode, true
}

var _ = (gofs.NodeLookuper)((*node)(nil))

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	n.p.watchDir(n.abs())
	ch, errno := n.LoopbackNode.Lookup(ctx, name, out)
	if errno == 0 || errno == syscall.ENOENT {
		// A miss is cached for Timeout too (go-fuse keeps a nonzero
		// timeout on ENOENT), not for the workspace's hour.
		n.entry(out)
	}
	return ch, errno
}

var _ = (gofs.NodeOpendirHandler)((*node)(nil))

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	n.p.watchDir(n.abs())
	return n.LoopbackNode.OpendirHandle(ctx, flags)
}

var _ = (gofs.NodeGetattrer)((*node)(nil))

func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	errno := n.LoopbackNode.Getattr(ctx, f, out)
	out.SetTimeout(n.p.opts.Timeout)
	return errno
}

const writeFlags = syscall.O_WRONLY | syscall.O_RDWR | syscall.O_TRUNC | syscall.O_APPEND

var _ = (gofs.NodeOpener)((*node)(nil))

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.p.opts.RO && flags&writeFlags != 0 {
		return nil, 0, syscall.EROFS
	}
	return n.LoopbackNode.Open(ctx, flags)
}

func (n *node) ro() bool { return n.p.opts.RO }

var _ = (gofs.NodeCreater)((*node)(nil))

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.ro() {
		return nil, nil, 0, syscall.EROFS
	}
	ch, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno == 0 {
		n.entry(out)
	}
	return ch, fh, fl, errno
}

var _ = (gofs.NodeMkdirer)((*node)(nil))

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ro() {
		return nil, syscall.EROFS
	}
	ch, errno := n.LoopbackNode.Mkdir(ctx, name, mode, out)
	if errno == 0 {
		n.entry(out)
	}
	return ch, errno
}

var _ = (gofs.NodeMknoder)((*node)(nil))

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ro() {
		return nil, syscall.EROFS
	}
	return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
}

var _ = (gofs.NodeSymlinker)((*node)(nil))

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ro() {
		return nil, syscall.EROFS
	}
	return n.LoopbackNode.Symlink(ctx, target, name, out)
}

var _ = (gofs.NodeLinker)((*node)(nil))

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ro() {
		return nil, syscall.EROFS
	}
	t, ok := n.same(target)
	if !ok {
		return nil, syscall.EXDEV
	}
	return n.LoopbackNode.Link(ctx, t, name, out)
}

var _ = (gofs.NodeUnlinker)((*node)(nil))

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Unlink(ctx, name)
}

var _ = (gofs.NodeRmdirer)((*node)(nil))

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Rmdir(ctx, name)
}

var _ = (gofs.NodeRenamer)((*node)(nil))

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	np, ok := n.same(newParent)
	if !ok {
		return syscall.EXDEV
	}
	return n.LoopbackNode.Rename(ctx, name, np, newName, flags)
}

var _ = (gofs.NodeSetattrer)((*node)(nil))

func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	errno := n.LoopbackNode.Setattr(ctx, f, in, out)
	out.SetTimeout(n.p.opts.Timeout)
	return errno
}

var _ = (gofs.NodeSetxattrer)((*node)(nil))

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}

var _ = (gofs.NodeRemovexattrer)((*node)(nil))

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Removexattr(ctx, attr)
}

var _ = (gofs.NodeAllocater)((*node)(nil))

func (n *node) Allocate(ctx context.Context, f gofs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	if a, ok := f.(gofs.FileAllocater); ok {
		return a.Allocate(ctx, off, size, mode)
	}
	return syscall.ENOTSUP
}

var _ = (gofs.NodeCopyFileRanger)((*node)(nil))

func (n *node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, len uint64, flags uint64) (uint32, syscall.Errno) {
	if n.ro() {
		return 0, syscall.EROFS
	}
	if _, ok := out.Operations().(*node); !ok {
		return 0, syscall.EXDEV
	}
	return n.LoopbackNode.CopyFileRange(ctx, fhIn, offIn, out, fhOut, offOut, len, flags)
}

var _ = (gofs.NodeTmpfiler)((*node)(nil))

func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.ro() {
		return nil, nil, 0, syscall.EROFS
	}
	return n.LoopbackNode.Tmpfile(ctx, flags, mode, out)
}
