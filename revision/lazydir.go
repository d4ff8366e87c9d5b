package revision

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// Lazy directories. A lazy restore makes only the directories before the
// mount is ready; a directory's file placeholders are made the first time
// anything looks inside it (the FUSE layer calls EnsureDir before every
// lookup, listing or change in a directory), by the background prefetch,
// and before any save. So a ready mount costs one mkdir per directory, not
// one create per file.
//
// A directory whose placeholders are not made yet carries PendingDirXattr(),
// holding the path of the revision it comes from (a folder, or an archive
// with amlfs's index) and, after a NUL, the directory's path in that
// revision (it may have moved since); its placeholders' keys are derived
// from their paths (fileKeys).
// The marker is removed only once every placeholder is in place, so after a
// crash the next mount finds exactly the directories still to populate.
// Nothing but population ever creates an entry in a marked directory,
// because every operation in it waits for population first.

// The marker of a directory whose placeholders are still to be made; as
// root in the trusted namespace, for the reason PendingXattr gives.
const PendingDirUserXattr = "user.amlfs.pendingdir"

// PendingDirXattr is the directory marker this process reads and writes.
func PendingDirXattr() string { return markerXattr(PendingDirUserXattr) }

type pendingDir struct {
	rev      string // folder revision path, "revisions/<seg>/"
	origPath string // the directory's manifest path ("" for the root)
	handle   string // the directory's file handle (fileID)
}

// dir is the pending record of the directory id, if it is still to be
// populated (see lazyState.file). Must hold d.mu.
func (d *dirSet) dir(id fileID) (pendingDir, bool) {
	pd, ok := d.dirs[id.ino]
	return pd, ok && pd.handle == id.handle
}

// dirSet is the lazy state of directories.
type dirSet struct {
	mu    sync.Mutex
	dirs  map[uint64]pendingDir                 // GUARDED_BY(mu): by inode number; see dir
	calls map[uint64]*fetchCall                 // GUARDED_BY(mu)
	files map[string][]format.TreeEntry         // GUARDED_BY(mu): rev + "\x00" + dir -> its files
	revs  map[string]func(string) (string, int) // GUARDED_BY(mu): revisions loaded into files, and their files' keys
	sel   format.Selection
	n     atomic.Int64 // len(dirs), read without mu on every FUSE call
}

func newDirSet(sel format.Selection) *dirSet {
	return &dirSet{dirs: map[uint64]pendingDir{}, calls: map[uint64]*fetchCall{},
		files: map[string][]format.TreeEntry{}, revs: map[string]func(string) (string, int){}, sel: sel}
}

// unmade counts the files of pending directories whose revision's
// manifest is loaded (after a crash, it is read again on first use).
func (d *dirSet) unmade() (files int, bytes int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, pd := range d.dirs {
		for _, te := range d.files[pd.rev+"\x00"+pd.origPath] {
			files++
			bytes += te.Size
		}
	}
	return files, bytes
}

// load indexes a revision's files by parent directory; x is an archive's
// index. Must hold d.mu.
func (d *dirSet) load(rev string, entries []format.TreeEntry, x *format.ArchiveIndex) {
	if d.revs[rev] != nil {
		return
	}
	d.revs[rev] = fileKeys(rev, x)
	for _, te := range entries {
		if te.Type == format.TypeFile {
			k := rev + "\x00" + parentDir(te.Path)
			d.files[k] = append(d.files[k], te)
		}
	}
}

func parentDir(p string) string {
	if dir := path.Dir(p); dir != "." {
		return dir
	}
	return ""
}

// markDir records dir (absolute, at manifest path orig) as pending.
func (d *dirSet) markDir(dir, orig, rev string) error {
	if err := unix.Lsetxattr(dir, PendingDirXattr(), []byte(rev+"\x00"+orig), 0); err != nil {
		return fmt.Errorf("mark directory %s: %w", dir, err)
	}
	id, err := idOfPath(dir)
	if err != nil {
		return err
	}
	d.mu.Lock()
	if _, ok := d.dirs[id.ino]; !ok {
		d.n.Add(1)
	}
	d.dirs[id.ino] = pendingDir{rev: rev, origPath: orig, handle: id.handle}
	d.mu.Unlock()
	return nil
}

// deferFiles marks, after a lazy restore into root, every directory that
// will hold files; entries are the restored (selected) entries of rev.
func (d *dirSet) deferFiles(root, rev string, entries []format.TreeEntry, x *format.ArchiveIndex) error {
	d.mu.Lock()
	d.load(rev, entries, x)
	var dirs []string
	for k := range d.files {
		if r, dir, _ := strings.Cut(k, "\x00"); r == rev {
			dirs = append(dirs, dir)
		}
	}
	d.mu.Unlock()
	for _, dir := range dirs {
		abs := filepath.Join(root, filepath.FromSlash(dir))
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return err
		}
		if err := d.markDir(abs, dir, rev); err != nil {
			return err
		}
	}
	return nil
}

// EnsureDir makes the placeholders of the directory at rel (relative to
// the working directory) if they are not made yet, blocking until they
// are. Concurrent callers for one directory share one population.
func (w *Workspace) ensureDir(ctx context.Context, rel string) error {
	l := w.lazyState()
	if l == nil || l.dirs == nil || l.dirs.n.Load() == 0 {
		return nil
	}
	p := filepath.Join(l.dir, filepath.FromSlash(rel))
	id, st, err := idAt(unix.AT_FDCWD, p)
	if err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil
	}
	return w.populate(ctx, l, id, p)
}

func (w *Workspace) populate(ctx context.Context, l *lazyState, id fileID, dir string) error {
	d := l.dirs
	var pd pendingDir
	ino := id.ino
	return shareCall(ctx, w.fetchCtx, w.opts.FetchTimeout, &d.mu, d.calls, ino,
		func() (ok bool) { pd, ok = d.dir(id); return ok },
		func(ctx context.Context) error {
			err := w.fillDir(ctx, l, id, pd, dir)
			if err != nil {
				w.log.Error("make placeholders", "op", "populate", "path", dir, "revision", pd.rev, "err", err)
			}
			return err
		},
		func(err error) {
			if _, ok := d.dir(id); err == nil && ok {
				delete(d.dirs, ino)
				d.n.Add(-1)
			}
		})
}

// fillDir makes the placeholders of one pending directory, then clears its
// marker.
func (w *Workspace) fillDir(ctx context.Context, l *lazyState, id fileID, pd pendingDir, dir string) error {
	d := l.dirs
	d.mu.Lock()
	loaded := d.revs[pd.rev] != nil
	d.mu.Unlock()
	// The stat data saved with the revision show only for a restore made
	// in this process, whose numbers the view knows from the start.
	view := w.view
	if !loaded {
		view = nil
		// Resumed after a crash: read the revision's manifest, or
		// index, again.
		var entries []format.TreeEntry
		var x *format.ArchiveIndex
		if strings.HasSuffix(pd.rev, format.ArchiveExt) {
			var err error
			if x, err = w.archiveIndex(ctx, pd.rev); err != nil {
				return err
			}
			if x == nil {
				return amlerr.New(amlerr.InvalidStore, pd.rev, "a lazily restored directory's archive has no index")
			}
			entries = d.sel.Filter(x.Tree())
		} else {
			m, err := w.manifest(ctx, format.Entry{Path: pd.rev, Format: format.FormatFolder})
			if err != nil {
				return err
			}
			entries = d.sel.Filter(m.Entries)
		}
		d.mu.Lock()
		d.load(pd.rev, entries, x)
		d.mu.Unlock()
	}
	d.mu.Lock()
	files := d.files[pd.rev+"\x00"+pd.origPath]
	keyOf := d.revs[pd.rev]
	d.mu.Unlock()
	base := w.baseTree()
	w.lmu.Lock()
	made := w.onMade
	w.lmu.Unlock()
	dirfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dirfd)
	// Making placeholders is not a change: the directory keeps its mtime.
	var dst unix.Stat_t
	if err := unix.Fstat(dirfd, &dst); err != nil {
		return err
	}
	// Only into the very directory that is still to populate: not one
	// made at its path, or with its inode number, since.
	if got, err := idOf(dirfd, &dst); err != nil || got != id {
		return fmt.Errorf("%s is no longer the directory %v to populate", dir, id)
	}
	mk := make([]byte, 4096)
	if _, err := unix.Getxattr(fmt.Sprintf("/proc/self/fd/%d", dirfd), PendingDirXattr(), mk); err != nil {
		if _, uerr := unix.Getxattr(fmt.Sprintf("/proc/self/fd/%d", dirfd), PendingDirUserXattr, mk); uerr != nil {
			return fmt.Errorf("%s is no longer a directory to populate: its marker: %w", dir, err)
		}
	}
	for _, te := range files {
		key, idx := keyOf(te.Path)
		stp, err := l.addPlaceholder(dirfd, dir, path.Base(te.Path), te, key, idx, view, made)
		if err != nil {
			return err
		}
		if stp.Ino != 0 && base != nil && base.dir == l.dir {
			base.add(te.Path, baseFile{stamp: stp, key: key}, pd.rev)
		}
	}
	if len(files) > 0 {
		ts := []unix.Timespec{unix.NsecToTimespec(dst.Atim.Nano()), unix.NsecToTimespec(dst.Mtim.Nano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, dir, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "utimensat", Path: dir, Err: err}
		}
	}
	if err := unix.Lremovexattr(dir, PendingDirXattr()); err != nil && !errors.Is(err, unix.ENODATA) {
		return err
	}
	unix.Lremovexattr(dir, PendingDirUserXattr) // an older amlfs's marker, if any
	return nil
}

// populateAll makes every pending directory's placeholders (before a save,
// which must see the whole tree, a prefetch, or native serving), in
// populateWorkers directories at once: making inodes is the kernel's work,
// and on ext4 much of it is CPU (after recent deletions, each new inode
// skips the recently deleted ones one by one).
func (w *Workspace) populateAll(ctx context.Context) error {
	l := w.lazyState()
	if l == nil || l.dirs == nil || l.dirs.n.Load() == 0 {
		return nil
	}
	type dir struct {
		path string
		id   fileID
	}
	var dirs []dir
	err := filepath.WalkDir(l.dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.IsDir() {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if id, err := idOfPath(p); err == nil {
			dirs = append(dirs, dir{p, id})
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Every directory is tried; the first error is returned.
	var g errgroup.Group
	g.SetLimit(populateWorkers)
	for _, d := range dirs {
		g.Go(func() error { return w.populate(ctx, l, d.id, d.path) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if n := l.dirs.n.Load(); n != 0 {
		return fmt.Errorf("%s: %d lazily restored directories could not be found to populate", l.dir, n)
	}
	return nil
}

// populateWorkers is how many directories populateAll fills at once.
const populateWorkers = 4
