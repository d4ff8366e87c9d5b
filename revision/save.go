package revision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
)

// SaveResult describes a published revision.
type SaveResult struct {
	Entry         format.Entry
	Files         int
	Bytes         int64
	Uploaded      int   // files whose bytes were written to the store
	UploadedBytes int64 // their bytes
	Reused        int   // unchanged files linked or copied from the previous revision
	BaseGone      int   // unchanged files whose base object another writer pruned: uploaded instead
	Symlinks      int
	Skipped       []string // special files left out, by path
	Pruned        []string
	Elapsed       time.Duration
	// Attempts is how many times the tree was read (Options.Watch); 1
	// without a Watch.
	Attempts int
	// Unsettled: the tree changed during every attempt, so the revision
	// is not the tree at one instant (each file still is its bytes at
	// one instant).
	Unsettled bool
	// Earlier names the files that changed during every reading (a writer
	// holding them open rewrote them without pause), saved with their
	// bytes of the previous revision, an earlier instant; LeftOut, such
	// files the previous revision did not have, which this one does not
	// either. The next save reads them again.
	Earlier, LeftOut []string
}

// SaveAttempts bounds how many times a save reads a tree that keeps
// changing under it (Options.Watch).
const SaveAttempts = 3

// Save snapshots dir per sel and publishes it as a new current revision,
// following AML's order: snapshot, check limits, upload with
// create-if-absent, publish conditionally, then prune. If publication fails
// the upload is removed and the previous revision stays current. revID may
// be "" for a fresh UUID.
func (w *Workspace) Save(ctx context.Context, dir string, sel format.Selection, revID string) (SaveResult, error) {
	return w.save(ctx, dir, sel, revID, w, w.opts.Retention)
}

// SaveRetaining is Save keeping retention revisions, counting the new
// one, instead of Options.Retention, for this save only.
func (w *Workspace) SaveRetaining(ctx context.Context, dir string, sel format.Selection, revID string, retention int) (SaveResult, error) {
	if retention < 1 {
		return SaveResult{}, amlerr.New(amlerr.InvalidConfig, w.opts.ID, "retention must be at least 1, not %d", retention)
	}
	return w.save(ctx, dir, sel, revID, w, retention)
}

// save publishes the tree at dir, which is src's working tree: w's own, or
// for a fork (commit --fork) the tree of the mounted workspace src. It
// reuses src's base revision's objects and fetches through src's lazy
// restore; only for w's own tree does the tree become w's new base.
func (w *Workspace) save(ctx context.Context, dir string, sel format.Selection, revID string, src *Workspace, retention int) (SaveResult, error) {
	if src != w {
		src.mu.Lock()
		defer src.mu.Unlock()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prunes.Wait() // the last save's pruning, if still under way
	if src == w {
		w.startFills()
		defer w.stopFills()
	}
	start := time.Now()
	fail := func(err error) (SaveResult, error) {
		w.orphansMaybe = true // a failed save may leave its artifact behind
		if c := amlerr.Code(err); c == amlerr.SaveFailed || c == amlerr.PublishConflict {
			return SaveResult{}, err
		}
		return SaveResult{}, amlerr.Wrap(amlerr.SaveFailed, w.opts.ID, err)
	}
	if revID == "" {
		revID = uuid.NewString()
	} else if err := format.ValidateRevisionID(revID); err != nil {
		return SaveResult{}, amlerr.Wrap(amlerr.InvalidConfig, revID, err)
	}
	if w.index != nil {
		if _, dup := w.index.Find(revID); dup {
			return SaveResult{}, amlerr.New(amlerr.RevisionIDConflict, revID, "revision id already exists in %s", w.store)
		}
	}
	// A lease the heartbeat found lost fails the save now; the store is
	// asked only before publication.
	if w.lease != nil {
		if err := w.lease.LostErr(); err != nil {
			return fail(err)
		}
	}
	if err := w.staleBase(); err != nil {
		return fail(err)
	}
	// An earlier publication whose outcome is not known is settled
	// first: it may be the index's current revision now.
	w.settleUnknown(ctx)
	// A writer that published since this tree was loaded makes this save
	// stale: say so now, before uploading anything (and before reusing
	// objects of a base revision it may have pruned). Publication below
	// stays conditional for a writer that comes in between.
	// A new workspace made here (w.created) is published only if there
	// is still none: nothing to check first.
	if !w.created {
		if err := w.checkNotStale(ctx); err != nil {
			return fail(err)
		}
	}
	// The files open for writing as the save begins: their bytes may
	// change with no change of stamp.
	writers := w.writers(nil)
	// 1 to 3, once per attempt (Options.Watch).
	var (
		entry     format.Entry
		skipped   []string
		up        uploadStats
		attempt   int
		unsettled bool
	)
	for attempt = 1; ; attempt++ {
		var changed func() bool
		if w.opts.Watch != nil {
			changed = w.opts.Watch()
		}
		var err error
		entry, skipped, up, err = w.readTree(ctx, dir, sel, revID, src, changed)
		if errors.Is(err, format.ErrArchiveTooLarge) && w.autoFormat && w.opts.Format == format.FormatArchive {
			// The format was amlfs's choice: a tree too large for an
			// archive is saved as a folder, whose files have no such
			// bound, and stays one.
			w.log.Warn("the tree is over --max-archive-bytes as an archive: saving it as a folder revision from now on", "op", "save", "err", err)
			w.opts.Format = format.FormatFolder
			entry, skipped, up, err = w.readTree(ctx, dir, sel, revID, src, nil)
		}
		if amlerr.Code(err) == amlerr.RevisionIDConflict {
			return SaveResult{}, err
		} else if err != nil {
			return fail(err)
		}
		if up.attempts > 0 {
			// Read, as often as it took, into staging, then uploaded
			// once (readWatched).
			attempt, unsettled = up.attempts, up.unsettled
			break
		}
		if changed == nil || up.held || !changed() {
			break
		}
		if !w.readAgain(attempt) {
			unsettled = true
			break
		}
		// The next attempt uploads under the same id.
		if err := w.store.Remove(context.WithoutCancel(ctx), entry.Path); err != nil {
			return fail(fmt.Errorf("remove the unsettled attempt's artifact: %w", err))
		}
	}
	// And as it ends: one opened while it read.
	writers = w.writers(writers)
	// 4. Publish.
	next, pruned := w.index.WithNew(entry, retention)
	data, err := next.Marshal()
	if err == nil && w.lease != nil {
		err = w.lease.Lost()
	}
	var ver string
	if err == nil {
		ver, err = w.store.PublishIndex(ctx, data, w.version)
		if err != nil {
			// A timeout, a reset, a 5xx, even a failed precondition
			// (a retry of a request that landed) may follow a
			// publication that happened: the index read back says.
			ver, err = w.settle(ctx, entry, data, err)
		}
	}
	// published does what follows a publication: the new index, the new
	// base, the repointing and pruning.
	published := func(next *format.Index, ver string) {
		var moves map[uint64]repointTo
		var listed map[fileID]string
		w.imu.Lock()
		w.index, w.version = next, ver
		w.imu.Unlock()
		w.created = false
		w.expect = nil // the tree is now the new revision's
		w.setFork(nil)
		if src == w {
			b := &baseTree{dir: dir, rev: entry.ID, revPath: entry.Path, files: up.stamps, index: up.index}
			w.setBaseAfterFills(b)
			b.distrust(writers) // after the fills, which may restamp a file
			moves, listed = up.moves, up.listed
		}
		if len(pruned) > 0 || len(moves) > 0 || len(listed) > 0 {
			// After the save returns, in this order: placeholders not
			// fetched yet take their bytes from the new revision, where the
			// save copied them (a marker rewritten per placeholder: seconds
			// for a lazily restored tree of 100k files); then the pruned
			// revisions go, their bytes a placeholder still needs fetched
			// first. The next save waits for both.
			w.prunes.Add(1)
			go func() {
				defer w.prunes.Done()
				w.repoint(moves)
				w.repointDirs(context.WithoutCancel(ctx), listed, entry.Path, up.index)
				if len(pruned) > 0 {
					w.prune(context.WithoutCancel(ctx), pruned)
				}
			}()
		}
	}
	if errors.Is(err, errOutcomeUnknown) {
		// Nothing the index may name is removed: the artifact stays,
		// and the next save (or mount) settles the outcome first.
		w.unknown = &unknownPub{entry: entry, prev: w.version, published: published}
		return fail(err)
	}
	if errors.Is(err, errSuperseded) {
		return fail(err) // the index names it: nothing is removed
	}
	if err != nil {
		// 6. Remove the orphan upload; the previous revision stays current.
		w.removeUnpublished(ctx, entry.Path)
		if errors.Is(err, store.ErrPrecondition) && w.created {
			return SaveResult{}, amlerr.New(amlerr.InvalidConfig, w.opts.ID, "workspace %q already exists in %s; --fork makes a new workspace (nothing was published)", w.opts.ID, w.store)
		}
		if errors.Is(err, store.ErrPrecondition) {
			return fail(amlerr.Wrap(amlerr.PublishConflict, w.opts.ID, fmt.Errorf("%w; the previous revision is still current, nothing was overwritten, and the tree is kept", err)))
		}
		return fail(err)
	}
	// 5. Prune, after publication, without holding the save up.
	w.dropUnknown(ctx, w.version)
	published(next, ver)
	total, files := treeSize(up.entries)
	res := SaveResult{Entry: entry, Files: files, Bytes: total, Uploaded: up.uploaded, UploadedBytes: up.uploadedBytes, Reused: up.reused,
		BaseGone: up.baseGone, Symlinks: countType(up.entries, format.TypeSymlink), Skipped: skipped, Attempts: attempt, Unsettled: unsettled,
		Earlier: up.earlier, LeftOut: up.leftOut}
	for _, p := range up.earlier {
		w.log.Warn("a file changed during every reading: saved with its bytes of the previous revision (the next save reads it again)", "op", "save", "path", p)
	}
	for _, p := range up.leftOut {
		w.log.Warn("a new file changed during every reading: left out of this revision (the next save reads it again)", "op", "save", "path", p)
	}
	for _, p := range pruned {
		res.Pruned = append(res.Pruned, p.ID)
	}
	if w.orphansMaybe {
		w.cleanOrphans(ctx)
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// readAgain says whether a save whose reading attempt saw the tree
// change reads it again: not after SaveAttempts attempts, when the
// revision is not one instant (unsettled). It logs which.
func (w *Workspace) readAgain(attempt int) bool {
	if attempt == SaveAttempts {
		w.log.Warn("the tree changed during every attempt of the save: each file is saved as its bytes at one instant, the tree is not one instant", "op", "save", "attempts", attempt)
		return false
	}
	w.log.Info("the tree changed while the save read it; reading it again", "op", "save", "attempt", attempt)
	return true
}

// readTree is steps 1 to 3 of a save: 1. snapshot (of the whole tree:
// lazily restored directories get their placeholders first), 2. limits,
// 3. upload the artifact of revision revID. Must hold w.mu.
//
// changed, if not nil, is the watch of Options.Watch the reading began
// under: the tree is read into staging until a reading sees no change
// (readWatched), and the attempts are reported in up.
func (w *Workspace) readTree(ctx context.Context, dir string, sel format.Selection, revID string, src *Workspace, changed func() bool) (entry format.Entry, skipped []string, up uploadStats, err error) {
	// A lazily restored directory's files not made yet are listed from
	// the revision where they can be (virtual.go); the rest are made.
	base, _ := w.reusableBase(src)
	ps := w.snapshotPending(ctx, src, base, dir, sel)
	var prep func(string) ([]format.TreeEntry, error)
	if ps != nil {
		prep = ps.prepare
	} else if err := src.populateAll(ctx); err != nil {
		return entry, nil, up, err
	}
	held := w.opts.Freeze != nil
	first, err := snapshotWith(dir, sel, walkOpts{prep: prep, record: held})
	if err != nil {
		return entry, nil, up, err
	}
	entries, skipped, virtual := first.entries, first.skipped, first.virtual
	var staged *staging
	var attempts int
	var unsettled, heldWhole bool
	switch {
	case held && w.stageable(dir, first, base):
		if staged, entries, skipped, virtual, err = w.readHeld(ctx, dir, sel, prep, base, src, first); err != nil {
			return entry, nil, up, err
		}
	case held:
		// Too much changed to copy first (a first save of a large
		// tree): the writers are held until it is uploaded.
		clean, thaw, ferr := w.opts.Freeze(ctx)
		if ferr != nil {
			w.log.Warn("could not hold the writers; the save reads the tree as it changes", "op", "save", "err", ferr)
			break
		}
		defer thaw()
		r, err := snapshotWith(dir, sel, walkOpts{prep: prep, prev: first.listings, clean: clean})
		if err != nil {
			return entry, nil, up, err
		}
		entries, skipped, virtual, heldWhole = r.entries, r.skipped, r.virtual, true
	case changed != nil && w.stageable(dir, first, base):
		if staged, entries, skipped, virtual, attempts, unsettled, err = w.readWatched(ctx, dir, sel, prep, base, src, first, changed); err != nil {
			return entry, nil, up, err
		}
	}
	defer staged.remove()
	if len(skipped) > 0 && w.opts.StrictEntries {
		return entry, nil, up, SpecialFilesError(skipped)
	}
	for _, p := range skipped {
		w.log.Warn("special file not saved (a socket, fifo or device)", "op", "snapshot", "path", p)
	}
	total, files := treeSize(entries)
	if err := w.opts.Limits.Check(w.opts.ID, len(entries), total); err != nil {
		return entry, nil, up, err
	}
	if w.opts.Format == format.FormatFolder {
		if err := w.opts.Limits.CheckManifest(entries, w.Fork()); err != nil {
			return entry, nil, up, err
		}
	}
	entry = format.Entry{ID: revID, Format: w.opts.Format, Path: format.RevisionPath(revID, w.opts.Format), CreatedAt: format.FormatCreatedAt(w.opts.Now())}
	prog := startProgress(w.opts.Progress, "save", int64(files), total)
	up, err = w.upload(ctx, dir, entry, entries, virtual, prog, src, staged)
	up.listed = ps.listed()
	up.held = staged != nil || heldWhole
	up.attempts, up.unsettled = attempts, unsettled
	prog.finish()
	if errors.Is(err, store.ErrExist) {
		err = amlerr.New(amlerr.RevisionIDConflict, revID, "an artifact for this revision id already exists in %s", w.store)
	}
	return entry, skipped, up, err
}

// uploadStats is what an upload did, and the stamps of the files it saved.
type uploadStats struct {
	entries          []format.TreeEntry // as saved: sizes and mtimes of the bytes read
	uploaded, reused int
	baseGone         int // reusable files whose base object was gone, uploaded instead
	uploadedBytes    int64
	stamps           map[string]baseFile
	moves            map[uint64]repointTo // reused placeholders, by inode
	listed           map[fileID]string    // pending directories listed from the base (virtual.go)
	index            *format.ArchiveIndex // an archive's
	earlier, leftOut []string             // files unsettled (SaveResult)
	// held: the tree was read while its writers were held (staging):
	// it is the tree at one instant, to read no second time.
	held bool
	// attempts, if not 0, is how many times readWatched read the tree;
	// unsettled, that it changed during each.
	attempts  int
	unsettled bool
}

// upload writes the artifact. For a folder revision, a file unchanged since
// the base tree (same stamp) reuses the base revision's object; only the
// rest is uploaded. Must hold w.mu.
func (w *Workspace) upload(ctx context.Context, dir string, entry format.Entry, entries []format.TreeEntry, virtual map[string]bool, prog *progress, src *Workspace, staged *staging) (up uploadStats, err error) {
	if entry.Format == format.FormatArchive {
		return w.uploadArchive(ctx, dir, entry, entries, virtual, prog, src, staged)
	}
	if len(virtual) > 0 {
		return up, fmt.Errorf("internal error: a folder save listed %d files not made", len(virtual))
	}
	st, err := w.store.Stage(ctx, entry.Path)
	if err != nil {
		return up, err
	}
	st.OnWritten(func(name string, n int64) {
		if name == "" || strings.HasPrefix(name, "files/") { // not the manifest
			prog.bytes.Add(n)
			prog.fileDone()
		}
	})
	defer func() {
		if err != nil {
			st.Abort(context.WithoutCancel(ctx))
		}
	}()
	base, baseKey := w.reusableBase(src)
	t, err := openTree(dir)
	if err != nil {
		return up, err
	}
	defer t.Close()
	up.stamps = make(map[string]baseFile, len(entries))
	var mu sync.Mutex // guards entries, up, unsettled while uploads land
	gone := map[string]bool{}
	var unsettled []int // entries whose file changed during every reading
	for i, te := range entries {
		if te.Type != format.TypeFile {
			continue
		}
		if err := ctx.Err(); err != nil {
			return up, err
		}
		name := "files/" + te.Path
		var key string
		var stp store.Stamp
		var ok bool
		if staged != nil {
			// Decided while the writers were held: unchanged then,
			// or staged.
			stp = stampOf(te)
			key, ok = base.reusableAs(dir, te.Path, stp)
		} else {
			key, stp, ok = base.reusable(dir, te.Path)
		}
		key = baseKey(key)
		if ok && stp.Size == uint64(te.Size) {
			var f *os.File
			var isGone bool
			var err error
			if !placeholderAt(t, te.Path) {
				// Not a placeholder: its bytes are here, to write if
				// the base's object is gone.
				if f, isGone, err = openSaved(t, te.Path); err != nil {
					return up, err
				}
			}
			if !isGone {
				if f != nil && isPlaceholder(f) {
					// Its bytes are only in the base: nothing to
					// upload from here if that is gone.
					f.Close()
					f = nil
				}
				err = st.Reuse(ctx, name, key, f, func(read *store.Stamp, err error) {
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						// Its base was pruned, and it changed during
						// every reading.
						unsettled = append(unsettled, i)
						return
					}
					if read != nil {
						// Its base was pruned: uploaded from the tree.
						fromStamp(&entries[i], *read)
						up.uploaded++
						up.uploadedBytes += int64(read.Size)
						up.baseGone++
						up.stamps[te.Path] = baseFile{stamp: *read, key: entry.Path + name}
						return
					}
					up.reused++
					if up.moves == nil {
						up.moves = map[uint64]repointTo{}
					}
					up.moves[stp.Ino] = repointTo{path: te.Path, key: entry.Path + name, idx: -1}
					up.stamps[te.Path] = baseFile{stamp: stp, key: entry.Path + name}
				})
				if err != nil {
					return up, err
				}
				continue
			}
		}
		f, held, isHeld, err := staged.open(te.Path)
		if err != nil {
			return up, err
		}
		if !isHeld {
			if staged.isGone(te.Path) {
				gone[te.Path] = true // removed or replaced before the hold
				continue
			}
			// A placeholder gets its bytes before they are read.
			if err := src.ensure(ctx, te.Path); err != nil {
				return up, err
			}
			var isGone bool
			if f, isGone, err = openSaved(t, te.Path); err != nil {
				return up, err
			}
			if isGone {
				gone[te.Path] = true // removed or replaced since the snapshot
				continue
			}
		}
		err = st.PutFile(ctx, name, f, func(stp store.Stamp, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				unsettled = append(unsettled, i)
				return
			}
			if isHeld {
				stp = held // the working-tree file's, not its copy's
			}
			// The manifest holds the bytes as read: their size and
			// mtime, which may be newer than the snapshot's.
			fromStamp(&entries[i], stp)
			up.uploaded++
			up.uploadedBytes += int64(stp.Size)
			up.stamps[te.Path] = baseFile{stamp: stp, key: entry.Path + name}
		})
		if err != nil {
			return up, err
		}
	}
	if err := st.Flush(ctx); err != nil {
		return up, err
	}
	// A file that changed during every reading is saved with its bytes
	// of the base revision, an earlier instant, if it has them; else it
	// is left out. Its stamp is not recorded: the next save reads it.
	for _, i := range unsettled {
		te := entries[i]
		bf, ok := base.earlier(te.Path)
		if !ok {
			gone[te.Path] = true
			up.leftOut = append(up.leftOut, te.Path)
			continue
		}
		err := st.Reuse(ctx, "files/"+te.Path, baseKey(bf.key), nil, func(*store.Stamp, error) {})
		if errors.Is(err, store.ErrNotExist) || amlerr.Code(err) == amlerr.BaseRevisionGone {
			gone[te.Path] = true
			up.leftOut = append(up.leftOut, te.Path)
			continue
		} else if err != nil {
			return up, err
		}
		fromStamp(&entries[i], bf.stamp)
		up.reused++
		up.earlier = append(up.earlier, te.Path)
	}
	if err := st.Flush(ctx); err != nil {
		return up, err
	}
	up.entries = entries
	if len(gone) > 0 {
		up.entries = make([]format.TreeEntry, 0, len(entries))
		for _, te := range entries {
			if !gone[te.Path] {
				up.entries = append(up.entries, te)
			}
		}
	}
	// The manifest keeps the inode numbers and ctimes the mount shows.
	for i, te := range up.entries {
		if te.Stat.Ino != 0 {
			showStat(&up.entries[i], src.view, te.Stat.Ino, int64(te.Stat.Ctime))
		}
	}
	// Files may have grown since the snapshot's check.
	if total, _ := treeSize(up.entries); total > 0 {
		if err := w.opts.Limits.Check(w.opts.ID, len(up.entries), total); err != nil {
			return up, err
		}
	}
	m := format.NewManifest(up.entries)
	if f := w.Fork(); f != nil {
		if m.Ext == nil {
			m.Ext = &format.ManifestExt{}
		}
		m.Ext.Fork = f
	}
	data, err := m.Marshal(w.opts.Limits)
	if err != nil {
		return up, err
	}
	if err := st.Put(ctx, "manifest.json", bytes.NewReader(data), int64(len(data))); err != nil {
		return up, err
	}
	return up, st.Commit(ctx)
}

// reusableBase is the base tree a save of src's tree may reuse objects
// of, and how w's store names its keys. Only a base revision the index
// still holds, or another workspace's (a fork's source: if it is gone,
// the bytes come from the tree).
func (w *Workspace) reusableBase(src *Workspace) (*baseTree, func(string) string) {
	base := src.baseTree()
	if base != nil && !store.IsForeign(base.revPath) && (src.index == nil || !hasRevision(src.index, base.rev)) {
		base = nil
	}
	baseKey := func(k string) string { return k }
	if src != w {
		baseKey = src.store.(store.Family).Foreign
	}
	return base, baseKey
}

// treeSize returns the bytes and the number of the files in es.
func treeSize(es []format.TreeEntry) (bytes int64, files int) {
	for _, te := range es {
		if te.Type == format.TypeFile {
			bytes += te.Size
			files++
		}
	}
	return bytes, files
}

func countType(es []format.TreeEntry, typ string) int {
	n := 0
	for _, te := range es {
		if te.Type == typ {
			n++
		}
	}
	return n
}

func hasRevision(idx *format.Index, id string) bool {
	_, ok := idx.Find(id)
	return ok
}

// prune removes the artifacts of revisions a publication dropped from the
// index, several at once, never one whose bytes a lazily restored file
// still needs: those are fetched first, and a revision whose files could
// not all be fetched is left for a later save's orphan check.
func (w *Workspace) prune(ctx context.Context, pruned []format.Entry) {
	var g errgroup.Group
	g.SetLimit(pruneParallel)
	for _, p := range pruned {
		g.Go(func() error {
			if !w.fetchFrom(ctx, p.Path) {
				w.log.Warn("not pruning a revision whose bytes a lazily restored file still needs", "op", "prune", "path", p.Path, "revision", p.ID)
				return nil
			}
			if err := w.store.Remove(ctx, p.Path); err != nil {
				w.log.Warn("prune revision", "op", "prune", "path", p.Path, "revision", p.ID, "err", err)
			}
			return nil
		})
	}
	g.Wait()
}

// neededArtifacts are the artifacts lazily restored files still take
// their bytes from: a prune that could not fetch them all left them.
func (w *Workspace) neededArtifacts() map[string]bool {
	l := w.lazyState()
	if l == nil {
		return map[string]bool{}
	}
	out := l.artifactsInUse()
	if d := l.dirs; d != nil {
		d.mu.Lock()
		for _, pd := range d.dirs {
			out[pd.rev] = true
		}
		d.mu.Unlock()
	}
	return out
}

// pruneParallel is how many revisions are pruned at once.
const pruneParallel = 4

// cleanOrphans removes artifacts the index does not name, left by a crashed
// or failed save: after the first save of this process, and after a
// failed one (orphansMaybe), not after every save (it lists the store). It
// runs only under the lease, when no other writer can be between upload
// and publish.
func (w *Workspace) cleanOrphans(ctx context.Context) {
	if w.lease == nil || w.index == nil {
		return
	}
	w.orphansMaybe = false
	keys, err := w.store.Artifacts(ctx)
	if err != nil {
		w.log.Warn("list artifacts", "op", "list", "path", w.store.String(), "err", err)
		return
	}
	known := map[string]bool{}
	for _, e := range w.index.Revisions {
		known[e.Path] = true
	}
	needed := w.neededArtifacts()
	for _, k := range keys {
		if known[k] || needed[k] {
			continue
		}
		w.log.Info("remove orphan artifact", "path", k)
		if err := w.store.Remove(ctx, k); err != nil {
			w.log.Warn("remove orphan artifact", "op", "remove-orphan", "path", k, "err", err)
		}
	}
}

// checkNotStale fails if another writer published since this tree was
// loaded.
func (w *Workspace) checkNotStale(ctx context.Context) error {
	_, ver, err := w.store.ReadIndex(ctx)
	if err != nil && !errors.Is(err, store.ErrNotExist) {
		return fmt.Errorf("read index of %s: %w", w.store, err)
	}
	if ver != w.version {
		return amlerr.New(amlerr.PublishConflict, w.opts.ID, "workspace.json changed since this tree was loaded: another writer published; the previous revision is still current, nothing was overwritten, and the tree is kept. "+
			"To go on: mount with --discard-unsaved to restore the current revision, or restore it elsewhere and copy your changes over by hand")
	}
	return nil
}

// journalOf reports whether p is by its name a database's journal (SQLite's
// -wal, -shm or -journal): one that changed during every reading is left
// out, never saved with earlier bytes. An earlier WAL beside a later
// database would replay old pages over newer ones; without it the database
// is itself at one instant, as of its last checkpoint, and SQLite rebuilds
// its -shm.
func journalOf(p string) bool {
	return strings.HasSuffix(p, "-wal") || strings.HasSuffix(p, "-shm") || strings.HasSuffix(p, "-journal")
}
