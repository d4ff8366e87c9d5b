package revision

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"

	"github.com/amlfs/amlfs/amlerr"
)

// restoreParallel bounds concurrent file restores (downloads or
// placeholders).
const restoreParallel = 8

// Options configure a Workspace.
type Options struct {
	ID string
	// Format is FormatArchive or FormatFolder; "" chooses: the current
	// revision's format, or an archive for a new workspace. A chosen
	// archive that would be over its bound (Limits.ArchiveBytes) is saved
	// as a folder instead, which the next saves then keep.
	Format    string
	Retention int // revisions kept, counting the new current one (default 1)
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
	// Freeze, if set, holds the tree's writers still (a cgroup's, under
	// amlfs exec) for a short while in each save. After reading the tree
	// as it runs, a save holds it, reads again what changed since (clean
	// says which directories, by inode, did not since the save began;
	// nil: every directory is read again), copies the files it has to
	// upload to StageDir, then calls thaw and uploads from the copies:
	// the revision is the tree at the instant it was held, and Watch is
	// not asked. An error (the writers could not be held) reads the tree
	// as without.
	Freeze func(ctx context.Context) (clean func(ino uint64) bool, thaw func(), err error)
	// Writers, if set, returns the inodes of the working tree's files
	// open for writing or mapped shared and writable now, once the bytes
	// written to them are in the working tree (through FUSE, the mount's
	// dirty pages are written back first). Such a file can change with no
	// change of its stamp (a write through a mapping to a page already
	// dirty), so a save counts each, as it began or as it ended, as
	// changed at the next save too, whatever its stamp says then: it is a
	// candidate until a save reads it with no writer left.
	Writers func() map[uint64]bool
	// StageDir is where a held save copies files (Freeze): on the
	// working tree's disk, so that a copy can be a reflink. "" is the
	// system's temporary directory.
	StageDir string
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
	// fills logs the placeholders filled while a save runs
	// (GUARDED_BY(lmu)): its new base may have listed them before.
	fills fillLog
	lazy  *lazyState // GUARDED_BY(lmu): placeholders of a lazy restore
	// restored is what the last restore made, with the stat data each
	// entry was saved with, until RefreshGitIndexes takes it
	// (GUARDED_BY(lmu)).
	restored []format.TreeEntry
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
	// orphansMaybe: a crashed run or a failed save may have left an
	// artifact the index does not name (cleanOrphans). GUARDED_BY(mu).
	orphansMaybe bool
	// unknown is a publication whose outcome is not known yet
	// (GUARDED_BY(mu)): its artifact is kept until it is settled.
	unknown *unknownPub
	// created says the workspace is being made by this process without
	// its index read (a fork's first save): there must be none, and its
	// publication is conditional on that.
	created    bool
	members    *memberCache       // archive members read for lazy fetches
	indexes    *indexCache        // archive indexes read for placeholders' short markers
	onMade     func(fd int) error // GUARDED_BY(lmu): Placeholders.OnMade
	prunes     sync.WaitGroup     // pruning after a save's publication
	autoFormat bool               // Options.Format was "": chosen here
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
	w, err := newWorkspace(store, opts)
	if err != nil {
		return nil, err
	}
	if !opts.NoLock {
		lease, err := store.Lock(ctx, func(err error) {
			w.log.Error("workspace lease lost; the next save or release will fail", "op", "heartbeat", "path", store.String(), "id", opts.ID, "err", err)
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
	w.settleFormat()
	return w, nil
}

// newWorkspace is a workspace of store with no lease and no index read.
func newWorkspace(store store.Store, opts Options) (*Workspace, error) {
	if opts.Format != "" && opts.Format != format.FormatFolder && opts.Format != format.FormatArchive {
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
	w := &Workspace{store: store, opts: opts, log: opts.Log, view: opts.View, orphansMaybe: true, members: newMemberCache(), indexes: newIndexCache()}
	if w.view == nil {
		w.view = diskView{}
	}
	w.fetchCtx, w.stopFetch = context.WithCancelCause(context.Background())
	return w, nil
}

// settleFormat resolves an unset format, once the index is read: the
// current revision's, or archive for a new workspace.
func (w *Workspace) settleFormat() {
	if w.opts.Format != "" {
		return
	}
	w.autoFormat = true
	w.opts.Format = format.FormatArchive
	if w.index != nil {
		if e, ok := w.index.Resolve("current"); ok {
			w.opts.Format = e.Format
		}
	}
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
		return format.Entry{}, amlerr.New(amlerr.RevisionNotFound, w.opts.ID, "workspace has no revisions yet (load with --load none to start it)")
	}
	e, ok := w.index.Resolve(rev)
	if !ok {
		return format.Entry{}, amlerr.New(amlerr.RevisionNotFound, rev, "no such revision in %s", w.store)
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
		// An index amlfs wrote says it all, with two ranged reads at most.
		if x, err := w.archiveIndex(ctx, e.Path); err != nil || x != nil {
			if err != nil {
				return nil, nil, err
			}
			return x.Tree(), x.Fork, nil
		}
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

// LeaseErr is the lease's loss as the heartbeat found it, without asking
// the store: nil when held (as far as it knows) or running unlocked.
func (w *Workspace) LeaseErr() error {
	if w.lease == nil {
		return nil
	}
	return w.lease.LostErr()
}

// CheckLease asks the store whether the lease is still held: it reports
// a lost lease, and nil when held or when running unlocked.
func (w *Workspace) CheckLease() error {
	if w.lease == nil {
		return nil
	}
	return w.lease.Lost()
}

// Close waits for the pruning of the last save, then releases the lease.
// It reports a lease that was lost.
func (w *Workspace) Close(ctx context.Context) error {
	w.prunes.Wait()
	if w.lease == nil {
		return nil
	}
	err := w.lease.Release(ctx)
	w.lease = nil
	return err
}
