// Package fuse serves the workspace's working directory through go-fuse. It
// is a thin adapter: the handle-based loopback (fuse/loopback) does the
// POSIX work over the per-mount working directory, and this package adds
// the mount options, the checkpoint barrier, change tracking, lazy restore
// and kernel cache invalidation.
package fuse

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/fuse/loopback"
	"github.com/amlfs/amlfs/fuse/posix"
	"github.com/amlfs/amlfs/mount/mountpoint"
)

// Options configure a mount.
type Options struct {
	// Dir is the backing working directory.
	Dir string
	// ControlSocket, if set, is what the root answers for the virtual
	// xattr ControlXattr: how a client with nothing but the mountpoint
	// (an MCP server started with an empty environment) finds the daemon.
	ControlSocket string
	// FsName is shown as the source in /proc/mounts.
	FsName string
	// MountOptions are extra -o options (allow_other, ro, default_permissions, ...).
	MountOptions []string
	// Timeout is the kernel's entry and attribute cache time. amlfs is the
	// only writer of the working directory, so it can be long; amlfs
	// invalidates what it changes itself.
	Timeout time.Duration
	Debug   bool
	Log     *slog.Logger
	// Content, if set, is asked to make a file's bytes present before the
	// file is opened or resized, and a directory's entries present before
	// anything looks inside or changes it (lazy restore).
	Content Content
	// Live are the live mounts grafted onto the tree.
	Live []Live
	// ReadOnlyRoot refuses every change outside the live mounts with
	// EROFS (--store none: the root only lists the mounts).
	ReadOnlyRoot bool
	// Ops, if set, is told of every request served, for metrics.
	Ops OpObserver
	// Shown, if set, is the stat data shown for restored files, which
	// may differ from the working directory's (fuse/shown).
	Shown loopback.Shown
}

// Live is a provider's tree grafted at a path. The workspace directory at
// that path (made if missing) is hidden beneath it.
type Live struct {
	Rel  string // the path below the root, "data" or "mnt/data"
	Root gofs.InodeEmbedder
	Attr gofs.StableAttr
}

// Content makes a file's bytes present in the working directory.
type Content interface {
	// Fill blocks until the file that fd (an O_PATH descriptor of it)
	// refers to holds its real bytes.
	Fill(ctx context.Context, fd int) error
	// EnsureDir blocks until the directory at rel holds all its entries.
	EnsureDir(ctx context.Context, rel string) error
	// Active is a cheap check, made before every call above: false once
	// nothing is left to fetch or populate.
	Active() bool
}

// FS is a mounted workspace.
type FS struct {
	control    string // Options.ControlSocket
	server     *fuse.Server
	mnt        *mountpoint.Mount
	byPath     bool // fusermount3 mounted it, by path, and unmounts it
	root       *node
	log        *slog.Logger
	dir        string
	mountpoint string
	detached   atomic.Bool // Unmount had to detach a busy mount

	// barrier: mutations hold the read side; a checkpoint holds the write
	// side while it snapshots, so it sees a tree no FUSE call is changing.
	barrier sync.RWMutex
	changes atomic.Int64 // mutations served since mount
	dirs    dirChanges   // the directories changed since the last Mark
	content Content

	liveMu    sync.Mutex
	live      map[string]*liveMount // by Rel
	liveNames map[string]bool       // the last segment of each Rel
	liveDirs  map[string]bool       // the directory of each Rel ("" for the root)
}

type liveMount struct {
	Live
	inode *gofs.Inode // GUARDED_BY(FS.liveMu): once grafted
}

// DefaultTimeout is the kernel entry/attr cache time.
const DefaultTimeout = time.Hour

// Mount serves opts.Dir on the directory at.
func Mount(at *mountpoint.Dir, opts Options) (*FS, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	f := &FS{control: opts.ControlSocket, log: opts.Log, dir: opts.Dir, mountpoint: at.Path(), content: opts.Content,
		live: map[string]*liveMount{}, liveNames: map[string]bool{}, liveDirs: map[string]bool{}}
	for _, l := range opts.Live {
		// The workspace directory the live mount covers must exist so
		// that listings show it.
		if err := os.MkdirAll(filepath.Join(opts.Dir, filepath.FromSlash(l.Rel)), 0o755); err != nil {
			return nil, err
		}
		f.live[l.Rel] = &liveMount{Live: l}
		f.liveNames[path.Base(l.Rel)] = true
		dir := path.Dir(l.Rel)
		if dir == "." {
			dir = ""
		}
		f.liveDirs[dir] = true
	}
	// amlfs is the only writer of the working directory, so the kernel
	// may cache entries, attributes and listings long; amlfs invalidates
	// what it changes itself (Changed). go-fuse would leave a SETATTR
	// reply's time at 0, which makes the kernel ask again right after
	// every chmod.
	lroot, err := loopback.New(opts.Dir, loopback.Options{ReadOnly: opts.ReadOnlyRoot, EntryTimeout: opts.Timeout, AttrTimeout: opts.Timeout, Shown: opts.Shown, CacheListings: true,
		Wrap: func(ln *loopback.Node) gofs.InodeEmbedder { return &node{Node: ln, fs: f} }, Writers: f.writers})
	if err != nil {
		return nil, err
	}
	f.root = &node{Node: lroot, fs: f}

	// With no live mount grafted on, no one else changes the tree, and
	// the kernel may keep every listing with no OPENDIR asked (openless).
	// A live mount's listings change behind the kernel: then only the
	// workspace's directories keep theirs (loopback CacheListings).
	server, mnt, byPath, err := serve(at, f.root, nil, opts, len(opts.Live) == 0, nil)
	if err != nil {
		return nil, err
	}
	f.server, f.mnt, f.byPath = server, mnt, byPath
	return f, nil
}

// serve mounts root on the directory at with the options every amlfs FUSE
// mount shares; keepListings serves it openless (the kernel keeps every
// listing: only for a tree no one else changes); tune, if set, adjusts
// them for one provider. As root the mount is made on at's descriptor
// (mountFD), never on its path; a daemon that is not root mounts through
// fusermount3, which takes a path.
func serve(at *mountpoint.Dir, root gofs.InodeEmbedder, rootAttr *gofs.StableAttr, opts Options, keepListings bool, tune func(*fuse.MountOptions)) (server *fuse.Server, mnt *mountpoint.Mount, byPath bool, err error) {
	mp := at.Path()
	timeout := opts.Timeout
	mo := fuse.MountOptions{
		FsName: opts.FsName,
		Name:   "amlfs",
		// As root, mount(2) and umount2(2) directly, never through
		// fusermount: go-fuse's fallback to it would turn an EBUSY
		// unmount into "no fusermount" where it is not installed.
		DirectMountStrict: os.Geteuid() == 0,
		// Locks stay with the kernel's own lock manager on the FUSE
		// inode: ext4's semantics exactly (see loopback.File).
		EnableLocks:   false,
		MaxWrite:      1 << 20,
		MaxReadAhead:  1 << 20,
		Debug:         opts.Debug,
		Logger:        log.New(slogWriter{opts.Log}, "", 0),
		DisableXAttrs: false,
		MaxBackground: 64,
		// With KILLPRIV_V2 the kernel stops asking for
		// security.capability before every write and refreshing
		// attributes before every chown; amlfs clears setuid/setgid on
		// the FATTR_KILL_SUIDGID the kernel sends instead (node.go).
		ExtraCapabilities:    fuse.CAP_HANDLE_KILLPRIV_V2,
		EnableSymlinkCaching: true,
	}
	var owner ownerOptions
	for _, o := range opts.MountOptions {
		if ok, err := owner.parse(o); ok {
			if err != nil {
				return nil, nil, false, err
			}
			continue
		}
		switch o {
		case "allow_other":
			mo.AllowOther = true
		case "":
		default:
			mo.Options = append(mo.Options, o)
		}
	}
	if owner.set() {
		mo.DisableReadDirPlus = true
	}
	if tune != nil {
		tune(&mo)
	}
	gopts := &gofs.Options{
		MountOptions:    mo,
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &timeout,
		Logger:          mo.Logger,
		// A mode of 0000 is shown as 0000, not as go-fuse's 0644.
		NullPermissions: true,
		RootStableAttr:  rootAttr,
	}
	// gofs.Mount, with the request timing wrapped around the node layer.
	raw := gofs.NewNodeFS(root, gopts)
	if keepListings {
		raw = &openless{RawFileSystem: raw}
	}
	if owner.set() {
		raw = &owned{RawFileSystem: raw, o: owner}
	}
	if opts.Ops != nil {
		raw = &metered{RawFileSystem: raw, obs: opts.Ops}
	}
	target := mp
	if canMountFD() {
		dev, m, err := mountFD(at, &gopts.MountOptions)
		switch {
		case err == nil:
			// go-fuse serves the /dev/fuse descriptor as its "magic"
			// mountpoint: it neither mounts nor unmounts.
			mnt, target = m, fmt.Sprintf("/dev/fd/%d", dev)
			gopts.MountOptions.DirectMount, gopts.MountOptions.DirectMountStrict = false, false
		case isPerm(err):
			// Root without CAP_SYS_ADMIN (a container): fusermount3 may
			// still mount for us, by path.
			opts.Log.Info("mounting by descriptor refused; trying fusermount3", "op", "mount", "path", mp, "err", err)
			gopts.MountOptions.DirectMountStrict = false
		default:
			return nil, nil, false, fmt.Errorf("mount %s: %w", mp, err)
		}
	}
	server, err = fuse.NewServer(raw, target, &gopts.MountOptions)
	if err != nil {
		if mnt != nil {
			mnt.Unmount(true)
			mnt.Close()
		}
		if strings.Contains(err.Error(), "fusermount") && errors.Is(err, os.ErrNotExist) {
			return nil, nil, false, fmt.Errorf("mount %s: %w (mounting as a user other than root needs the setuid fusermount3 of the fuse3 package: apt-get install fuse3)", mp, err)
		}
		return nil, nil, false, fmt.Errorf("mount %s: %w", mp, err)
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		if mnt != nil {
			mnt.Unmount(true)
			mnt.Close()
		} else {
			server.Unmount()
		}
		return nil, nil, false, fmt.Errorf("mount %s: %w", mp, err)
	}
	if mnt == nil {
		// fusermount3 mounted it by path: know it by its id from now on,
		// and have fusermount3 unmount it.
		byPath = true
		if mnt, err = at.Found(); err != nil {
			server.Unmount()
			return nil, nil, false, fmt.Errorf("mount %s: %w", mp, err)
		}
	} else {
		pollHack(mnt, opts.Log)
	}
	raiseReadahead(mnt, mo.MaxReadAhead, opts.Log)
	return server, mnt, byPath, nil
}

// pollHack does what go-fuse's WaitMount does for a mount it made itself,
// through the mount's root rather than its path: it opens go-fuse's own
// poll file and polls it, so that the kernel learns at once that this
// server does not support POLL (a poll through Go's runtime poller on a
// file of the mount could otherwise deadlock the daemon).
func pollHack(mnt *mountpoint.Mount, log *slog.Logger) {
	root, err := mnt.Root()
	if err != nil {
		return
	}
	defer root.Close()
	fd, err := unix.Openat(int(root.Fd()), ".go-fuse-epoll-hack", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		log.Debug("poll hack", "err", err)
		return
	}
	unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	unix.Close(fd)
}

// MountLive serves one live mount alone, on its own FUSE connection, at
// mountpoint (native serving: the workspace around it is a bind mount).
// noXattr answers ENOSYS to every xattr request, so that the kernel stops
// asking (an S3 mount has none): two round trips fewer per file of ls -l.
func MountLive(at *mountpoint.Dir, l Live, noXattr bool, opts Options) (*FS, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	// The root shows the provider's own root number, tag included, as in
	// the composite: a walk that tells mounts apart by the tag (the tool
	// API's delete) sees one mount from the root down, not a boundary
	// below the root.
	attr := l.Attr
	server, mnt, byPath, err := serve(at, l.Root, &attr, opts, false, func(mo *fuse.MountOptions) { mo.DisableXAttrs = noXattr })
	if err != nil {
		return nil, err
	}
	return &FS{server: server, mnt: mnt, byPath: byPath, log: opts.Log, mountpoint: at.Path()}, nil
}

// raiseReadahead lifts the kernel's readahead for the mount to kb bytes.
// FUSE caps it at the 128 KiB default whatever the daemon asks, so reads
// that reach amlfs (a live mount's uncached data) come 128 KiB at a time;
// as root, amlfs sets the mount's bdi read_ahead_kb, as an admin would.
// Best effort: without it reads are only smaller.
func raiseReadahead(mnt *mountpoint.Mount, bytes int, log *slog.Logger) {
	root, err := mnt.Root()
	if err != nil {
		return
	}
	defer root.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(root.Fd()), &st); err != nil {
		return
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(p, []byte(fmt.Sprint(bytes/1024)), 0o644); err != nil {
		log.Debug("could not raise the mount's readahead", "path", p, "err", err)
	}
}

// Passthrough reports whether the kernel granted FUSE passthrough.
func (f *FS) Passthrough() bool {
	return f.server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH != 0
}

// Changes returns the number of mutating operations served so far.
func (f *FS) Changes() int64 { return f.changes.Load() }

// Clean says which directories (by backing inode) are unchanged since
// the last Mark (dirs.go); nil when that is not known.
func (f *FS) Clean() func(ino uint64) bool { return f.dirs.clean() }

// Freeze blocks new mutations through FUSE until the returned function is
// called. Writes the kernel passes straight to the backing file
// (passthrough, or mmap pages already dirty) are not held back.
func (f *FS) Freeze() (thaw func()) {
	f.barrier.Lock()
	return f.barrier.Unlock
}

// Touch is a no-op: every change through the mount is a FUSE request
// that Changes counts, and a tool call made on the tree itself counts in
// Hold.
func (f *FS) Touch() {}

// Hold holds a checkpoint back (Freeze) while a change is made, and
// counts it: each change through the mount, and each the daemon makes to
// the working directory itself (a tool call).
func (f *FS) Hold() (release func()) {
	f.barrier.RLock()
	f.changes.Add(1)
	f.dirs.lose() // which directories is not known
	return f.barrier.RUnlock
}

// hold is Hold for a change through the mount in the directories dirs
// (backing inodes; 0: not known).
func (f *FS) hold(dirs ...uint64) (release func()) {
	f.barrier.RLock()
	f.changes.Add(1)
	f.dirs.touch(dirs...)
	return f.barrier.RUnlock
}

// writers counts a handle that may write, opened in directory dir, as it
// opens (delta 1) and closes (-1). Its close is a change: what it wrote
// through a shared mapping made none.
func (f *FS) writers(dir uint64, delta int) {
	f.dirs.writers(dir, delta)
	if delta < 0 {
		f.changes.Add(1)
	}
}

// Writers returns the backing inodes of the files open for writing
// through the mount, once the kernel wrote back the pages they dirtied:
// until then a shared mapping's writes are in the mount's page cache
// only, not in the working tree a save reads.
func (f *FS) Writers() map[uint64]bool {
	ws := f.root.Tree().Writers()
	if len(ws) == 0 || f.mnt == nil {
		return ws
	}
	top, err := f.mnt.Root()
	if err != nil {
		return ws
	}
	defer top.Close()
	// syncfs takes no O_PATH descriptor: the root is opened again.
	d, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", top.Fd()), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		f.log.Warn("open the mount to write back its dirty pages", "op", "syncfs", "err", err)
		return ws
	}
	defer unix.Close(d)
	if err := unix.Syncfs(d); err != nil {
		f.log.Warn("write back the mount's dirty pages", "op", "syncfs", "err", err)
	}
	return ws
}

// Writing reports whether the working-tree file fd refers to is open for
// writing through the mount: its latest bytes may be in the kernel's page
// cache of the mount's inode still (a shared mapping's), not in the file.
func (f *FS) Writing(fd int) bool { return f.root.Tree().Writing(fd) }

// Changed drops what the kernel caches of the entry at rel (relative to
// the root), which the daemon changed in the working directory itself:
// its entry in its directory, and its attributes, pages and entries
// beneath.
func (f *FS) Changed(rel string) {
	if rel == "." {
		rel = ""
	}
	posix.Invalidate(f.root.EmbeddedInode(), rel)
}

// Mark is the count a save starts from: Changes, since FUSE sees every
// change as it is made.
func (f *FS) Mark() int64 {
	if f.dirs.mark() {
		// A file open for writing may have changed with no request
		// (a shared mapping's pages written back later).
		f.changes.Add(1)
	}
	return f.Changes()
}

// Close is a no-op: Unmount ends the FUSE session.
func (f *FS) Close() {}

// Stranded is false: through FUSE every read reaches the daemon, and a
// detached mount's readers get errors, never a placeholder's holes.
func (f *FS) Stranded() bool { return false }

// Detached reports whether Unmount had to detach a busy mount.
func (f *FS) Detached() bool { return f.detached.Load() }

// Wait blocks until the file system is unmounted.
func (f *FS) Wait() { f.server.Wait() }

// Unmount unmounts, retrying while the mount is busy for up to wait. If it
// is still busy it detaches the mount lazily (MNT_DETACH) when lazy is set:
// new opens fail at once and the daemon keeps serving open files until they
// are closed.
//
// The mount is unmounted by its mount id and held descriptors, never by
// its path: a parent renamed or swapped for a symlink cannot turn the
// unmount onto another mount, and a mount moved elsewhere is detached
// where it is.
func (f *FS) Unmount(wait time.Duration, lazy bool) error {
	if !f.byPath {
		detached, err := f.mnt.UnmountWithin(wait, lazy)
		switch {
		case err != nil && detached:
			return fmt.Errorf("lazy unmount: %w", err)
		case err != nil:
			return err
		case detached:
			f.detached.Store(true)
			f.log.Warn("mount was busy; detached it lazily", "op", "unmount", "path", f.mountpoint)
		default:
			f.server.Wait()
		}
		return nil
	}
	// fusermount3 mounted it (not root): only it may unmount, and it
	// takes a path (its own checks make it the user's own mount).
	deadline := time.Now().Add(wait)
	for {
		err := f.server.Unmount()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			if lazy && isBusy(err) {
				if err := mountpoint.FusermountDetach(f.mountpoint); err != nil {
					return fmt.Errorf("lazy unmount: %w", err)
				}
				f.detached.Store(true)
				f.log.Warn("mount was busy; detached it lazily", "op", "unmount", "path", f.mountpoint)
				return nil
			}
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Mount is the mount, known by its id and held by descriptor.
func (f *FS) Mount() *mountpoint.Mount { return f.mnt }

func isBusy(err error) bool {
	return errors.Is(err, syscall.EBUSY) || strings.Contains(err.Error(), "busy")
}

// slogWriter adapts go-fuse's log.Logger output to slog.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Debug(strings.TrimRight(string(p), "\n"), "component", "go-fuse")
	return len(p), nil
}
