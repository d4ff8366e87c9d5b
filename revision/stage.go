package revision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// Staging: a save whose writers can be held still (Options.Freeze) reads
// the tree once while they run, then holds them, reads again only what
// changed since, and copies the files it has to upload to a staging
// directory on the same disk (a reflink where the disk has them). Then it
// lets them go and uploads from the copies: the revision is the tree at
// the instant it was held, and the writers wait only as long as the
// second reading and the copies take, never for the store.

// staging is a save's copies of the files it uploads, by revision path.
type staging struct {
	dir   string
	files map[string]stagedFile
	gone  map[string]bool // files removed or replaced before the hold
	n     int             // the next copy's name
}

// stagedFile is one copy, and the stamp of the working-tree file it was
// taken from (its inode, size, mtime and ctime then).
type stagedFile struct {
	name  string
	stamp store.Stamp
}

// stageName is the staging directory in Options.StageDir: one at a time,
// since a workspace saves one at a time; one a crash left is removed by
// the next save.
const stageName = ".amlfs-stage"

// open opens p's copy, if p was staged.
func (s *staging) open(p string) (*os.File, store.Stamp, bool, error) {
	if s == nil {
		return nil, store.Stamp{}, false, nil
	}
	sf, ok := s.files[p]
	if !ok {
		return nil, store.Stamp{}, false, nil
	}
	f, err := os.Open(filepath.Join(s.dir, sf.name))
	return f, sf.stamp, true, err
}

// isGone reports a file the hold found removed or replaced.
func (s *staging) isGone(p string) bool { return s != nil && s.gone[p] }

func (s *staging) remove() {
	if s != nil {
		os.RemoveAll(s.dir)
	}
}

// stageWorkers is how many files are copied at once.
const stageWorkers = 4

// newStaging makes the staging directory, empty.
func (w *Workspace) newStaging() (*staging, error) {
	root := w.opts.StageDir
	if root == "" {
		root = os.TempDir()
	}
	s := &staging{dir: filepath.Join(root, stageName), files: map[string]stagedFile{}, gone: map[string]bool{}}
	if err := os.RemoveAll(s.dir); err != nil {
		return nil, err
	}
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		return nil, err
	}
	return s, nil
}

// stage copies to s each file of entries the save has to read (neither
// listed from the revision, virtual, nor unchanged since base), fetching
// a placeholder's bytes first, unless s has a copy of it as it is (same
// stamp). A file unchanged since base after all drops its copy.
//
// again says that entries is a later reading, of what changed since the
// first: a file copied before is copied again even if its stamp is the
// one its copy was taken at. A write sets the file's mtime and ctime
// before it writes its bytes, so a copy made while a write was under way
// has the stamp the file keeps once the write is done, and bytes of
// before and after it; a stamp cannot tell it from a whole copy.
func (w *Workspace) stage(ctx context.Context, t *tree, s *staging, dir string, entries []format.TreeEntry, virtual map[string]bool, base *baseTree, src *Workspace, again bool) error {
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(stageWorkers)
	for _, te := range entries {
		if te.Type != format.TypeFile || virtual[te.Path] {
			continue
		}
		stp := stampOf(te)
		_, reuse := base.reusableAs(dir, te.Path, stp)
		mu.Lock()
		sf, had := s.files[te.Path]
		if !reuse && had && sf.stamp == stp && !again {
			mu.Unlock()
			continue
		}
		delete(s.files, te.Path)
		delete(s.gone, te.Path)
		mu.Unlock()
		if reuse {
			continue
		}
		name := strconv.Itoa(s.n)
		s.n++
		g.Go(func() error {
			if err := src.ensure(gctx, te.Path); err != nil {
				return err
			}
			sf, gone, err := copyStaged(t, te.Path, filepath.Join(s.dir, name))
			if errors.Is(err, store.ErrUnsettled) {
				// Written without pause by something not held: the
				// upload reads it again, as without a hold.
				return nil
			}
			if err != nil {
				return fmt.Errorf("stage %s: %w", te.Path, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if gone {
				s.gone[te.Path] = true
			} else {
				sf.name = name
				s.files[te.Path] = sf
			}
			return nil
		})
	}
	return g.Wait()
}

// copyStaged copies the working-tree file rel of t to the new file to,
// by reflink where the disk can, else by copy_file_range. Held writers
// write nothing, so one copy between equal stamps is the file at one
// instant; a file that changed all the same is read as ReadStable reads.
func copyStaged(t *tree, rel, to string) (stagedFile, bool, error) {
	f, gone, err := openSaved(t, rel)
	if err != nil || gone {
		return stagedFile{}, gone, err
	}
	defer f.Close()
	out, err := os.OpenFile(to, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return stagedFile{}, false, err
	}
	defer out.Close()
	// The owner's bits of the file's mode, which a store may keep (a
	// file store's object is no more readable than its file, and keeps
	// its owner's execute bit); the staging directory is the daemon's
	// alone.
	if fi, err := f.Stat(); err == nil {
		if err := out.Chmod(fi.Mode().Perm()&0o700 | 0o600); err != nil {
			return stagedFile{}, false, err
		}
	}
	copyOnce := func(size int64) error {
		if err := out.Truncate(0); err != nil {
			return err
		}
		if unix.IoctlFileClone(int(out.Fd()), int(f.Fd())) == nil {
			return nil
		}
		if _, err := out.Seek(0, 0); err != nil {
			return err
		}
		_, err := store.CopyExactly(out, f, size)
		return err
	}
	before, err := store.FileStamp(f)
	if err != nil {
		return stagedFile{}, false, err
	}
	if err := copyOnce(int64(before.Size)); err == nil {
		if after, err := store.FileStamp(f); err == nil && after == before {
			if fi, err := out.Stat(); err == nil && fi.Size() == int64(before.Size) {
				return stagedFile{stamp: before}, false, nil
			}
		}
	}
	st, err := store.ReadStable(f, func(size int64, attempt int) error { return copyOnce(size) })
	return stagedFile{stamp: st}, false, err
}

// readHeld is the rest of the reading of a save with Options.Freeze, given
// its first reading, taken while the writers ran (with its listings): it
// copies what that reading must upload to staging, then holds the writers,
// reads again the directories that changed since the save began (all,
// when that is not known), copies again the files to upload in them (a
// copy taken while the writers ran may hold a write under way), and lets
// the writers go. The writers wait only for the second
// reading and its copies, however large the tree. Without a hold (the
// writers could not be held), it returns the first reading, and no
// staging: the upload reads the tree as without.
func (w *Workspace) readHeld(ctx context.Context, dir string, sel format.Selection, prep func(string) ([]format.TreeEntry, error), base *baseTree, src *Workspace,
	first snapResult) (*staging, []format.TreeEntry, []string, map[string]bool, error) {
	t, err := openTree(dir)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	defer t.Close()
	s, err := w.newStaging()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.remove()
		}
	}()
	if err := w.stage(ctx, t, s, dir, first.entries, first.virtual, base, src, false); err != nil {
		return nil, nil, nil, nil, err
	}
	start := time.Now()
	clean, thaw, err := w.opts.Freeze(ctx)
	if err != nil {
		w.log.Warn("could not hold the writers; the save reads the tree as it changes", "op", "save", "err", err)
		return nil, first.entries, first.skipped, first.virtual, nil
	}
	defer thaw()
	r, err := snapshotWith(dir, sel, walkOpts{prep: prep, prev: first.listings, clean: clean, unsorted: true})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	// Only a file listed again may have changed since its copy.
	check := r.fresh
	if clean == nil {
		check = r.entries
	}
	if err := w.stage(ctx, t, s, dir, check, r.virtual, base, src, true); err != nil {
		return nil, nil, nil, nil, err
	}
	thaw()
	took := time.Since(start)
	sortSnapshot(r)
	w.log.Debug("read the tree with its writers held", "op", "save", "held_seconds", took.Seconds(), "listed_again", len(check), "staged", len(s.files), "changed_only", clean != nil)
	ok = true
	return s, r.entries, r.skipped, r.virtual, nil
}

// maxStage bounds the bytes a save copies to staging before it uploads
// them. A larger change (a first save of a large tree, say) is uploaded
// as it is read: with Options.Freeze, with the writers held until it is
// uploaded; with Options.Watch, read again whole if it changed meanwhile.
var maxStage int64 = 1 << 30 // a variable for tests

// stageable reports whether the files the reading r must upload are few
// enough to copy to staging first.
func (w *Workspace) stageable(dir string, r snapResult, base *baseTree) bool {
	var n int64
	for _, te := range r.entries {
		if te.Type != format.TypeFile || r.virtual[te.Path] {
			continue
		}
		if _, ok := base.reusableAs(dir, te.Path, stampOf(te)); !ok {
			if n += te.Size; n > maxStage {
				return false
			}
		}
	}
	return true
}

// readWatched is the reading of a save whose writers cannot be held, but
// whose changes are watched (Options.Watch), given its first snapshot
// and the watch it began under: it copies the files to upload to
// staging, and if the tree changed meanwhile, reads it again, up to
// SaveAttempts times in all, copying again the files to upload (a copy
// may hold a write that was under way). The upload then reads the copies, once: a tree that keeps
// changing costs local copies of what changed, not uploads. After the
// last attempt, each file is its bytes at one instant, the tree is not
// (unsettled).
func (w *Workspace) readWatched(ctx context.Context, dir string, sel format.Selection, prep func(string) ([]format.TreeEntry, error), base *baseTree, src *Workspace,
	r snapResult, changed func() bool) (s *staging, entries []format.TreeEntry, skipped []string, virtual map[string]bool, attempts int, unsettled bool, err error) {
	t, err := openTree(dir)
	if err != nil {
		return nil, nil, nil, nil, 0, false, err
	}
	defer t.Close()
	if s, err = w.newStaging(); err != nil {
		return nil, nil, nil, nil, 0, false, err
	}
	defer func() {
		if err != nil {
			s.remove()
		}
	}()
	for attempts = 1; ; attempts++ {
		if err := w.stage(ctx, t, s, dir, r.entries, r.virtual, base, src, attempts > 1); err != nil {
			return nil, nil, nil, nil, 0, false, err
		}
		if !changed() {
			break
		}
		if !w.readAgain(attempts) {
			unsettled = true
			break
		}
		changed = w.opts.Watch()
		if r, err = snapshotWith(dir, sel, walkOpts{prep: prep}); err != nil {
			return nil, nil, nil, nil, 0, false, err
		}
	}
	return s, r.entries, r.skipped, r.virtual, attempts, unsettled, nil
}
