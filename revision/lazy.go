package revision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
)

// Lazy restore. A folder revision, or an archive with amlfs's index,
// restored lazily becomes a tree of placeholders: every directory, and
// every file at its final size and mode but with no bytes yet (sparse),
// marked with the xattr PendingXattr holding the key of its bytes (a
// folder's object, or an archive's member: memberKey). The mount is ready as soon as the
// manifest or index is read. A file's bytes are fetched into its placeholder, in
// place (the inode stays), the first time anything opens it, truncates it
// or saves it, and by a bounded background prefetch. Only when the bytes
// are written and fsync'd is the xattr removed, so after a crash the next
// mount finds exactly the placeholders still pending.

// The extended attribute that marks a placeholder; its value is the key
// of the bytes. A daemon running as root uses the trusted namespace, which
// only root can read or write: in a tree served natively the sandbox's
// users reach the files directly, and one who could plant a marker on a
// file of theirs would have a resumed tree fetch any object of the store
// into it. Without root, the user namespace, which the FUSE loopback
// hides from the mount's users.
//
// PendingUserXattr is the name in the user namespace, which an older
// amlfs used as root too.
const PendingUserXattr = "user.amlfs.pending"

// PendingXattr is the marker this process reads and writes.
func PendingXattr() string { return markerXattr(PendingUserXattr) }

// markerXattr is amlfs's marker of user-namespace name user as this
// process uses it: in the trusted namespace when it runs as root.
func markerXattr(user string) string {
	if os.Geteuid() == 0 {
		return "trusted." + strings.TrimPrefix(user, "user.")
	}
	return user
}

type pendingFile struct {
	key      string
	size     int64
	origPath string // where restore put it; the base tree's key
	handle   string // the placeholder's file handle (fileID)
}

// file is the pending record of the file id, if it is a placeholder of
// this tree still to fill: a record of a file gone since whose number id
// reuses is not its. Must hold l.mu.
func (l *lazyState) file(id fileID) (pendingFile, bool) {
	pf, ok := l.pending[id.ino]
	return pf, ok && pf.handle == id.handle
}

type lazyState struct {
	dir      string
	mu       sync.Mutex
	pending  map[uint64]pendingFile // GUARDED_BY(mu): by inode number; see file
	bytes    int64                  // GUARDED_BY(mu): bytes still pending
	inflight map[uint64]*fetchCall  // GUARDED_BY(mu): by inode number
	// gone are the pending files whose bytes another writer pruned: each
	// read of one gives EIO, logged once. INVARIANT: a subset of pending.
	// The value is the path where the fetch found it.
	gone map[uint64]string // GUARDED_BY(mu)
	dirs *dirSet           // directories still to populate (lazydir.go)
	revs *revTable         // the archives short markers name (marker.go)
}

type fetchCall struct {
	done chan struct{}
	err  error
}

func newLazy(dir string) *lazyState {
	return &lazyState{dir: dir, pending: map[uint64]pendingFile{}, inflight: map[uint64]*fetchCall{}, gone: map[uint64]string{}, revs: newRevTable(dir)}
}

// addPlaceholder creates the placeholder for te named name in the
// directory open as dirfd (at dir), whose bytes are at key (the idx-th
// entry of its archive's index, or -1), and returns its stamp.
//
// It is made in place, and marked first: created for its owner alone
// (madeMode), then its marker, then its size, owner, mode and times. Nothing but
// population makes an entry in a directory still to be populated (whose
// marker stays until it is whole), so after a crash an entry there is
// either a placeholder made whole, taken as it is; or one made in part
// (madeMode and no bytes, or with its marker but not yet all
// of its stat data), which is made again; or not ours (fetched by a
// prefetch, or made by a test), left alone. Never a file that could pass
// for real content. Raw syscalls, each on a descriptor: an *os.File would
// register each descriptor with the runtime poller, and a path walked
// again per call, which cost more than the placeholder.
// view, if not nil, is told of a placeholder made here.
func (l *lazyState) addPlaceholder(dirfd int, dir, name string, te format.TreeEntry, key string, idx int, view StatView, made func(fd int) error) (store.Stamp, error) {
	dst := filepath.Join(dir, name)
	// The marker is written, and the placeholder counted pending, with
	// the table of archives held, so the number it names stays.
	l.revs.mu.RLock()
	defer l.revs.mu.RUnlock()
	marker := l.revs.marker(key, idx, l.artifactsInUse)
	var st unix.Statx_t
	fd, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, madeMode)
	if errors.Is(err, unix.EEXIST) {
		whole, ierr := l.interrupted(dirfd, dst, name, te, marker, &st)
		switch {
		case ierr != nil:
			return store.Stamp{}, ierr
		case whole:
			return l.took(st, te, key, dirfd, name, made)
		case st.Ino == 0:
			return store.Stamp{}, nil // not ours: leave it
		}
		fd, err = unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, madeMode)
	}
	if err != nil {
		return store.Stamp{}, &os.PathError{Op: "create", Path: dst, Err: err}
	}
	defer unix.Close(fd)
	err = unix.Fsetxattr(fd, PendingXattr(), marker, 0)
	if errors.Is(err, unix.EACCES) {
		// A umask took the owner's write bit, which a user.* xattr
		// needs (a daemon not root).
		if err = unix.Fchmod(fd, madeMode); err == nil {
			err = unix.Fsetxattr(fd, PendingXattr(), marker, 0)
		}
	}
	if err != nil {
		return store.Stamp{}, fmt.Errorf("mark placeholder %s: %w", te.Path, err)
	}
	// The placeholder's blocks are allocated (unwritten extents, which
	// read as zeros until filled, and cost no write): its st_blocks is
	// what the file will take, so du counts a lazy tree right, and its
	// fill cannot run out of space half way. A file system without
	// fallocate gets a sparse file.
	if te.Size > 0 {
		if err := unix.Fallocate(fd, 0, 0, te.Size); err != nil {
			if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
				return store.Stamp{}, &os.PathError{Op: "fallocate", Path: dst, Err: err}
			}
			if err := unix.Ftruncate(fd, te.Size); err != nil {
				return store.Stamp{}, &os.PathError{Op: "truncate", Path: dst, Err: err}
			}
		}
	}
	if err := chownSaved(fd, te); err != nil {
		return store.Stamp{}, &os.PathError{Op: "chown", Path: dst, Err: err}
	}
	if err := unix.Fchmod(fd, te.Mode&0o777); err != nil {
		return store.Stamp{}, &os.PathError{Op: "chmod", Path: dst, Err: err}
	}
	if te.Mtime != 0 {
		ts := unix.NsecToTimespec(int64(te.Mtime))
		if err := futimens(fd, ts); err != nil {
			return store.Stamp{}, &os.PathError{Op: "utimensat", Path: dst, Err: err}
		}
	}
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &st); err != nil {
		return store.Stamp{}, err
	}
	h, err := handleOf(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return store.Stamp{}, err
	}
	if view != nil {
		view.Restored(&st, te)
	}
	if made != nil {
		if err := made(fd); err != nil {
			return store.Stamp{}, err
		}
	}
	return l.counted(st, h, te, key), nil
}

// madeMode is a placeholder's mode until it has its own: readable and
// writable by its owner, as reading and writing a user.* xattr need (a
// daemon not root).
const madeMode = 0o600

// interrupted looks at the entry an interrupted population left at name
// (see addPlaceholder): whole reports a placeholder made whole, with st
// its stat data; otherwise an entry made in part was removed (st.Ino is
// then set), or the entry is not ours (st.Ino 0).
func (l *lazyState) interrupted(dirfd int, dst, name string, te format.TreeEntry, marker []byte, st *unix.Statx_t) (whole bool, err error) {
	var cur unix.Statx_t
	if err := unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &cur); err != nil {
		return false, &os.PathError{Op: "statx", Path: dst, Err: err}
	}
	if cur.Mode&unix.S_IFMT != unix.S_IFREG || cur.Nlink != 1 {
		return false, nil
	}
	buf := make([]byte, 4096)
	n, xerr := unix.Lgetxattr(dst, PendingXattr(), buf)
	ours := xerr == nil && bytes.Equal(buf[:n], marker)
	if xerr != nil && errors.Is(xerr, unix.ENODATA) && cur.Size == 0 && cur.Mode&0o7777 == madeMode {
		ours = true // created, not yet marked
	}
	if !ours {
		return false, nil
	}
	mtimeOK := te.Mtime == 0 || tsOf(cur.Mtime) == syscall.NsecToTimespec(int64(te.Mtime))
	if xerr == nil && int64(cur.Size) == te.Size && uint32(cur.Mode)&0o777 == te.Mode&0o777 && mtimeOK {
		*st = cur
		return true, nil
	}
	if err := unix.Unlinkat(dirfd, name, 0); err != nil {
		return false, &os.PathError{Op: "unlink", Path: dst, Err: err}
	}
	st.Ino = cur.Ino
	return false, nil
}

// took counts the placeholder an interrupted population made whole.
func (l *lazyState) took(st unix.Statx_t, te format.TreeEntry, key string, dirfd int, name string, made func(fd int) error) (store.Stamp, error) {
	pfd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return store.Stamp{}, err
	}
	defer unix.Close(pfd)
	var pst unix.Stat_t
	if err := unix.Fstat(pfd, &pst); err != nil {
		return store.Stamp{}, err
	}
	if pst.Ino != st.Ino {
		return store.Stamp{}, fmt.Errorf("%s changed while a population took it up", name)
	}
	h, err := handleOf(pfd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return store.Stamp{}, err
	}
	if made != nil {
		if err := made(pfd); err != nil {
			return store.Stamp{}, err
		}
	}
	return l.counted(st, h, te, key), nil
}

// counted records the placeholder st, whose handle is h, as pending and
// returns its stamp.
func (l *lazyState) counted(st unix.Statx_t, h string, te format.TreeEntry, key string) store.Stamp {
	l.mu.Lock()
	if old, ok := l.pending[st.Ino]; ok {
		l.bytes -= old.size
	}
	l.pending[st.Ino] = pendingFile{key: key, size: te.Size, origPath: te.Path, handle: h}
	l.bytes += te.Size
	l.mu.Unlock()
	return store.Stamp{Ino: st.Ino, Size: st.Size, Mtime: tsOf(st.Mtime), Ctime: tsOf(st.Ctime)}
}

// artifactsInUse lists the artifacts pending placeholders' bytes are in.
func (l *lazyState) artifactsInUse() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]bool{}
	for _, pf := range l.pending {
		out[artifactOf(pf.key)] = true
	}
	return out
}

// futimens sets the access and modification times of the file open as fd
// (utimensat with no path: x/sys/unix has no wrapper for it).
func futimens(fd int, ts unix.Timespec) error {
	times := [2]unix.Timespec{ts, ts}
	if _, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&times)), 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// getMarker reads the marker name of p, or with legacy, if it has none,
// the older marker old.
func getMarker(p, name, old string, legacy bool, buf []byte) (int, error) {
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil && legacy && old != name {
		n, err = unix.Lgetxattr(p, old, buf)
	}
	return n, err
}

// validPendingKey checks a key read back from a placeholder's xattr.
func validPendingKey(key string) bool {
	if _, _, ok := parseMemberKey(key); ok {
		return true
	}
	if _, _, ok := parseRefKey(key); ok {
		return true
	}
	if _, _, ok := store.SplitForeign(key); ok {
		return !strings.Contains(key, "\x00")
	}
	rest, ok := strings.CutPrefix(key, "revisions/")
	return ok && !strings.Contains(key, "\x00") && format.ValidPath(rest) == nil
}

// scanPending rebuilds the pending set of a working tree from placeholder
// xattrs, after a crash. legacy also takes the user-namespace markers a
// root daemon of an older amlfs wrote: only for a tree no user could
// reach but through FUSE, which hides them.
func scanPending(dir string, sel format.Selection, legacy bool) (*lazyState, error) {
	l := newLazy(dir)
	l.dirs = newDirSet(sel)
	if err := l.revs.load(); err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			n, err := getMarker(p, PendingDirXattr(), PendingDirUserXattr, legacy, buf)
			if err != nil {
				return nil // populated (ENODATA)
			}
			rev, orig, ok := strings.Cut(string(buf[:n]), "\x00")
			folder := validPendingKey(rev+"files") && strings.HasSuffix(rev, "/")
			archive := strings.HasSuffix(rev, format.ArchiveExt) && store.CheckKey(rev) == nil && (strings.HasPrefix(rev, "revisions/") || store.IsForeign(rev))
			if !ok || !folder && !archive || (orig != "" && format.ValidPath(orig) != nil) {
				return amlerr.New(amlerr.InvalidStore, p, "bad pending directory marker %q", buf[:n])
			}
			return l.dirs.markDir(p, orig, rev)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		n, err := getMarker(p, PendingXattr(), PendingUserXattr, legacy, buf)
		if err != nil {
			return nil // not a placeholder (ENODATA)
		}
		key, ok := l.revs.key(string(buf[:n]))
		if !ok {
			return amlerr.New(amlerr.InvalidStore, p, "bad pending marker %q", buf[:n])
		}
		id, st, err := idAt(unix.AT_FDCWD, p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		l.pending[st.Ino] = pendingFile{key: key, size: st.Size, origPath: filepath.ToSlash(rel), handle: id.handle}
		l.bytes += st.Size
		return nil
	})
	return l, err
}

// Pending reports the files and bytes not fetched yet.
// Gone is how many files a read found to be placeholders whose bytes
// another writer pruned, and that are still where they were found: each
// read of one gives EIO, and a save of the tree fails with
// BASE_REVISION_GONE. One removed or moved away is no longer counted (a
// moved one again at its next read).
func (w *Workspace) gone() int {
	l := w.lazyState()
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for ino, p := range l.gone {
		pf, pending := l.pending[ino]
		if id, err := idOfPath(p); !pending || err != nil || id.ino != ino || id.handle != pf.handle {
			delete(l.gone, ino)
		}
	}
	return len(l.gone)
}

// isPending reports whether a placeholder of this tree whose bytes are
// not fetched yet had the inode number ino (it may be gone since: the
// caller checks the file's identity before acting on it).
func (w *Workspace) isPending(ino uint64) bool {
	l := w.lazyState()
	if l == nil {
		return false
	}
	l.mu.Lock()
	_, ok := l.pending[ino]
	l.mu.Unlock()
	return ok
}

func (w *Workspace) pending() (files int, bytes int64) {
	l := w.lazyState()
	if l == nil {
		return 0, 0
	}
	l.mu.Lock()
	files, bytes = len(l.pending), l.bytes
	l.mu.Unlock()
	if l.dirs != nil {
		f, b := l.dirs.unmade()
		files += f
		bytes += b
	}
	return files, bytes
}

// Lazy reports whether any file's bytes or directory's placeholders are
// still to come: a cheap check for every FUSE call. It may say true for a
// while after the last fetch; never false while something is pending.
func (w *Workspace) lazyActive() bool {
	l := w.lazyState()
	if l == nil {
		return false
	}
	if l.dirs != nil && l.dirs.n.Load() > 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending) > 0
}

func (w *Workspace) lazyState() *lazyState {
	w.lmu.Lock()
	defer w.lmu.Unlock()
	return w.lazy
}

// ResumePending finds the placeholders a crashed run left in dir, so that
// their bytes are fetched before anyone reads or saves them.
func (w *Workspace) resumePending(dir string, sel format.Selection, legacy bool) (int, error) {
	l, err := scanPending(dir, sel, legacy)
	if err != nil {
		return 0, err
	}
	w.lmu.Lock()
	w.lazy = l
	w.lmu.Unlock()
	return len(l.pending), nil
}

// ensure makes sure the file at rel (relative to the working directory) has
// its bytes: a no-op unless it is a pending placeholder, which it fetches,
// blocking until the bytes are in place. Concurrent callers for one file
// share one fetch. The engine's own fetches (a fork's save, a prefetch)
// go by path; the serving side fills by descriptor (Fill, FillFile).
func (w *Workspace) ensure(ctx context.Context, rel string) error {
	l := w.lazyState()
	if l == nil {
		return nil
	}
	l.mu.Lock()
	empty := len(l.pending) == 0
	l.mu.Unlock()
	dirs := l.dirs != nil && l.dirs.n.Load() > 0
	if empty && !dirs {
		return nil
	}
	p := filepath.Join(l.dir, filepath.FromSlash(rel))
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		if !dirs || !errors.Is(err, syscall.ENOENT) {
			return nil // gone or not there: nothing to fetch
		}
		// Not made yet, if its directory's placeholders are not.
		if err := w.ensureDir(ctx, parentDir(rel)); err != nil {
			return err
		}
		if syscall.Lstat(p, &st) != nil {
			return nil
		}
	}
	l.mu.Lock()
	_, maybe := l.pending[st.Ino]
	l.mu.Unlock()
	if !maybe {
		return nil // no placeholder has its number: no handle to read
	}
	id, err := idOfPath(p)
	if err != nil {
		return nil
	}
	return w.fetch(ctx, l, id, p)
}

func (w *Workspace) fetch(ctx context.Context, l *lazyState, id fileID, path string) error {
	w.lmu.Lock()
	onAccess := w.onAccess
	w.lmu.Unlock()
	if onAccess {
		if err := w.access(l, id, path); err != nil {
			// Never fall back to a fill by path here: its write would
			// wait on the very event it raises.
			l.mu.Lock()
			_, gone := l.gone[id.ino]
			pf, _ := l.file(id)
			l.mu.Unlock()
			if gone {
				return w.goneErr(pf)
			}
			return err
		}
	}
	return w.fetchWith(ctx, l, id, path, func(ctx context.Context, pf pendingFile) error { return w.fill(ctx, l, pf, id, path) })
}

// FillOnAccess makes the workspace's own fetches (prefetch, a save) go
// through the mount's pre-content events, as any reader's do: the daemon
// reads one byte of the placeholder, and the event's handler fills it
// (FillFile). Native serving needs it: a write to a placeholder by path
// would itself wait on a pre-content event, and an access of the
// daemon's own must not be let through unfilled (a tool call reading a
// placeholder through the mount).
func (w *Workspace) fillOnAccess() {
	w.lmu.Lock()
	w.onAccess = true
	w.lmu.Unlock()
}

// access reads the first byte of the pending placeholder id at path,
// below the working directory, so that its pre-content event fills it.
// A placeholder still pending after it (one no mark covers) is left to
// the fill by path, which then raises no event.
func (w *Workspace) access(l *lazyState, id fileID, path string) error {
	l.mu.Lock()
	_, ok := l.file(id)
	l.mu.Unlock()
	if !ok {
		return nil
	}
	// Even an empty placeholder is opened: natively its open is what
	// fills it (FAN_OPEN_PERM), and a fill by path afterwards would wait
	// on the very event its own open raises.
	f, err := l.open(path, os.O_RDONLY)
	if err != nil {
		return err
	}
	defer f.Close()
	if got, err := idOfFd(int(f.Fd())); err != nil || got != id {
		return fmt.Errorf("%s is no longer the placeholder %v", path, id)
	}
	var b [1]byte
	if _, err := f.ReadAt(b[:], 0); err != nil && err != io.EOF {
		return err
	}
	return nil
}

// Prefetch fetches every pending file in the background, with at most
// workers fetches at once, until none is left or ctx is done.
func (w *Workspace) prefetch(ctx context.Context, workers int) {
	l := w.lazyState()
	if l == nil || workers <= 0 {
		return
	}
	if err := w.populateAll(ctx); err != nil {
		return
	}
	l.mu.Lock()
	type job struct {
		ino uint64
		pf  pendingFile
	}
	jobs := make([]job, 0, len(l.pending))
	for ino, pf := range l.pending {
		jobs = append(jobs, job{ino, pf})
	}
	l.mu.Unlock()
	// In key order: an archive's files of one member come one after
	// another, so the member is read once (memberCache).
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].pf.key < jobs[j].pf.key })
	ch := make(chan job)
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range ch {
				p := filepath.Join(l.dir, filepath.FromSlash(j.pf.origPath))
				id, err := idOfPath(p)
				if err != nil || id.ino != j.ino || id.handle != j.pf.handle {
					continue // moved or gone: fetched when next opened or saved
				}
				w.fetch(ctx, l, id, p)
			}
		}()
	}
	for _, j := range jobs {
		select {
		case ch <- j:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(ch)
	wg.Wait()
}

// ensureAll fetches every pending file among entries (for an archive save,
// which reads everything).
func (w *Workspace) ensureAll(ctx context.Context, entries []format.TreeEntry) error {
	for _, te := range entries {
		if te.Type == format.TypeFile {
			if err := w.ensure(ctx, te.Path); err != nil {
				return err
			}
		}
	}
	return nil
}

// repoint moves pending placeholders to the same bytes in a newly published
// revision (where a save copied them), so that pruning the revision they
// were restored from cannot strand them. moves maps inode to new key.
func (w *Workspace) repoint(moves map[uint64]repointTo) {
	l := w.lazyState()
	if l == nil || len(moves) == 0 {
		return
	}
	base := w.baseTree()
	for ino, m := range moves {
		p := filepath.Join(l.dir, filepath.FromSlash(m.path))
		if stp, ok := l.remark(p, ino, m); ok && base != nil {
			// A new marker is a new ctime: the save's stamp of the
			// file follows it, or the next save would take the file
			// for changed, and fetch and upload it.
			base.restamp(m.path, stp, m.key)
		}
	}
}

// remark writes the marker of the placeholder at p (inode ino) for its new
// place m, and returns its stamp after. No fetch of it can start or end
// meanwhile: a placeholder being fetched, or fetched, is left alone.
func (l *lazyState) remark(p string, ino uint64, m repointTo) (store.Stamp, bool) {
	rel, err := relTo(l.dir, p)
	if err != nil {
		return store.Stamp{}, false
	}
	// The file is marked through a descriptor of it, found beneath the
	// working directory: not whatever is at p by the time of the write.
	f, err := openBeneath(l.dir, rel, unix.O_PATH)
	if err != nil {
		return store.Stamp{}, false // moved: fetched when next opened or saved
	}
	defer f.Close()
	fd := int(f.Fd())
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Ino != ino || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return store.Stamp{}, false
	}
	id, err := idOf(fd, &st)
	if err != nil {
		return store.Stamp{}, false
	}
	l.revs.mu.RLock()
	defer l.revs.mu.RUnlock()
	marker := l.revs.marker(m.key, m.idx, l.artifactsInUse)
	l.mu.Lock()
	defer l.mu.Unlock()
	cur, ok := l.file(id)
	if _, busy := l.inflight[ino]; !ok || busy {
		return store.Stamp{}, false
	}
	before, err := store.FileStamp(f)
	if err != nil {
		return store.Stamp{}, false
	}
	// An O_PATH descriptor takes no xattr call; its magic link does.
	if err := unix.Setxattr(fmt.Sprintf("/proc/self/fd/%d", fd), PendingXattr(), marker, unix.XATTR_REPLACE); err != nil {
		return store.Stamp{}, false // fetched: the marker is gone
	}
	cur.key = m.key
	l.pending[ino] = cur
	after, err := store.FileStamp(f)
	if err != nil || after.Size != before.Size || after.Mtime != before.Mtime {
		return store.Stamp{}, false
	}
	return after, true
}

// repointTo is a placeholder's new place: at path, its bytes at key, the
// idx-th entry of its archive's index (or -1).
type repointTo struct {
	path, key string
	idx       int
}

// fetchFrom fetches every pending file whose bytes live in the artifact at
// revPath, before that revision is pruned. It reports whether all did.
func (w *Workspace) fetchFrom(ctx context.Context, revPath string) bool {
	l := w.lazyState()
	if l == nil {
		return true
	}
	// Directories not made yet from it (one no save looked into, such as
	// one ignored since) are made first, then their files fetched too.
	if !w.populateFrom(ctx, l, revPath) {
		return false
	}
	type job struct {
		ino uint64
		pf  pendingFile
	}
	var jobs []job
	l.mu.Lock()
	for ino, pf := range l.pending {
		if strings.HasPrefix(pf.key, revPath) {
			jobs = append(jobs, job{ino, pf})
		}
	}
	l.mu.Unlock()
	if len(jobs) == 0 {
		return true
	}
	// Find each inode's current path: it may have been renamed.
	paths := map[uint64]string{}
	filepath.WalkDir(l.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) == nil {
				paths[st.Ino] = p
			}
		}
		return nil
	})
	ok := true
	for _, j := range jobs {
		p, found := paths[j.ino]
		var id fileID
		if found {
			var err error
			id, err = idOfPath(p)
			found = err == nil && id.ino == j.ino && id.handle == j.pf.handle
		}
		if !found {
			// Unlinked (its number may name a file made since):
			// nothing needs its bytes any more.
			l.mu.Lock()
			if cur, ok := l.pending[j.ino]; ok && cur.handle == j.pf.handle {
				delete(l.pending, j.ino)
				delete(l.gone, j.ino)
				l.bytes -= j.pf.size
			}
			l.mu.Unlock()
			continue
		}
		if err := w.fetch(ctx, l, id, p); err != nil {
			ok = false
		}
	}
	return ok
}

// populateFrom makes the placeholders of every directory still to be
// populated from the artifact at revPath. It reports whether all were.
func (w *Workspace) populateFrom(ctx context.Context, l *lazyState, revPath string) bool {
	d := l.dirs
	if d == nil || d.n.Load() == 0 {
		return true
	}
	want := map[fileID]bool{}
	d.mu.Lock()
	for ino, pd := range d.dirs {
		if pd.rev == revPath {
			want[fileID{ino: ino, handle: pd.handle}] = true
		}
	}
	d.mu.Unlock()
	if len(want) == 0 {
		return true
	}
	found := findDirs(l.dir, want)
	ok := len(found) == len(want)
	for id, p := range found {
		if err := w.populate(ctx, l, id, p); err != nil {
			ok = false
		}
	}
	return ok
}
