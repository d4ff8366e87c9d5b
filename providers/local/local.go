// Package local is the host-directory live mount (file:///host/dir): the
// handle-based loopback (fuse/loopback) over the directory, optionally read-only, whose kernel
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

	"github.com/amlfs/amlfs/fuse/loopback"
	"github.com/amlfs/amlfs/fuse/posix"
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
	// A miss is cached for Timeout too, not for the workspace's hour.
	p := &Provider{opts: opts, watched: map[string]bool{}, done: make(chan struct{})}
	lroot, err := loopback.New(opts.Dir, loopback.Options{ReadOnly: opts.RO, Tag: opts.Tag, EntryTimeout: opts.Timeout, AttrTimeout: opts.Timeout, Shared: true,
		Wrap: func(ln *loopback.Node) gofs.InodeEmbedder { return &node{Node: ln, p: p} }})
	if err != nil {
		return nil, err
	}
	if p.watcher, err = fsnotify.NewWatcher(); err != nil {
		return nil, fmt.Errorf("fsnotify: %w", err)
	}
	p.root = &node{Node: lroot, p: p}
	go p.watch()
	return p, nil
}

// Root is the node to graft at the mount's prefix.
func (p *Provider) Root() gofs.InodeEmbedder { return p.root }

// RootAttr is the stable identity of the root node.
func (p *Provider) RootAttr() (gofs.StableAttr, error) {
	return p.root.StableAttrOf()
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
	if err != nil || strings.HasPrefix(rel, "..") {
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
	if rel == "." {
		return // the root itself: rerooted at the next lookup in it
	}
	parent := p.root.EmbeddedInode()
	parts := strings.Split(filepath.ToSlash(rel), "/")
	for _, name := range parts[:len(parts)-1] {
		if parent = parent.GetChild(name); parent == nil {
			return // the kernel knows nothing below: nothing cached
		}
	}
	name := parts[len(parts)-1]
	if child := parent.GetChild(name); child != nil {
		if sa, err := parent.Operations().(*node).ChildAttr(name); err == nil && sa == child.StableAttr() {
			// (Every node of the tree is a *node: WrapChild.)
			// The name still names the inode the kernel knows (a
			// change made through this mount, or a chmod or write on
			// the host): drop its attributes and pages, not its entry.
			// Dropping the entry of a directory unhashes it, and a
			// process whose working directory it is then gets ENOENT
			// from getcwd.
			child.NotifyContent(0, 0)
			return
		}
		if !ev.Has(fsnotify.Create) {
			child.NotifyContent(0, 0)
		}
	}
	if !ev.Has(fsnotify.Write) {
		parent.NotifyEntry(name)
	}
}

// Refresh drops what the kernel caches of rel (a path below the mount's
// root; "" for all of it) and of everything beneath it that the kernel
// knows: entries, attributes and pages. The next access reads the host.
func (p *Provider) Refresh(rel string) error {
	posix.Invalidate(p.root.EmbeddedInode(), rel)
	return nil
}

// node is the loopback node of a local mount: the handle-based loopback,
// with every directory the kernel looks into watched.
type node struct {
	*loopback.Node
	p *Provider
}

// abs is the node's host path, for the watch only: every file operation
// goes by handle.
func (n *node) abs() string {
	return filepath.Join(n.p.opts.Dir, n.Path(n.p.root.EmbeddedInode()))
}

var _ = (gofs.NodeLookuper)((*node)(nil))

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	n.checkRoot()
	n.p.watchDir(n.abs())
	return n.Node.Lookup(ctx, name, out)
}

// checkRoot, on the mount's root, follows the host directory if it is now
// another one (removed and made again, or mounted over): the loopback holds
// the directory by handle, and would otherwise serve the old one forever.
func (n *node) checkRoot() {
	if n != n.p.root {
		return
	}
	moved, err := n.Reroot(n.p.opts.Dir)
	if err != nil || !moved {
		return
	}
	n.p.opts.Log.Info("local mount: host directory replaced; following it", "op", "reroot", "path", n.p.opts.Dir)
	n.p.mu.Lock()
	delete(n.p.watched, n.p.opts.Dir)
	n.p.mu.Unlock()
	// Not inline: the kernel holds this directory locked for the
	// request being served, and an invalidation waits for that lock.
	go posix.Invalidate(n.EmbeddedInode(), "")
}

var _ = (gofs.NodeOpendirHandler)((*node)(nil))

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	n.checkRoot()
	n.p.watchDir(n.abs())
	return n.Node.OpendirHandle(ctx, flags)
}
