package mount

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/atomicfile"
	"github.com/amlfs/amlfs/cache"
	"github.com/amlfs/amlfs/fuse"
	"github.com/amlfs/amlfs/fuse/shown"
	"github.com/amlfs/amlfs/metrics"
	"github.com/amlfs/amlfs/mount/mountpoint"
	"github.com/amlfs/amlfs/revision"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/tools"
)

// Daemon is one running mount.
type Daemon struct {
	// freezer, if set, freezes the writers' cgroup while a checkpoint
	// reads the tree (--freeze-cgroup, or amlfs exec's own).
	freezer *cgroupFreezer
	cfg     Config
	log     *slog.Logger
	hooks   Hooks
	slot    *os.File // flock'd claim on the working-directory slot
	ws      *revision.Workspace
	fs      server
	// shown is the stat data the FUSE mount shows for restored files.
	shown *shown.Shown
	// fuseFS is the workspace's FUSE mount, when served through FUSE:
	// tool calls run on the working tree beside it (treeDirect).
	fuseFS *fuse.FS
	// at is the mountpoint, resolved once (mountpoint.Open); tools serve
	// tool calls beneath the mount's root, held from the mount on.
	at    *mountpoint.Dir
	tools *tools.FS
	// fresh: the working tree was restored (or made) by this start,
	// not resumed from an earlier run.
	fresh bool
	// adopted: the working tree is one an earlier stop kept (adoptKept),
	// whose placeholders are still to be marked.
	adopted bool
	// serve is how the workspace is served, "native" or "fuse", and
	// serveWhy why (Config.Serve and what this host can do).
	serve, serveWhy string
	// liveFS are the live mounts' own FUSE connections (native serving).
	liveFS  []*fuse.FS
	workDir string
	state   string // the state file in the cache dir
	kept    string // the record of a tree kept at a clean stop (keptFile)

	saveMu sync.Mutex // serializes saves; baseRev and baseMark change only under it and mu
	// saveMark is the mark a save took for its unchanged-tree check, which
	// the first reading of the tree (saveWatch) starts from instead of
	// marking the tree again; -1 once used. readMark is the mark the last
	// reading started from: the one the published tree is current as of.
	saveMark, readMark int64 // GUARDED_BY(saveMu)

	mu       sync.Mutex // guards the fields below; never held across I/O, so status answers during a save
	baseRev  string     // GUARDED_BY(mu): the revision the tree was restored from or last saved as
	baseMark int64      // GUARDED_BY(mu): fs.Changes() when baseRev was taken; -1 forces a save
	baseSel  string     // GUARDED_BY(mu): selectionKey of the selection baseRev holds (the mount's, unless a commit said otherwise)
	// unknownMark and unknownSel are baseMark and baseSel for the save
	// whose publication's outcome is unknown (GUARDED_BY(saveMu)).
	unknownMark int64
	unknownSel  string
	// resumed, for a tree resumed from an earlier run and not saved since,
	// is what its state file said of the index then; kept in the state
	// file until a save succeeds (GUARDED_BY(mu)).
	resumed *workState
	// publishing is the revision a save under way may publish (GUARDED_BY(mu)).
	publishing string
	lastSave   *SaveInfo // GUARDED_BY(mu)
	phase      string    // GUARDED_BY(mu)
	stopping   bool      // GUARDED_BY(mu)
	stopped    bool      // GUARDED_BY(mu): stop has returned; no save runs after it
	stopReqs   chan stopRequest
	startedAt  time.Time

	restoredBytes  atomic.Int64   // the bytes of the last restore, from its progress
	nextSaveReport atomicDuration // when a running save next logs its progress

	metrics      *metrics.Metrics
	stopPrefetch func()
	closers      []func() error // live mount providers, closed after unmount
	live         []liveProvider // in the order of cfg.Live
	prefetchDone chan struct{}
}

// server is how the working directory is served at the mountpoint: a
// FUSE mount (fuse.FS) or a bind mount (native.Server).
type server interface {
	// Changes counts the changes seen so far; Touch counts one the
	// daemon made itself through the mount (a tool call).
	Changes() int64
	Touch()
	// Mark is the count a save (or the mount) starts from: every change
	// after it counts.
	Mark() int64
	// Freeze holds changes back while a snapshot is taken, if it can.
	Freeze() (thaw func())
	// Clean says which directories (by inode) are unchanged since the
	// last Mark, once the writers are held; nil when not known.
	Clean() func(ino uint64) bool
	// Writers returns the working tree's files (by inode) open for
	// writing or mapped shared and writable now, once what they wrote is
	// in the working tree (revision Options.Writers).
	Writers() map[uint64]bool
	Passthrough() bool
	// Mount is the mount, known by its id and held by descriptor.
	Mount() *mountpoint.Mount
	// Wait returns once the mount went away.
	Wait()
	Unmount(wait time.Duration, lazy bool) error
	// Close frees what serving held, after the unmount.
	Close()
	// Detached reports that Unmount had to detach a busy mount:
	// processes may still use the tree through it.
	Detached() bool
	// Stranded reports placeholders that processes still holding a
	// detached mount could read once the daemon is gone (natively: the
	// mount outlives its unmount, and no one would fill them).
	Stranded() bool
}

// liveProvider is what the daemon asks of a live mount.
type liveProvider interface {
	Health() error
	Refresh(sub string) error
}

// queued is a live mount that sends its writes later (S3): Pending counts
// those not sent yet.
type queued interface{ Pending() int }

// cacheReader is a live mount that reads through the daemon's data cache.
type cacheReader interface {
	CacheReads() (hits, misses int64)
	Cache() *cache.Cache
}

type stopRequest struct {
	noSave   bool
	revision string // a caller-chosen id for the final save
	reason   string
	done     chan StopResult
}

// StopResult is the outcome of stopping the daemon.
type StopResult struct {
	Saved    *SaveInfo    `json:"saved,omitempty"`
	Error    *amlerr.Body `json:"error,omitempty"`
	ExitCode int          `json:"exitCode"`
}

type workState struct {
	ID      string `json:"id"`
	Store   string `json:"store"`
	BaseRev string `json:"baseRevision"`
	// BaseVersion is the index version when BaseRev was restored or
	// saved: a resumed tree publishes only over that index (nil in state
	// files from before it was kept).
	BaseVersion *string `json:"baseVersion,omitempty"`
	// IndexCurrent is the current revision the index named then (BaseRev
	// unless --load chose an older one).
	IndexCurrent *string `json:"indexCurrent,omitempty"`
	// Publishing is the revision a save was publishing when the state was
	// written: if it is current at the next mount, the tree published it.
	Publishing string `json:"publishing,omitempty"`
	// Fork names what a fork not saved yet was forked from: its first
	// save records it.
	Fork *format.ForkOrigin `json:"fork,omitempty"`
	// Serve is how the tree was served ("" before it was kept: fuse).
	Serve string `json:"serve,omitempty"`
	PID   int    `json:"pid"`
}

// Hooks let the caller follow a daemon's start.
type Hooks struct {
	// Ready is called once the mount is serving.
	Ready func(mountpoint string)
	// Notify tells the user something they must know (a cleaned stale
	// mount, resumed work); it is also logged.
	Notify func(msg string)
	// Progress, if set, follows restores and saves.
	Progress func(revision.Progress)
}

// Run mounts per cfg and serves until unmounted or signalled. The returned
// error carries the exit code.
func Run(ctx context.Context, cfg Config, log *slog.Logger, hooks Hooks) error {
	if err := cfg.Normalize(); err != nil {
		return err
	}
	if hooks.Ready == nil {
		hooks.Ready = func(string) {}
	}
	if hooks.Notify == nil {
		hooks.Notify = func(string) {}
	}
	raiseFileLimit(log)
	d := &Daemon{cfg: cfg, log: log, hooks: hooks, stopReqs: make(chan stopRequest, 4), startedAt: time.Now(), phase: "starting", saveMark: -1,
		metrics: metrics.New()}
	d.baseSel = selectionKey(d.cfg.Selection())
	d.cfg.S3.Observe = d.metrics.S3Request
	stopMetrics, err := d.serveMetrics()
	if err != nil {
		return err
	}
	defer stopMetrics()
	// The signals are caught from the start: one that stops the daemon
	// (SIGTERM, SIGINT) while it mounts cancels the mount, which then
	// takes nothing and leaves nothing behind; one after it is served
	// stops it as usual (loop).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := d.startCancellable(ctx, sigs); err != nil {
		d.cleanupFailedStart(context.WithoutCancel(ctx))
		return err
	}
	d.registerGauges()
	ctl, err := d.serveControl()
	if err != nil {
		d.unmountLive()
		d.fs.Unmount(5*time.Second, true)
		d.fs.Close()
		d.cleanupFailedStart(ctx)
		return err
	}
	defer ctl.Close()
	hooks.Ready(cfg.Mountpoint)
	pctx, stopPrefetch := context.WithCancel(ctx)
	d.stopPrefetch = stopPrefetch
	d.prefetchDone = make(chan struct{})
	go func() {
		defer close(d.prefetchDone)
		if d.ws == nil {
			return
		}
		d.ws.Placeholders().Prefetch(pctx, cfg.Prefetch)
		if n, _ := d.ws.Placeholders().Pending(); n == 0 {
			d.log.Debug("every file's bytes are local")
		}
	}()
	return d.loop(ctx, sigs)
}

// startCancellable runs start, cancelled by a SIGTERM or SIGINT from sigs
// that comes before it is done. A stop signal that comes as it ends is
// given back to sigs, so that loop stops the daemon at once. The context
// start gets stays live until the daemon stops, since what start opens
// may keep it.
func (d *Daemon) startCancellable(ctx context.Context, sigs chan os.Signal) error {
	sctx, cancel := context.WithCancel(ctx)
	var (
		mu      sync.Mutex
		started bool
		stopSig os.Signal
	)
	done, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case s := <-sigs:
				if s != syscall.SIGTERM && s != syscall.SIGINT {
					continue // a checkpoint or a refresh before the mount serves: nothing to do
				}
				mu.Lock()
				if !started {
					stopSig = s
					cancel()
				}
				mu.Unlock()
				if stopSig == nil {
					sigs <- s // served already: loop's
				}
				return
			case <-done:
				return
			}
		}
	}()
	err := d.start(sctx)
	mu.Lock()
	started = true
	s := stopSig
	mu.Unlock()
	close(done)
	<-watched
	if err != nil {
		cancel()
		if s != nil {
			d.log.Info("mount cancelled", "signal", s.String())
			return amlerr.New(amlerr.DaemonStopped, d.cfg.Mountpoint, "mount cancelled by %s before it was ready", s)
		}
		return err
	}
	d.closers = append(d.closers, func() error { cancel(); return nil })
	if s != nil {
		sigs <- s // it mounted as the signal came: stopped now
	}
	return nil
}

func (d *Daemon) setPhase(p string) {
	d.mu.Lock()
	d.phase = p
	d.mu.Unlock()
}

func (d *Daemon) start(ctx context.Context) error {
	cfg := &d.cfg
	at, err := prepareMountpoint(cfg.Mountpoint, mountpoint.Policy{AllowUserOwnedParents: cfg.AllowUserOwnedParents, Create: true},
		slices.Contains(cfg.FuseOptions, "nonempty"), d.notify)
	if err != nil {
		return err
	}
	d.at = at
	if cfg.Store == StoreNone {
		return d.startNoWorkspace(ctx)
	}
	if cfg.ID == "" {
		return invalid("", "--id is required here")
	}
	// How to serve depends on the flags and the host only: settled (or
	// refused) before the store is touched or a lease taken.
	if err := d.chooseServe(); err != nil {
		return err
	}
	if cfg.FreezeCgroup != "" {
		f, err := openFreezer(cfg.FreezeCgroup)
		if err != nil {
			return invalid(cfg.FreezeCgroup, "%v", err)
		}
		d.freezer = f
		d.closers = append(d.closers, f.Close)
	}
	st, err := OpenStore(ctx, cfg.Store, cfg.S3, cfg.ID)
	if err != nil {
		return err
	}
	if err := CheckConditionalWrites(ctx, st, NewProbeMemo(DefaultCacheDir(), cfg.Store, cfg.S3Endpoint), cfg.UnsafeNoConditionalWrites, d.notify); err != nil {
		return err
	}
	wlog := d.log.With("provider", "workspace")
	// The live mounts before the lease and the restore: one refused
	// (INVALID_CONFIG) takes nothing and leaves no tree behind.
	live, err := d.openLive(ctx)
	if err != nil {
		return err
	}
	// The slot first: holding it, this daemon can tell whether the holder
	// of a lease that is not stale yet is a crashed mount of this host.
	slots := slotsDir(cfg.CacheDir, st, cfg.ID)
	slot, err := claimSlot(slots)
	if err != nil {
		return err
	}
	d.slot = slot
	d.setPhase("locking")
	// Through FUSE, restored files show the stat data they were saved
	// with; natively, the disk's own.
	var view revision.StatView
	if d.serve != ServeNative {
		d.shown = shown.New()
		view = d.shown
	}
	ws, err := revision.Open(ctx, st, revision.Options{ID: cfg.ID, View: view, Format: cfg.Format, Retention: cfg.Retention, NoLock: cfg.NoLock,
		DeadHolder:  deadHolder(slots, slot, d.notify),
		LazyRestore: cfg.Restore == "lazy", StrictEntries: cfg.StrictEntries, Limits: cfg.Limits, Progress: d.progress, Log: wlog,
		Watch: d.saveWatch(), Freeze: d.saveFreeze(), Writers: d.writers, StageDir: filepath.Dir(slot.Name()), FetchTimeout: cfg.FetchTimeout})
	if err != nil {
		return err
	}
	d.ws = ws
	if h := ws.Lease().Holder; h != "" {
		if err := writeLeaseRecord(slots, slot, h); err != nil {
			return fmt.Errorf("record the lease in %s: %w", slots, err)
		}
	}
	d.workDir = filepath.Join(filepath.Dir(slot.Name()), workDirName)
	d.state = filepath.Join(filepath.Dir(slot.Name()), stateFile)
	d.kept = filepath.Join(filepath.Dir(slot.Name()), keptFile)
	sweepTrash(filepath.Dir(slot.Name()), cfg.Keeper, d.log)
	d.setPhase("restoring")
	if err := d.prepareWorkDir(ctx); err != nil {
		return err
	}
	d.setPhase("mounting")
	// The kernel applies the caller's umask before a create reaches the
	// daemon; the daemon's own umask must not mask it a second time (a
	// caller with umask 002 must get group-writable files). Every file the
	// daemon makes for itself names its mode explicitly.
	syscall.Umask(0)
	var fsys server
	if d.serve == ServeNative {
		fsys, err = d.mountNative(ctx, live, wlog)
	} else {
		var f *fuse.FS
		f, err = fuse.Mount(d.at, fuse.Options{ControlSocket: SocketPath(cfg.Mountpoint),
			Dir: d.workDir, FsName: "amlfs:" + cfg.ID, MountOptions: cfg.fuseOptions,
			Timeout: cfg.Timeout, Debug: cfg.Debug, Log: wlog, Content: d.ws.Placeholders(), Live: live, Ops: d.metrics, Shown: d.shown,
		})
		if err == nil {
			fsys, d.fuseFS = f, f
		}
	}
	if err != nil {
		return err
	}
	d.fs = fsys
	mark := fsys.Mark() // natively, a walk of the tree: not under mu
	d.mu.Lock()
	if d.baseMark != -1 {
		d.baseMark = mark
	}
	d.phase = "serving"
	d.mu.Unlock()
	d.log.Info("mounted", "mountpoint", cfg.Mountpoint, "id", cfg.ID, "store", st.String(), "revision", d.baseRev, "serve", d.serve, "passthrough", fsys.Passthrough(), "access", cfg.Access.String())
	return nil
}

// startNoWorkspace mounts only the live mounts (--store none): the root is
// a read-only directory of their prefixes, backed by an empty private
// directory.
func (d *Daemon) startNoWorkspace(ctx context.Context) error {
	cfg := &d.cfg
	if err := os.MkdirAll(cfg.CacheDir, 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(cfg.CacheDir, "no-workspace-")
	if err != nil {
		return err
	}
	// The read-only root holds only the live mounts' prefixes: everyone
	// who may reach the mount may traverse it, as / is 0755.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return err
	}
	d.workDir = dir
	d.baseMark = 0
	if err := d.chooseServe(); err != nil {
		os.RemoveAll(dir)
		return err
	}
	syscall.Umask(0)
	live, err := d.openLive(ctx)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	var fsys server
	if d.serve == ServeNative {
		d.serveWhy = "--serve " + cfg.Serve + ": a read-only bind mount of the live mounts' prefixes, each live mount its own FUSE connection"
		fsys, err = d.mountNoWorkspaceNative(dir, live)
	} else {
		d.serveWhy += "; --store none: the root is a read-only list of the live mounts"
		fsys, err = fuse.Mount(d.at, fuse.Options{ControlSocket: SocketPath(cfg.Mountpoint),
			Dir: dir, FsName: "amlfs:none", MountOptions: cfg.fuseOptions, ReadOnlyRoot: true,
			Timeout: cfg.Timeout, Debug: cfg.Debug, Log: d.log, Live: live, Ops: d.metrics,
		})
	}
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	d.fs = fsys
	d.setPhase("serving")
	d.log.Info("mounted", "mountpoint", cfg.Mountpoint, "store", StoreNone, "mounts", len(live), "serve", d.serve, "passthrough", fsys.Passthrough(), "access", cfg.Access.String())
	return nil
}

// writeState records that the working tree may hold unsaved work. It is
// removed once the tree is saved and dropped at a clean stop.
func (d *Daemon) writeState() error {
	ver, cur := d.ws.Version(), ""
	if idx := d.ws.Index(); idx != nil {
		cur = idx.Current
	}
	st := workState{ID: d.cfg.ID, Store: d.ws.Store().String(), BaseRev: d.baseRev, BaseVersion: &ver, IndexCurrent: &cur, PID: os.Getpid()}
	d.mu.Lock()
	if r := d.resumed; r != nil {
		st.BaseVersion, st.IndexCurrent = r.BaseVersion, r.IndexCurrent
	}
	st.Publishing = d.publishing
	d.mu.Unlock()
	st.Fork = d.ws.Fork()
	st.Serve = d.serve
	data, _ := json.Marshal(st)
	return atomicfile.Write(d.state, "", data, 0o600)
}

// CheckConditionalWrites refuses a store that ignores If-None-Match or
// If-Match: locking or publishing there could silently overwrite another
// writer. unsafe turns the refusal into a warning. A store this host saw
// pass lately (memo) is not probed again.
func CheckConditionalWrites(ctx context.Context, st store.Store, memo ProbeMemo, unsafe bool, notify func(string, ...any)) error {
	p := memo.probe(ctx, st)
	if !p.Reachable || !p.Writable {
		return amlerr.New(amlerr.InvalidStore, st.String(), "store is not reachable or not writable: %s", p.Error)
	}
	if p.Safe() {
		return nil
	}
	if unsafe {
		notify("UNSAFE: %s does not honour conditional writes (%s); publishing anyway because of --unsafe-no-conditional-writes", st, p.Error)
		return nil
	}
	return amlerr.New(amlerr.UnsafeStore, st.String(), "the store does not honour conditional writes (%s), so a lock or publication there could silently overwrite another writer; use a store that does, or pass --unsafe-no-conditional-writes", p.Error)
}

// notify tells the user and logs.
func (d *Daemon) notify(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	d.log.Warn(msg)
	d.hooks.Notify(msg)
}

func (d *Daemon) cleanupFailedStart(ctx context.Context) {
	if d.at != nil {
		d.at.Close()
	}
	for _, c := range d.closers {
		c()
	}
	d.closers = nil
	if d.fresh && d.fs == nil && d.workDir != "" {
		// Restored here and never served: nothing in it is anyone's
		// work. Left, the next mount would resume it as unsaved and
		// publish it over whatever is current then.
		discard(d.workDir, d.cfg.Keeper, d.log)
		os.Remove(d.state)
	}
	if d.slot != nil {
		d.slot.Close()
	}
	if d.ws != nil {
		if err := d.ws.Close(ctx); err != nil {
			d.log.Error("release lock", "provider", "workspace", "op", "release", "path", d.ws.Store().String(), "err", err)
		}
	}
}

// prepareMountpoint resolves the mountpoint once, under policy (making
// it if needed), and cleans a dead mount left by a crashed daemon. From
// then on the daemon reaches it only through the descriptors it returns.
func prepareMountpoint(mp string, policy mountpoint.Policy, nonempty bool, notify func(string, ...any)) (*mountpoint.Dir, error) {
	at, err := openMountpoint(mp, policy)
	if err != nil {
		return nil, err
	}
	if mounted, _ := at.IsMounted(); mounted {
		dead := false
		if top, err := at.Top(); err == nil {
			dead = isDead(probeFD(top))
			top.Close()
		}
		if !dead {
			at.Close()
			if _, err := os.Stat(SocketPath(mp)); err == nil {
				return nil, invalid(mp, "already mounted by amlfs; `amlfs unmount %s` first", mp)
			}
			return nil, invalid(mp, "something is already mounted there")
		}
		notify("cleaned a stale mount at %s (transport endpoint is not connected), left by a crashed daemon", mp)
		uerr := at.Detach()
		if errors.Is(uerr, syscall.EPERM) {
			// Not root: only fusermount3 may detach it, by path (its
			// own checks make it this user's mount).
			uerr = mountpoint.FusermountDetach(mp)
		}
		at.Close()
		if uerr != nil {
			return nil, fmt.Errorf("clean stale mount at %s: %w", mp, uerr)
		}
		if at, err = openMountpoint(mp, policy); err != nil {
			return nil, err
		}
	}
	// Mounting over files hides them until the unmount: only if asked.
	if name, _ := at.Empty(); name != "" {
		if !nonempty {
			at.Close()
			return nil, invalid(mp, "the mountpoint is not empty (it holds %q, among others), and a mount would hide its files: empty it, choose another, or pass -o nonempty", name)
		}
		notify("warning: %s is not empty; its files (such as %q) are hidden under the mount until it is unmounted (-o nonempty)", mp, name)
	}
	return at, nil
}

// openMountpoint is mountpoint.Open, its refusals INVALID_CONFIG.
func openMountpoint(mp string, policy mountpoint.Policy) (*mountpoint.Dir, error) {
	at, err := mountpoint.Open(mp, policy)
	var me *mountpoint.Error
	if errors.As(err, &me) {
		return nil, invalid(me.Path, "mountpoint %s: %s", mp, me.Msg)
	}
	if err != nil {
		return nil, fmt.Errorf("mountpoint %s: %w", mp, err)
	}
	return at, nil
}
