package revision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/amlfs/amlfs/amlerr"
)

// restoreParallel bounds concurrent file restores (downloads or
// placeholders).
const restoreParallel = 8

// Options configure a Workspace.
type Options struct {
	ID        string
	Format    string // FormatFolder (default) or FormatArchive
	Retention int    // revisions kept, counting the new current one (default 1)
	Limits    format.Limits
	NoLock    bool
	// DeadHolder, if set, reports whether the holder of a lease that is not
	// stale yet is known to be dead, so that the lease is taken over.
	DeadHolder func(holder string) bool
	// LazyRestore restores folder revisions as placeholders whose bytes
	// are fetched on first use (see lazy.go).
	LazyRestore bool
	// StrictEntries fails a save that meets a socket, fifo or device node
	// in the selection, listing every one; by default each is left out
	// and reported (SaveResult.Skipped).
	StrictEntries bool
	// Progress, if set, receives reports during restores and saves.
	Progress func(Progress)
	// Watch, if set, is for a tree that cannot be frozen while a save
	// reads it (one served natively). It is called as each attempt of a
	// save begins, and the function it returns, asked after the attempt
	// has read and uploaded the tree, reports whether the tree changed
	// since. A save publishes the first attempt during which nothing
	// changed: the tree at one instant. After SaveAttempts attempts it
	// publishes the last one, whose files are each their bytes at one
	// instant, and says so (SaveResult.Unsettled).
	Watch func() (changed func() bool)
	// FetchTimeout bounds one lazy fetch (a file's bytes, a directory's
	// entries), retries and all: a reader waits at most this long, then
	// gets EIO (DefaultFetchTimeout if 0).
	FetchTimeout time.Duration
	// View is what the serving side shows for restored files; nil shows
	// the disk's own stat data (served natively).
	View StatView
	Log  *slog.Logger
	Now  func() time.Time
}

// DefaultFetchTimeout is Options.FetchTimeout's default.
const DefaultFetchTimeout = 2 * time.Minute

// Workspace is one workspace identity in a store: its lease, the index it
// observed, and the save and restore operations AML defines.
type Workspace struct {
	store store.Store
	// fetchCtx is what every lazy fetch runs under; StopFetches cancels
	// it.
	fetchCtx  context.Context
	stopFetch context.CancelCauseFunc
	opts      Options
	log       *slog.Logger

	// mu serializes saves. index and version change only under mu and
	// imu both, so a save reads them under mu alone, and everyone else
	// under imu, which is never held across I/O: status does not wait for
	// a save.
	mu    sync.Mutex
	imu   sync.Mutex
	index *format.Index // GUARDED_BY(mu, imu); nil for a new workspace

	lmu  sync.Mutex // guards base and lazy; never held across I/O
	base *baseTree  // GUARDED_BY(lmu): the tree last restored or saved, for reuse
	lazy *lazyState // GUARDED_BY(lmu): placeholders of a lazy restore
	// onFilled is told of each placeholder just filled (GUARDED_BY(lmu)).
	onFilled func(f *os.File)
	// onAccess: fetch by reading, so that a pre-content event's handler
	// fills (FillOnAccess; GUARDED_BY(lmu)).
	onAccess bool
	version  string // GUARDED_BY(mu, imu); the index version observed
	lease    store.Lease
	// expect, once set, is the revision the tree was restored from: a
	// save publishes only while it is still current (GUARDED_BY(mu)).
	expect *baseExpect
	// view is the stat data the mount shows for restored files.
	view StatView
	// fork, until the first save publishes, names the revision of
	// another workspace the tree was forked from (GUARDED_BY(lmu)).
	fork *format.ForkOrigin
}

type baseExpect struct {
	rev     string // "" for a tree that began with no revision
	version string // the index version when the tree was restored
	known   bool   // version is known (a state file from before it was kept has none)
}

// StopFetches ends every lazy fetch under way, and fails every later one:
// their readers get EIO. A daemon that stops calls it before it waits for
// its fills, so that a stalled store cannot hold the stop.
func (w *Workspace) stopFetches() {
	w.stopFetch(errors.New("the daemon is stopping"))
}

// Version returns the index version observed: when the workspace was
// opened, or set by its last save ("" for no index).
func (w *Workspace) Version() string {
	w.imu.Lock()
	defer w.imu.Unlock()
	return w.version
}

// Resumed describes a working tree an earlier run restored (a tree
// resumed after a crash or a failed save).
type Resumed struct {
	// Base is the revision the tree was restored from ("" for none), when
	// the index was at Version, if Known.
	Base, Version string
	Known         bool
	// Fork, if set, says that the tree is a fork of that origin, not
	// saved yet: its first save records it.
	Fork *format.ForkOrigin
}

// Resume says that the tree the next saves publish is r's. A save then
// publishes only if r.Base is still current and the index still at that
// version; otherwise it fails with AML_PUBLISH_CONFLICT, before uploading
// anything. A resumed tree is a stale writer like any other: publishing
// it over a revision another writer published since would lose that
// writer's work.
func (w *Workspace) Resume(r Resumed) {
	w.expectBase(r.Base, r.Version, r.Known)
	if r.Fork != nil {
		w.setFork(r.Fork)
	}
}

func (w *Workspace) expectBase(rev, version string, known bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expect = &baseExpect{rev: rev, version: version, known: known}
	if known {
		w.imu.Lock()
		w.version = version
		w.imu.Unlock()
	}
}

// staleBase reports a tree whose base revision is no longer current.
// Must hold w.mu.
func (w *Workspace) staleBase() error {
	if w.expect == nil {
		return nil
	}
	cur := ""
	if w.index != nil {
		cur = w.index.Current
	}
	if cur == w.expect.rev {
		return nil
	}
	base, now := w.expect.rev, cur
	if base == "" {
		base = "(none: a new workspace)"
	}
	if now == "" {
		now = "(none)"
	}
	return amlerr.New(amlerr.PublishConflict, w.opts.ID, "the working tree was restored from revision %s, but %s is current now: another writer published since. Nothing was overwritten, and the tree is kept. "+
		"To go on: mount with --discard-unsaved to restore the current revision, or restore it elsewhere and copy your changes over by hand", base, now)
}

// Open takes the lease (unless NoLock) and loads the index. A store with no
// index is a new workspace; any other problem is an error.
func Open(ctx context.Context, store store.Store, opts Options) (*Workspace, error) {
	if opts.Format == "" {
		opts.Format = format.FormatFolder
	}
	if opts.Format != format.FormatFolder && opts.Format != format.FormatArchive {
		return nil, amlerr.New(amlerr.InvalidConfig, opts.Format, "format must be folder or archive")
	}
	if opts.Retention < 1 {
		opts.Retention = 1
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.FetchTimeout <= 0 {
		opts.FetchTimeout = DefaultFetchTimeout
	}
	w := &Workspace{store: store, opts: opts, log: opts.Log, view: opts.View}
	if w.view == nil {
		w.view = diskView{}
	}
	w.fetchCtx, w.stopFetch = context.WithCancelCause(context.Background())
	if !opts.NoLock {
		lease, err := store.Lock(ctx, func(err error) {
			opts.Log.Error("workspace lease lost; the next save or release will fail", "op", "heartbeat", "path", store.String(), "id", opts.ID, "err", err)
		}, opts.DeadHolder)
		if err != nil {
			return nil, err
		}
		w.lease = lease
	}
	if err := w.reload(ctx); err != nil {
		w.Close(ctx)
		return nil, err
	}
	return w, nil
}

func (w *Workspace) reload(ctx context.Context) error {
	idx, ver, err := readIndex(ctx, w.store)
	if err != nil {
		return err
	}
	w.imu.Lock()
	w.index, w.version = idx, ver
	w.imu.Unlock()
	return nil
}

// readIndex reads and parses s's index, with its version; nil and "" if
// there is none yet.
func readIndex(ctx context.Context, s store.Store) (*format.Index, string, error) {
	data, ver, err := s.ReadIndex(ctx)
	if errors.Is(err, store.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read index of %s: %w", s, err)
	}
	idx, err := format.ParseIndex(data)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", s, err)
	}
	return idx, ver, nil
}

// StoreCurrent reads the index back from the store and returns the revision
// it names current now ("" for none), without adopting it: a save stays
// conditional on the index observed before.
func (w *Workspace) StoreCurrent(ctx context.Context) (string, error) {
	idx, _, err := readIndex(ctx, w.store)
	if err != nil || idx == nil {
		return "", err
	}
	return idx.Current, nil
}

// Index returns a copy of the index as last observed, or nil.
func (w *Workspace) Index() *format.Index {
	w.imu.Lock()
	defer w.imu.Unlock()
	if w.index == nil {
		return nil
	}
	c := *w.index
	c.Revisions = append([]format.Entry(nil), w.index.Revisions...)
	return &c
}

// Store returns the underlying store.
func (w *Workspace) Store() store.Store { return w.store }

// Resolve returns the entry for "current" or a revision id.
func (w *Workspace) Resolve(rev string) (format.Entry, error) {
	w.imu.Lock()
	defer w.imu.Unlock()
	if w.index == nil {
		return format.Entry{}, amlerr.New(amlerr.InvalidStore, w.opts.ID, "workspace has no revisions yet (load with --load none to start it)")
	}
	e, ok := w.index.Resolve(rev)
	if !ok {
		return format.Entry{}, amlerr.New(amlerr.InvalidStore, rev, "no such revision in %s", w.store)
	}
	return e, nil
}

// Tree returns the entries of a revision, read from its manifest or
// archive and fully validated.
func (w *Workspace) treeOf(ctx context.Context, e format.Entry) ([]format.TreeEntry, error) {
	tree, _, err := w.Describe(ctx, e)
	return tree, err
}

// Describe returns the entries of a revision, as Tree, and what it was
// forked from if it is the first revision of a fork.
func (w *Workspace) Describe(ctx context.Context, e format.Entry) ([]format.TreeEntry, *format.ForkOrigin, error) {
	if e.Format == format.FormatArchive {
		r, err := w.openArtifact(ctx, e.Path)
		if err != nil {
			return nil, nil, err
		}
		defer r.Close()
		tree, err := readArchive(r, "", e.Path, w.opts.Limits, nil)
		return tree, nil, err
	}
	m, err := w.manifest(ctx, e)
	if err != nil {
		return nil, nil, err
	}
	var fork *format.ForkOrigin
	if m.Ext != nil {
		fork = m.Ext.Fork
	}
	return m.Tree(), fork, nil
}

func (w *Workspace) openArtifact(ctx context.Context, key string) (io.ReadCloser, error) {
	r, err := w.store.Open(ctx, key)
	if errors.Is(err, store.ErrNotExist) {
		return nil, amlerr.New(amlerr.InvalidStore, key, "the index refers to it, but it is missing from %s", w.store)
	}
	return r, err
}

func (w *Workspace) manifest(ctx context.Context, e format.Entry) (*format.Manifest, error) {
	key := e.Path + "manifest.json"
	r, err := w.openArtifact(ctx, key)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	data, err := store.ReadAllLimited(r, int64(w.opts.Limits.ManifestBytes()), key)
	if err != nil {
		return nil, amlerr.Wrap(amlerr.InvalidStore, key, err)
	}
	return format.ParseManifest(key, data, w.opts.Limits)
}

// Restore materializes revision rev ("current" or an id) into dir, which
// must not exist yet. On failure dir is left absent.
func (w *Workspace) Restore(ctx context.Context, rev, dir string, sel format.Selection) (format.Entry, error) {
	e, err := w.Resolve(rev)
	if err != nil {
		return format.Entry{}, err
	}
	return w.restore(ctx, e, dir, sel)
}

// restore materializes revision e, whose path may be a foreign key (a
// fork's source), at dir.
func (w *Workspace) restore(ctx context.Context, e format.Entry, dir string, sel format.Selection) (format.Entry, error) {
	tmp := dir + ".restoring"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return format.Entry{}, err
	}
	var lazy *lazyState
	if w.opts.LazyRestore && e.Format == format.FormatFolder {
		lazy = newLazy(dir)
		lazy.dirs = newDirSet(sel)
	}
	restored, err := w.restoreInto(ctx, e, tmp, sel, lazy)
	if err != nil {
		os.RemoveAll(tmp)
		return format.Entry{}, fmt.Errorf("restore revision %s: %w", e.ID, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return format.Entry{}, err
	}
	if e.Format == format.FormatFolder {
		w.setBase(recordTree(dir, e, restored))
		// A lazy restore's placeholders are noted as they are made.
		recordView(w.view, dir, restored, lazy == nil)
	}
	w.lmu.Lock()
	w.lazy = lazy
	w.lmu.Unlock()
	return e, nil
}

// restoreInto materializes e into dir and returns the entries it restored.
// With lazy set, files become placeholders (see lazy.go).
func (w *Workspace) restoreInto(ctx context.Context, e format.Entry, dir string, sel format.Selection, lazy *lazyState) ([]format.TreeEntry, error) {
	if e.Format == format.FormatArchive {
		w.view.Reset(nil) // an archive keeps no stat data
		// Validate the whole archive before extracting anything.
		if _, err := w.treeOf(ctx, e); err != nil {
			return nil, err
		}
		r, err := w.openArtifact(ctx, e.Path)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return readArchive(r, dir, e.Path, w.opts.Limits, sel.Takes)
	}
	m, err := w.manifest(ctx, e)
	if err != nil {
		return nil, err
	}
	entries := sel.Filter(m.Tree())
	w.view.Reset(entries)
	var nfiles, nbytes int64
	for _, te := range entries {
		if te.Type == format.TypeFile {
			nfiles++
			nbytes += te.Size
		}
	}
	prog := startProgress(w.opts.Progress, "restore", nfiles, nbytes)
	defer prog.finish()
	mat := materializer{root: dir}
	// Directories first, parents before children; then the files, several
	// at once.
	for _, te := range entries {
		if te.Type == format.TypeDir {
			if err := mat.add(te, nil); err != nil {
				return nil, err
			}
		}
	}
	// Symlinks, never followed, cost nothing to make: made at once, even
	// in a lazy restore. No entry lies beneath one (ValidateEntries).
	for _, te := range entries {
		if te.Type == format.TypeSymlink {
			if err := mat.add(te, nil); err != nil {
				return nil, err
			}
		}
	}
	if lazy != nil {
		// Files are made on first use of their directory (lazydir.go).
		prog.files.Add(nfiles)
		if err := lazy.dirs.deferFiles(dir, e.Path, entries); err != nil {
			return nil, err
		}
		return entries, mat.finish()
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(restoreParallel)
	for _, te := range entries {
		if te.Type != format.TypeFile {
			continue
		}
		if gctx.Err() != nil {
			break
		}
		key := e.Path + "files/" + te.Path
		g.Go(func() error {
			if err := w.restoreFile(gctx, &mat, key, te, prog); err != nil {
				return err
			}
			prog.fileDone()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return entries, mat.finish()
}

func (w *Workspace) restoreFile(ctx context.Context, mat *materializer, key string, te format.TreeEntry, prog *progress) error {
	r, err := w.openArtifact(ctx, key)
	if err != nil {
		return err
	}
	defer r.Close()
	// The object must hold exactly the manifest's size.
	if err := mat.add(te, prog.reader(r)); err != nil {
		return amlerr.Wrap(amlerr.InvalidStore, key, err)
	}
	var one [1]byte
	if n, _ := r.Read(one[:]); n > 0 {
		return amlerr.New(amlerr.InvalidStore, key, "object is larger than the manifest's size %d", te.Size)
	}
	return nil
}

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
	return w.save(ctx, dir, sel, revID, w)
}

// save publishes the tree at dir, which is src's working tree: w's own, or
// for a fork (commit --fork) the tree of the mounted workspace src. It
// reuses src's base revision's objects and fetches through src's lazy
// restore; only for w's own tree does the tree become w's new base.
func (w *Workspace) save(ctx context.Context, dir string, sel format.Selection, revID string, src *Workspace) (SaveResult, error) {
	if src != w {
		src.mu.Lock()
		defer src.mu.Unlock()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	start := time.Now()
	fail := func(err error) (SaveResult, error) {
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
	if w.lease != nil {
		if err := w.lease.Lost(); err != nil {
			return fail(err)
		}
	}
	if err := w.staleBase(); err != nil {
		return fail(err)
	}
	// A writer that published since this tree was loaded makes this save
	// stale: say so now, before uploading anything (and before reusing
	// objects of a base revision it may have pruned). Publication below
	// stays conditional for a writer that comes in between.
	if _, ver, err := w.store.ReadIndex(ctx); err == nil || errors.Is(err, store.ErrNotExist) {
		if ver != w.version {
			return fail(amlerr.New(amlerr.PublishConflict, w.opts.ID, "workspace.json changed since this tree was loaded: another writer published; the previous revision is still current, nothing was overwritten, and the tree is kept. "+
				"To go on: mount with --discard-unsaved to restore the current revision, or restore it elsewhere and copy your changes over by hand"))
		}
	} else {
		return fail(fmt.Errorf("read index of %s: %w", w.store, err))
	}
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
		entry, skipped, up, err = w.readTree(ctx, dir, sel, revID, src)
		if amlerr.Code(err) == amlerr.RevisionIDConflict {
			return SaveResult{}, err
		} else if err != nil {
			return fail(err)
		}
		if changed == nil || !changed() {
			break
		}
		if attempt == SaveAttempts {
			unsettled = true
			w.log.Warn("the tree changed during every attempt of the save: each file is saved as its bytes at one instant, the tree is not one instant", "op", "save", "attempts", attempt)
			break
		}
		w.log.Info("the tree changed while the save read it; reading it again", "op", "save", "attempt", attempt)
		// The next attempt uploads under the same id.
		if err := w.store.Remove(context.WithoutCancel(ctx), entry.Path); err != nil {
			return fail(fmt.Errorf("remove the unsettled attempt's artifact: %w", err))
		}
	}
	// 4. Publish.
	next, pruned := w.index.WithNew(entry, w.opts.Retention)
	data, err := next.Marshal()
	if err == nil && w.lease != nil {
		err = w.lease.Lost()
	}
	var ver string
	if err == nil {
		ver, err = w.store.PublishIndex(ctx, data, w.version)
	}
	if err != nil {
		// 6. Remove the orphan upload; the previous revision stays current.
		if rerr := w.store.Remove(context.WithoutCancel(ctx), entry.Path); rerr != nil {
			w.log.Error("remove unpublished artifact", "op", "remove", "path", entry.Path, "err", rerr)
		}
		if errors.Is(err, store.ErrPrecondition) {
			return fail(amlerr.Wrap(amlerr.PublishConflict, w.opts.ID, fmt.Errorf("%w; the previous revision is still current, nothing was overwritten, and the tree is kept", err)))
		}
		return fail(err)
	}
	w.imu.Lock()
	w.index, w.version = next, ver
	w.imu.Unlock()
	w.expect = nil // the tree is now the new revision's
	w.setFork(nil)
	if src == w {
		if entry.Format == format.FormatFolder {
			w.setBase(&baseTree{dir: dir, rev: entry.ID, revPath: entry.Path, files: up.stamps})
		} else {
			w.setBase(nil)
		}
		// Placeholders not fetched yet now take their bytes from the
		// new revision, where the save copied them.
		w.repoint(up.moves)
	}
	// 5. Prune, only now, and never a revision a placeholder still needs.
	total, files := treeSize(up.entries)
	res := SaveResult{Entry: entry, Files: files, Bytes: total, Uploaded: up.uploaded, UploadedBytes: up.uploadedBytes, Reused: up.reused,
		BaseGone: up.baseGone, Symlinks: countType(up.entries, format.TypeSymlink), Skipped: skipped, Attempts: attempt, Unsettled: unsettled}
	for _, p := range pruned {
		if !w.fetchFrom(ctx, p.Path) {
			w.log.Warn("not pruning a revision whose bytes a lazily restored file still needs", "op", "prune", "path", p.Path, "revision", p.ID)
			continue
		}
		if err := w.store.Remove(ctx, p.Path); err != nil {
			w.log.Warn("prune revision", "op", "prune", "path", p.Path, "revision", p.ID, "err", err)
			continue
		}
		res.Pruned = append(res.Pruned, p.ID)
	}
	w.cleanOrphans(ctx)
	res.Elapsed = time.Since(start)
	return res, nil
}

// readTree is steps 1 to 3 of a save: 1. snapshot (of the whole tree:
// lazily restored directories get their placeholders first), 2. limits,
// 3. upload the artifact of revision revID. Must hold w.mu.
func (w *Workspace) readTree(ctx context.Context, dir string, sel format.Selection, revID string, src *Workspace) (entry format.Entry, skipped []string, up uploadStats, err error) {
	if err := src.populateAll(ctx); err != nil {
		return entry, nil, up, err
	}
	entries, skipped, err := Snapshot(dir, sel)
	if err != nil {
		return entry, nil, up, err
	}
	if len(skipped) > 0 && w.opts.StrictEntries {
		return entry, nil, up, SpecialFilesError(skipped)
	}
	for _, p := range skipped {
		w.log.Warn("special file not saved (a socket, fifo or device)", "op", "snapshot", "path", p)
	}
	if w.opts.Format == format.FormatArchive {
		if err := noSymlinks(entries); err != nil {
			return entry, nil, up, err
		}
	}
	total, files := treeSize(entries)
	if err := w.opts.Limits.Check(w.opts.ID, len(entries), total); err != nil {
		return entry, nil, up, err
	}
	entry = format.Entry{ID: revID, Format: w.opts.Format, Path: format.RevisionPath(revID, w.opts.Format), CreatedAt: format.FormatCreatedAt(w.opts.Now())}
	prog := startProgress(w.opts.Progress, "save", int64(files), total)
	up, err = w.upload(ctx, dir, entry, entries, prog, src)
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
}

// upload writes the artifact. For a folder revision, a file unchanged since
// the base tree (same stamp) reuses the base revision's object; only the
// rest is uploaded. Must hold w.mu.
func (w *Workspace) upload(ctx context.Context, dir string, entry format.Entry, entries []format.TreeEntry, prog *progress, src *Workspace) (up uploadStats, err error) {
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
	if entry.Format == format.FormatArchive {
		if err := src.ensureAll(ctx, entries); err != nil {
			return up, err
		}
		pr, pw := io.Pipe()
		go func() {
			var err error
			_, up.entries, err = writeArchive(pw, dir, entries, w.opts.Limits)
			pw.CloseWithError(err)
		}()
		err := st.Put(ctx, "", pr, -1)
		pr.CloseWithError(err) // unblock the writer if Put stopped early
		if err != nil {
			return up, err
		}
		up.uploadedBytes, up.uploaded = treeSize(up.entries)
		return up, st.Commit(ctx)
	}
	// Reuse only from a base revision the index still holds, or another
	// workspace's (a fork's source: if it is gone, the bytes come from
	// the tree).
	base := src.baseTree()
	if base != nil && !store.IsForeign(base.revPath) && (src.index == nil || !hasRevision(src.index, base.rev)) {
		base = nil
	}
	// The base's keys as w's store names them.
	baseKey := func(k string) string { return k }
	if src != w {
		baseKey = src.store.(store.Family).Foreign
	}
	t, err := openTree(dir)
	if err != nil {
		return up, err
	}
	defer t.Close()
	up.stamps = make(map[string]baseFile, len(entries))
	var mu sync.Mutex // guards entries, up while uploads land
	gone := map[string]bool{}
	for i, te := range entries {
		if te.Type != format.TypeFile {
			continue
		}
		if err := ctx.Err(); err != nil {
			return up, err
		}
		name := "files/" + te.Path
		key, stp, ok := base.reusable(dir, te.Path)
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
				err = st.Reuse(ctx, name, key, f, func(read *store.Stamp) {
					mu.Lock()
					defer mu.Unlock()
					if read != nil {
						// Its base was pruned: uploaded from the tree.
						entries[i].Size, entries[i].Mtime = int64(read.Size), format.Mtime(read.Mtime.Nano())
						entries[i].Stat.Ino, entries[i].Stat.Ctime = read.Ino, format.Mtime(read.Ctime.Nano())
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
					up.moves[stp.Ino] = repointTo{path: te.Path, key: entry.Path + name}
					up.stamps[te.Path] = baseFile{stamp: stp, key: entry.Path + name}
				})
				if err != nil {
					return up, err
				}
				continue
			}
		}
		// A placeholder gets its bytes before they are read.
		if err := src.ensure(ctx, te.Path); err != nil {
			return up, err
		}
		f, isGone, err := openSaved(t, te.Path)
		if err != nil {
			return up, err
		}
		if isGone {
			gone[te.Path] = true // removed or replaced since the snapshot
			continue
		}
		err = st.PutFile(ctx, name, f, func(stp store.Stamp) {
			mu.Lock()
			defer mu.Unlock()
			// The manifest holds the bytes as read: their size and
			// mtime, which may be newer than the snapshot's.
			entries[i].Size = int64(stp.Size)
			entries[i].Mtime = format.Mtime(stp.Mtime.Nano())
			entries[i].Stat.Ino, entries[i].Stat.Ctime = stp.Ino, format.Mtime(stp.Ctime.Nano())
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
			ino, ctime := src.view.Saved(te.Stat.Ino, int64(te.Stat.Ctime))
			up.entries[i].Stat.Ino, up.entries[i].Stat.Ctime = ino, format.Mtime(ctime)
		}
		if up.entries[i].Stat.Ino > format.MaxShownIno {
			up.entries[i].Stat.Ino, up.entries[i].Stat.Ctime = 0, 0
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

// noSymlinks refuses symlinks in an archive save: AML's archive reader
// throws on any tar member that is not a file or a directory.
func noSymlinks(es []format.TreeEntry) error {
	var links []string
	for _, te := range es {
		if te.Type == format.TypeSymlink {
			links = append(links, fmt.Sprintf("%q", te.Path))
		}
	}
	if len(links) == 0 {
		return nil
	}
	if len(links) > 20 {
		links = append(links[:20], fmt.Sprintf("and %d more", len(links)-20))
	}
	return amlerr.New(amlerr.UnsupportedEntry, strings.Trim(links[0], `"`), "%d symlinks, which AML's archive format cannot hold (its reader throws on them): save with --format folder, which keeps them in a manifest extension AML ignores, or exclude them: %s", countType(es, format.TypeSymlink), strings.Join(links, ", "))
}

func hasRevision(idx *format.Index, id string) bool {
	_, ok := idx.Find(id)
	return ok
}

// cleanOrphans removes artifacts the index does not name, left by a crashed
// or failed save. It runs only under the lease, when no other writer can be
// between upload and publish.
func (w *Workspace) cleanOrphans(ctx context.Context) {
	if w.lease == nil || w.index == nil {
		return
	}
	keys, err := w.store.Artifacts(ctx)
	if err != nil {
		w.log.Warn("list artifacts", "op", "list", "path", w.store.String(), "err", err)
		return
	}
	known := map[string]bool{}
	for _, e := range w.index.Revisions {
		known[e.Path] = true
	}
	for _, k := range keys {
		if known[k] {
			continue
		}
		w.log.Info("remove orphan artifact", "path", k)
		if err := w.store.Remove(ctx, k); err != nil {
			w.log.Warn("remove orphan artifact", "op", "remove-orphan", "path", k, "err", err)
		}
	}
}

func (w *Workspace) baseTree() *baseTree {
	w.lmu.Lock()
	defer w.lmu.Unlock()
	return w.base
}

func (w *Workspace) setBase(b *baseTree) {
	w.lmu.Lock()
	w.base = b
	w.lmu.Unlock()
}

// LeaseStatus is the workspace lease as this process knows it.
type LeaseStatus struct {
	// Holder names the lease held (see store.Lease.Holder), "" when
	// running unlocked.
	Holder string
	// State is "held", "lost" (the heartbeat found it taken over), or
	// "none" (running unlocked).
	State string
}

// Lease reports the workspace lease without asking the store.
func (w *Workspace) Lease() LeaseStatus {
	if w.lease == nil {
		return LeaseStatus{State: "none"}
	}
	st := LeaseStatus{Holder: w.lease.Holder(), State: "held"}
	if w.lease.LostErr() != nil {
		st.State = "lost"
	}
	return st
}

// CheckLease asks the store whether the lease is still held: it reports
// a lost lease, and nil when held or when running unlocked.
func (w *Workspace) CheckLease() error {
	if w.lease == nil {
		return nil
	}
	return w.lease.Lost()
}

// Close releases the lease. It reports a lease that was lost.
func (w *Workspace) Close(ctx context.Context) error {
	if w.lease == nil {
		return nil
	}
	err := w.lease.Release(ctx)
	w.lease = nil
	return err
}
