// Package loopback serves a backing directory through go-fuse by handle,
// never by path: every inode the kernel knows holds an O_PATH descriptor of
// its backing file, and every operation is a *at system call relative to
// such a descriptor (a node's own, or its parent's for a name inside it),
// with names of one component that are never followed when they are
// symlinks. No path is rebuilt from names, so nothing a user does in the
// backing tree or through the mount, such as swapping a directory for a
// symlink mid-operation, can make the daemon act outside the tree.
// libfuse's passthrough_hp is the model.
//
// Both the workspace and the host-directory live mounts serve this node;
// each wraps it for what it adds (lazy restore and change tracking, or
// fsnotify), and configures read-only, inode tagging and cache times here.
package loopback

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// Options configure a loopback tree.
type Options struct {
	// ReadOnly refuses every change with EROFS.
	ReadOnly bool
	// Tag (0 for none) sets this tree's inode numbers apart from those of
	// other trees in the same FUSE mount, even over the same backing
	// filesystem: inode numbers get Tag in bits 48-63. go-fuse and the
	// kernel key inodes by number, so sharing one would merge nodes.
	Tag uint16
	// EntryTimeout and AttrTimeout, if set, are the kernel's cache times
	// for this tree's entries and attributes (including misses); zero
	// leaves the mount's defaults.
	EntryTimeout, AttrTimeout time.Duration
	// Shared says others change the backing tree too (a host directory),
	// so the kernel's entries can be stale: opening a node whose file the
	// host has since removed fails with ENOENT, as the lookup by name
	// that a local filesystem would do, rather than reaching the unlinked
	// file. An O_TMPFILE file is exempt.
	Shared bool
	// CacheListings lets the kernel keep a directory's listing across
	// opens (FOPEN_CACHE_DIR and FOPEN_KEEP_CACHE): a warm walk then
	// reads listings from the page cache and asks nothing. The kernel
	// drops a listing when a change through the mount touches the
	// directory; a change made to the backing tree some other way must be
	// invalidated by the tree's user (NotifyContent on the directory), so
	// a tree others change too (Shared) must not set it.
	CacheListings bool
	// Shown, if set, gives some inodes other stat data than the backing
	// inode's own: the workspace shows restored files as they were saved.
	Shown Shown
	// Wrap, if set, wraps every node the tree makes below its root, for
	// what its user adds (lazy restore and change tracking, or a watch).
	// New returns the root unwrapped; its user wraps it the same way.
	Wrap func(*Node) gofs.InodeEmbedder
	// Writers, if set, is told of each handle that may write a file as
	// it opens (delta 1) and as it is released (-1), with the backing
	// inode of the directory it was opened in (0: not known, as for an
	// O_TMPFILE file): with passthrough, or through a shared mapping,
	// its writes may reach the file with no request in between.
	Writers func(dir uint64, delta int)
}

// Shown maps a backing inode's number and ctime to the ones the mount
// shows. It must keep numbers unique within the tree, and give a backing
// inode (number and birth time) one number for its life.
type Shown interface {
	// Show returns the number and ctime to show for the backing inode
	// ino born at gen (see genOf) whose ctime is ctime.
	Show(ino, gen uint64, ctime unix.StatxTimestamp) (uint64, unix.StatxTimestamp)
	// DirIno is the number to show for ino in a directory listing,
	// where only the number is known.
	DirIno(ino uint64) uint64
}

// Root is one backing directory and the table of the backing inodes the
// kernel knows below it.
type Root struct {
	opts Options
	dev  uint64 // the backing root's device
	euid int

	mu     sync.Mutex
	inodes map[inodeKey]*backing // GUARDED_BY(mu)

	// top is the tree's root node; budget is how many backing
	// descriptors may be open (open counts them) before the least
	// recently used are closed and kept as file handles (shed), or, where
	// handles cannot be opened again (handles false), the kernel is asked
	// to forget cached entries (relieve). One of them is under way while
	// relieving.
	top       *Node
	budget    int
	open      atomic.Int64
	relieving atomic.Bool
	// handles: inodes of the root's filesystem can be opened again by
	// file handle, relative to mountFd (a descriptor of the
	// root directory, kept for the tree's life). clock orders uses.
	handles bool
	mountFd int
	clock   atomic.Uint64
}

type inodeKey struct{ dev, ino uint64 }

// backing is one backing inode, shared by the nodes that stand for it
// (go-fuse may briefly make more than one per inode: a lookup racing
// another one for the same file through a second name builds a node that
// go-fuse then drops for the first).
type backing struct {
	key  inodeKey
	gen  uint64      // birth time in ns (1 if the filesystem has none)
	refs int         // GUARDED_BY(Root.mu): nodes holding it
	tmp  atomic.Bool // made by O_TMPFILE: unlinked by design

	// fd is the O_PATH descriptor, -1 while shed: then handle opens the
	// inode again. users counts the operations using fd (Node.fd), which
	// keep it open; dead says the record was reaped, and the last user
	// closes fd.
	fmu    sync.Mutex
	fd     int              // GUARDED_BY(fmu)
	handle *unix.FileHandle // GUARDED_BY(fmu)
	users  int              // GUARDED_BY(fmu)
	dead   bool             // GUARDED_BY(fmu)
	used   atomic.Uint64    // Root.clock at its last use
	// writers counts the handles open through the mount that may write
	// it (a shared mapping's pages reach the file only when written
	// back).
	writers atomic.Int32
	// files counts the handles open through the mount.
	files atomic.Int32
	// closed: GUARDED_BY(Root.mu)
	closed bool
}

// closeGrace is how long a backing descriptor outlives its last node. A
// node that go-fuse revives in the instant after it was forgotten (its
// OnForget contract allows that race) finds its descriptor still open and
// takes it back.
const closeGrace = 5 * time.Second

// pressedGrace replaces closeGrace while the tree is over its descriptor
// budget.
const pressedGrace = 100 * time.Millisecond

// New opens dir as the root of a loopback tree. The caller wraps the root
// node it returns (Node) and passes that to go-fuse.
func New(dir string, opts Options) (*Node, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	var st unix.Statx_t
	if err := statFd(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "statx", Path: dir, Err: err}
	}
	r := &Root{opts: opts, dev: devOf(&st), euid: os.Geteuid(), inodes: map[inodeKey]*backing{}, budget: fdBudget(), mountFd: -1}
	r.probeHandles(fd)
	b := &backing{fd: fd, key: inodeKey{devOf(&st), st.Ino}, gen: genOf(&st), refs: 1}
	r.open.Add(1)
	r.inodes[b.key] = b
	r.top = newNode(r, b)
	return r.top, nil
}

// probeHandles sets handles if the root's inode, taken as a file handle,
// opens again: that needs CAP_DAC_READ_SEARCH, and a filesystem that
// exports handles (ext4, xfs, btrfs and tmpfs do).
func (r *Root) probeHandles(root int) {
	h, _, err := unix.NameToHandleAt(root, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return
	}
	mfd, err := unix.Open(procPath(root), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0) // not O_PATH: the kernel refuses one
	if err != nil {
		return
	}
	fd, err := unix.OpenByHandleAt(mfd, h, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		unix.Close(mfd)
		return
	}
	unix.Close(fd)
	r.handles, r.mountFd = true, mfd
}

// fdBudget is half the descriptor limit (at least 512): the share of it the
// backing descriptors of one tree may take before relieve runs.
func fdBudget() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 1 << 29
	}
	return max(int(rl.Cur/2), 512)
}

// overBudget starts a shed or a relieve once more backing descriptors
// are open than the budget, unless one is under way.
func (r *Root) overBudget() {
	if r.open.Load() > int64(r.budget) && r.top != nil && r.relieving.CompareAndSwap(false, true) {
		if r.handles {
			go r.shedOver()
		} else {
			go r.relieve(false)
		}
	}
}

// shedOver sheds until the tree is within its budget, or nothing more
// can be shed. Descriptors opened meanwhile (whose overBudget found it
// under way) are shed too.
func (r *Root) shedOver() {
	for {
		progress := false
		for r.open.Load() > int64(r.budget) && r.shed(int(r.open.Load())-r.budget*3/4) > 0 {
			progress = true
		}
		r.relieving.Store(false)
		if !progress || r.open.Load() <= int64(r.budget) || !r.relieving.CompareAndSwap(false, true) {
			return
		}
	}
}

// shed closes the descriptors of up to want backing inodes, the least
// recently used, and keeps each as a file handle, which opens it again
// when it is next used (Node.fd): the kernel keeps every entry and inode
// it caches, however large the tree, and the daemon stays within its
// descriptor budget. Only an inode of the root's filesystem with a birth
// time, with no operation under way and not open through the mount, and
// not unlinked by design (O_TMPFILE), is shed.
func (r *Root) shed(want int) int {
	if want <= 0 {
		return 0
	}
	top := r.top.r.Load().b
	r.mu.Lock()
	cands := make([]*backing, 0, len(r.inodes))
	for _, b := range r.inodes {
		if !b.closed && b != top && b.key.dev == r.dev && b.gen != 1 && !b.tmp.Load() {
			cands = append(cands, b)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(cands, func(a, b *backing) int { return cmp.Compare(a.used.Load(), b.used.Load()) })
	shed := 0
	for _, b := range cands {
		if shed >= want {
			break
		}
		if b.files.Load() > 0 || !b.fmu.TryLock() {
			continue
		}
		if b.fd >= 0 && b.users == 0 && !b.dead {
			if b.handle == nil {
				if h, _, err := unix.NameToHandleAt(b.fd, "", unix.AT_EMPTY_PATH); err == nil {
					b.handle = &h
				}
			}
			if b.handle != nil {
				r.closeFd(b)
				shed++
			}
		}
		b.fmu.Unlock()
	}
	return shed
}

// use pins b's descriptor for one operation, opening it again by its
// file handle if it was shed; done unpins it.
func (r *Root) use(b *backing) (int, syscall.Errno) {
	b.used.Store(r.clock.Add(1))
	opened := false
	b.fmu.Lock()
	for b.fd < 0 && !b.dead {
		h := *b.handle
		b.fmu.Unlock()
		// The inode itself, by its handle: no name is resolved. A
		// handle of an inode since deleted fails with ESTALE.
		fd, err := r.openFd(func() (int, error) { return unix.OpenByHandleAt(r.mountFd, h, unix.O_PATH|unix.O_CLOEXEC) })
		if err == unix.ESTALE {
			err = unix.ENOENT // deleted since: as a lookup of it would say
		}
		if err != nil {
			return -1, errnoOf(err)
		}
		b.fmu.Lock()
		if b.fd < 0 && !b.dead {
			b.fd = fd
			r.open.Add(1)
			opened = true
		} else {
			unix.Close(fd)
		}
	}
	if b.dead {
		b.fmu.Unlock()
		return -1, syscall.ESTALE
	}
	b.users++
	fd := b.fd
	b.fmu.Unlock()
	if opened {
		r.overBudget()
	}
	return fd, 0
}

func (r *Root) done(b *backing) {
	b.fmu.Lock()
	defer b.fmu.Unlock()
	b.users--
	if b.users == 0 && b.dead && b.fd >= 0 {
		r.closeFd(b)
	}
}

// closeFd closes b's descriptor and stops counting it. Must hold b.fmu.
func (r *Root) closeFd(b *backing) {
	unix.Close(b.fd)
	b.fd = -1
	r.open.Add(-1)
}

// relieve asks the kernel to forget the cached entries of a quarter of
// the budget's worth of nodes, leaves first, so that it sends FORGET and
// their descriptors close: the kernel keeps every inode it has looked up
// cached until memory runs short, and each holds a descriptor here, so a
// tree of more files than the descriptor limit (a git repository, a
// node_modules) would otherwise end in EMFILE. An entry still in use (an
// open file, a cwd) stays; the others are looked up again when next used.
// It runs in its own goroutine: a notification sent from inside a request
// can deadlock.
func (r *Root) relieve(short bool) {
	defer r.relieving.Store(false)
	open := int(r.open.Load())
	want := open - r.budget/2
	if short {
		// Out of descriptors already, within the budget or not.
		want = max(want, open/2)
	}
	var walk func(in *gofs.Inode) bool
	walk = func(in *gofs.Inode) bool {
		for name, ch := range in.Children() {
			if want <= 0 {
				return false
			}
			if ch.IsDir() && !walk(ch) {
				return false
			}
			if !ch.IsDir() || len(ch.Children()) == 0 {
				if in.NotifyEntry(name) == 0 {
					want--
				}
			}
		}
		return want > 0
	}
	walk(r.top.EmbeddedInode())
}

// Reroot points n, the tree's root node, at dir again if dir is now another
// directory than the one n holds, as when the host removed it and made it
// again, or mounted something there. It reports whether it did. Nodes below
// the old directory keep their inodes; the caller invalidates the kernel's
// entries so that lookups go to the new one.
func (n *Node) Reroot(dir string) (bool, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	var st unix.Statx_t
	if err := statFd(fd, &st); err != nil {
		unix.Close(fd)
		return false, &os.PathError{Op: "statx", Path: dir, Err: err}
	}
	if cur := n.r.Load().b; cur.key == (inodeKey{devOf(&st), st.Ino}) && cur.gen == genOf(&st) {
		unix.Close(fd)
		return false, nil
	}
	n.claim(n.root.acquire(&st, fd)).drop()
	return true, nil
}

// StableAttr is the identity go-fuse gives the node of a backing inode.
func (r *Root) stableAttr(st *unix.Statx_t) gofs.StableAttr {
	return gofs.StableAttr{Mode: uint32(st.Mode) & syscall.S_IFMT, Ino: r.ino(st), Gen: genOf(st)}
}

// ino is the inode number the mount shows for a backing inode. As in
// go-fuse's loopback, the device is mixed in (rotated, relative to the
// root's) so that a tree spanning filesystems keeps numbers apart, and
// equals the backing number within the root's filesystem; the tag then
// sets the tree apart from the others of the mount.
func (r *Root) ino(st *unix.Statx_t) uint64 {
	ino, _ := r.shown(st)
	return ino
}

// shown returns the inode number and ctime the mount shows for st.
func (r *Root) shown(st *unix.Statx_t) (uint64, unix.StatxTimestamp) {
	ino, ctime := st.Ino, st.Ctime
	if s := r.shownOn(devOf(st)); s != nil {
		ino, ctime = s.Show(st.Ino, genOf(st), st.Ctime)
	}
	return ino ^ r.mix(devOf(st)), ctime
}

// shownOn is the Shown that maps inodes of device dev: the tree's, for its
// own filesystem only (nil for none).
func (r *Root) shownOn(dev uint64) Shown {
	if dev != r.dev {
		return nil
	}
	return r.opts.Shown
}

// mix is what a backing inode number of device dev is XORed with: the
// device, rotated, relative to the root's, and the tree's tag.
func (r *Root) mix(dev uint64) uint64 {
	rot := func(d uint64) uint64 { return d<<32 | d>>32 }
	return rot(dev) ^ rot(r.dev) ^ uint64(r.opts.Tag)<<48
}

// acquire returns the backing record of the inode st describes, taking a
// reference. fd, if not -1, is an O_PATH descriptor of that inode that the
// caller opened; acquire owns it from here (it closes it if a record
// already holds one). With fd -1 only a known record is returned (nil
// otherwise).
func (r *Root) acquire(st *unix.Statx_t, fd int) *backing {
	key, gen := inodeKey{devOf(st), st.Ino}, genOf(st)
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.inodes[key]; b != nil && !b.closed && b.gen == gen && (gen != 1 || sameFile(b, st)) {
		b.refs++
		if fd >= 0 {
			b.fmu.Lock()
			adopted := b.fd < 0
			if adopted {
				b.fd = fd // shed: the caller's opens it again
				r.open.Add(1)
			}
			b.fmu.Unlock()
			if adopted {
				r.overBudget()
			} else {
				unix.Close(fd)
			}
		}
		return b
	}
	if fd < 0 {
		return nil
	}
	// A record with another birth time is of an inode since deleted
	// whose number the filesystem reused; its nodes keep it.
	b := &backing{fd: fd, key: key, gen: gen, refs: 1}
	b.used.Store(r.clock.Add(1))
	r.inodes[key] = b
	r.open.Add(1)
	r.overBudget()
	return b
}

// openFd runs open, a call that makes a descriptor. If the process is out
// of descriptors (EMFILE, ENFILE: nothing was opened or created), it has
// the kernel forget cached entries and tries again, for up to about 2 s.
func (r *Root) openFd(open func() (int, error)) (int, error) {
	for i := 0; ; i++ {
		fd, err := open()
		if (err != unix.EMFILE && err != unix.ENFILE) || i == 20 || r.top == nil {
			return fd, err
		}
		switch {
		case r.handles:
			// Out of descriptors: shed a quarter of them now.
			if r.shed(max(int(r.open.Load())/4, 1)) > 0 {
				continue
			}
		case r.relieving.CompareAndSwap(false, true):
			go r.relieve(true)
		}
		time.Sleep(time.Duration(i+1) * 10 * time.Millisecond)
	}
}

// sameFile guards the reuse of a record on filesystems without birth
// times (whose records are never shed): its inode must still be linked
// and of the same type.
func sameFile(b *backing, st *unix.Statx_t) bool {
	b.fmu.Lock()
	defer b.fmu.Unlock()
	var cur unix.Statx_t
	return b.fd >= 0 && statFd(b.fd, &cur) == nil && cur.Nlink > 0 && cur.Mode&syscall.S_IFMT == st.Mode&syscall.S_IFMT
}

// release drops a reference; the last one closes the descriptor after
// closeGrace unless a revived node takes it back first.
func (r *Root) release(b *backing) {
	r.mu.Lock()
	b.refs--
	last := b.refs == 0
	grace := closeGrace
	if r.open.Load() > int64(r.budget) {
		grace = pressedGrace // descriptors are short: close them soon
	}
	r.mu.Unlock()
	if last {
		time.AfterFunc(grace, func() { r.reap(b) })
	}
}

func (r *Root) reap(b *backing) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.refs > 0 || b.closed {
		return
	}
	b.closed = true
	if r.inodes[b.key] == b {
		delete(r.inodes, b.key)
	}
	b.fmu.Lock()
	defer b.fmu.Unlock()
	b.dead = true
	if b.users == 0 && b.fd >= 0 {
		r.closeFd(b)
	}
}

// revive takes a reference for a node go-fuse reused after forgetting it.
func (r *Root) revive(b *backing) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.closed {
		return false
	}
	b.refs++
	return true
}

// Inodes returns the number of backing descriptors held open.
func (r *Root) Inodes() int { return int(r.open.Load()) }

// Known returns the number of backing inodes the kernel knows, held open
// or by file handle.
func (r *Root) Known() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, b := range r.inodes {
		if !b.closed {
			n++
		}
	}
	return n
}

// ref is a node's claim on its backing record. It is a separate object,
// not part of the node, so that a cleanup can release it once go-fuse drops
// a node without ever forgetting it (a lookup race's loser): the node is in
// cycles with the go-fuse tree; ref is not.
type ref struct {
	root *Root
	b    *backing
	held atomic.Bool
}

func (r *ref) drop() {
	if r.held.CompareAndSwap(true, false) {
		r.root.release(r.b)
	}
}

func devOf(st *unix.Statx_t) uint64 { return unix.Mkdev(st.Dev_major, st.Dev_minor) }

func genOf(st *unix.Statx_t) uint64 {
	if st.Mask&unix.STATX_BTIME == 0 || (st.Btime.Sec == 0 && st.Btime.Nsec == 0) {
		return 1
	}
	return uint64(st.Btime.Sec)*1e9 + uint64(st.Btime.Nsec)
}

const statxMask = unix.STATX_BASIC_STATS | unix.STATX_BTIME

// statFd describes the inode fd refers to itself, never following it.
func statFd(fd int, st *unix.Statx_t) error {
	return unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_SYNC_AS_STAT, statxMask, st)
}

// statAt describes name in the directory dirfd, never following it.
func statAt(dirfd int, name string, st *unix.Statx_t) error {
	return unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_SYNC_AS_STAT, statxMask, st)
}

// procPath names the inode an O_PATH descriptor refers to, for the calls
// that have no form taking one (chmod, truncate, xattrs, reopening). The
// kernel resolves it to that very inode, never by a name in the tree.
func procPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// Writers returns the backing inode numbers (of the tree's device) of
// the files open for writing through the mount now, shared mappings
// included (their handle is released only after the last unmap).
func (r *Root) Writers() map[uint64]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[uint64]bool{}
	for k, b := range r.inodes {
		if b.writers.Load() > 0 {
			out[k.ino] = true
		}
	}
	return out
}

// Writing reports whether the backing inode fd refers to (any descriptor
// of a file in the tree) is open for writing through the mount: its
// latest bytes may still be in the kernel's page cache of the mount's
// inode, not in the file.
func (r *Root) Writing(fd int) bool {
	var st unix.Statx_t
	if statFd(fd, &st) != nil {
		return true
	}
	r.mu.Lock()
	b := r.inodes[inodeKey{devOf(&st), st.Ino}]
	r.mu.Unlock()
	return b != nil && b.writers.Load() > 0
}
