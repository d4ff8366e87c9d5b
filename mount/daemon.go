package mount

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
	"github.com/amlfs/amlfs/providers/local"
	s3p "github.com/amlfs/amlfs/providers/s3"
	"github.com/amlfs/amlfs/revision"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/s3client"
	"github.com/amlfs/amlfs/tools"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/uuid"
	"golang.org/x/sys/unix"
)

// Daemon is one running mount.
type Daemon struct {
	cfg   Config
	log   *slog.Logger
	hooks Hooks
	slot  *os.File // flock'd claim on the working-directory slot
	ws    *revision.Workspace
	fs    server
	// shown is the stat data the FUSE mount shows for restored files.
	shown *shown.Shown
	// at is the mountpoint, resolved once (mountpoint.Open); tools serve
	// tool calls beneath the mount's root, held from the mount on.
	at    *mountpoint.Dir
	tools *tools.FS
	// fresh: the working tree was restored (or made) by this start,
	// not resumed from an earlier run.
	fresh bool
	// serve is how the workspace is served, "native" or "fuse", and
	// serveWhy why (Config.Serve and what this host can do).
	serve, serveWhy string
	// liveFS are the live mounts' own FUSE connections (native serving).
	liveFS  []*fuse.FS
	workDir string
	state   string // the state file in the cache dir

	saveMu sync.Mutex // serializes saves; baseRev and baseMark change only under it and mu
	// saveMark is the mark a save took for its unchanged-tree check, which
	// the first reading of the tree (saveWatch) starts from instead of
	// marking the tree again; -1 once used. readMark is the mark the last
	// reading started from: the one the published tree is current as of.
	saveMark, readMark int64 // GUARDED_BY(saveMu)

	mu       sync.Mutex // guards the fields below; never held across I/O, so status answers during a save
	baseRev  string     // GUARDED_BY(mu): the revision the tree was restored from or last saved as
	baseMark int64      // GUARDED_BY(mu): fs.Changes() when baseRev was taken; -1 forces a save
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
	Passthrough() bool
	// Mount is the mount, known by its id and held by descriptor.
	Mount() *mountpoint.Mount
	// Wait returns once the mount went away.
	Wait()
	Unmount(wait time.Duration, lazy bool) error
	// Close frees what serving held, after the unmount.
	Close()
	// Stranded reports placeholders that processes still holding a
	// detached mount could read once the daemon is gone (natively: the
	// mount outlives its unmount, and no one would fill them).
	Stranded() bool
}

// SaveInfo describes the last save.
type SaveInfo struct {
	Revision string    `json:"revision"`
	At       time.Time `json:"at"`
	Files    int       `json:"files"`
	Bytes    int64     `json:"bytes"`
	// Uploaded files (and their bytes) went to the store; Reused ones were
	// linked or copied server-side from the previous revision.
	Uploaded      int   `json:"uploaded"`
	UploadedBytes int64 `json:"uploadedBytes"`
	Reused        int   `json:"reused"`
	// BaseGone counts unchanged files whose object in the base revision
	// was gone (pruned by another writer), uploaded from the tree instead.
	BaseGone int `json:"baseGone"`
	Symlinks int `json:"symlinks"`
	// SpecialFilesSkipped counts the sockets, fifos and device nodes the
	// save left out; SpecialFiles names the first maxListed of them.
	SpecialFilesSkipped int      `json:"specialFilesSkipped"`
	SpecialFiles        []string `json:"specialFiles,omitempty"`
	Seconds             float64  `json:"seconds"`
	Skipped             bool     `json:"skipped,omitempty"`
	// Fork is the new workspace a commit --fork published to.
	Fork string `json:"fork,omitempty"`
	// Warning is what the user must know of this save, if anything.
	Warning string `json:"warning,omitempty"`
	// Attempts is how many times the save read the tree: more than one
	// when the tree, served natively, changed while it was read.
	Attempts int `json:"attempts,omitempty"`
}

// maxListed bounds the paths a SaveInfo lists.
const maxListed = 100

// Note is a line for the user about what the save left out, or "".
func (s *SaveInfo) Note() string {
	if s != nil && s.Warning != "" {
		return s.Warning
	}
	if s == nil || s.SpecialFilesSkipped == 0 {
		return ""
	}
	more := ""
	if n := s.SpecialFilesSkipped - len(s.SpecialFiles); n > 0 {
		more = fmt.Sprintf(" and %d more", n)
	}
	plural := "s"
	if s.SpecialFilesSkipped == 1 {
		plural = ""
	}
	return fmt.Sprintf("revision %s left out %d special file%s (sockets, fifos, devices), which no revision can hold: %s%s (--strict-entries fails the save instead)",
		s.Revision, s.SpecialFilesSkipped, plural, strings.Join(s.SpecialFiles, ", "), more)
}

// Status is what `amlfs status` reports.
type Status struct {
	ID         string `json:"id"`
	Store      string `json:"store"`
	Mountpoint string `json:"mountpoint"`
	// MountID is the mount's id (statx's stx_mnt_id, mountinfo's first
	// field): a client checks that the path it was given is this mount.
	MountID uint64 `json:"mountId"`
	// MountedAt is where the mount is now, as the kernel names it: the
	// mountpoint, unless a parent of it was renamed since.
	MountedAt       string `json:"mountedAt"`
	WorkDir         string `json:"workDir"`
	PID             int    `json:"pid"`
	Phase           string `json:"phase"`
	CurrentRevision string `json:"currentRevision"`
	BaseRevision    string `json:"baseRevision"`
	// ForkOf, for a fork not saved yet, names the workspace BaseRevision
	// belongs to.
	ForkOf      *format.ForkOrigin `json:"forkOf,omitempty"`
	Dirty       bool               `json:"dirty"`
	Changes     int64              `json:"changes"`
	Lock        string             `json:"lock"`
	Passthrough bool               `json:"passthrough"`
	// Serve is how the workspace is served ("native" or "fuse"), and
	// ServeWhy why.
	Serve        string `json:"serve"`
	ServeWhy     string `json:"serveWhy"`
	PendingFiles int    `json:"pendingFiles"` // lazily restored files not fetched yet
	PendingBytes int64  `json:"pendingBytes"`
	// GoneFiles are lazily restored files whose bytes another writer
	// pruned before they were fetched: reads give EIO, and a save fails
	// with BASE_REVISION_GONE until they are removed or rewritten.
	GoneFiles  int       `json:"goneFiles"`
	SavePolicy string    `json:"savePolicy"`
	LastSave   *SaveInfo `json:"lastSave,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	// Health is "ok", or what is wrong with the workspace.
	Health string `json:"health"`
	// Mounts are the live mounts and their health.
	Mounts []MountStatus `json:"mounts,omitempty"`
	// Metrics are the figures --metrics-addr serves, as name{labels}:
	// value (histograms as their _count and _sum).
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// MountStatus is one live mount in Status.
type MountStatus struct {
	Prefix string `json:"prefix"`
	URL    string `json:"url"`
	RO     bool   `json:"ro"`
	Health string `json:"health"` // "ok", or what is wrong
	// Pending counts the uploads and deletes an S3 mount has not done yet.
	Pending int `json:"pending"`
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
	d.cfg.S3.Observe = d.metrics.S3Request
	stopMetrics, err := d.serveMetrics()
	if err != nil {
		return err
	}
	defer stopMetrics()
	if err := d.start(ctx); err != nil {
		d.cleanupFailedStart(ctx)
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
	return d.loop(ctx)
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
	st, err := OpenStore(ctx, cfg.Store, cfg.S3, cfg.ID)
	if err != nil {
		return err
	}
	if err := CheckConditionalWrites(ctx, st, cfg.UnsafeNoConditionalWrites, d.notify); err != nil {
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
		Watch: d.saveWatch(), FetchTimeout: cfg.FetchTimeout})
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
		fsys, err = fuse.Mount(d.at, fuse.Options{ControlSocket: SocketPath(cfg.Mountpoint),
			Dir: d.workDir, FsName: "amlfs:" + cfg.ID, MountOptions: cfg.fuseOptions,
			Timeout: cfg.Timeout, Debug: cfg.Debug, Log: wlog, Content: d.ws.Placeholders(), Live: live, Ops: d.metrics, Shown: d.shown,
		})
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

// prepareWorkDir restores the chosen revision into the working directory,
// or resumes an unsaved one left by an earlier run.
func (d *Daemon) prepareWorkDir(ctx context.Context) error {
	cfg := &d.cfg
	// A working tree with its state file is unsaved work from an earlier
	// run (a crash, or a failed save): resume it rather than lose it.
	if data, err := os.ReadFile(d.state); err == nil {
		var prev workState
		if err := json.Unmarshal(data, &prev); err == nil {
			if _, err := os.Stat(d.workDir); err == nil && cfg.DiscardUnsaved {
				d.notify("discarding unsaved work left by an earlier run (pid %d, based on revision %q), as --discard-unsaved asks", prev.PID, prev.BaseRev)
			} else if err == nil {
				d.notify("resuming unsaved work left by an earlier run (pid %d, based on revision %q) in %s; it will be saved as a new revision", prev.PID, prev.BaseRev, d.workDir)
				d.baseRev, d.baseMark = prev.BaseRev, -1
				ver, was := "", prev.BaseRev
				if prev.BaseVersion != nil {
					ver = *prev.BaseVersion
				}
				if prev.IndexCurrent != nil {
					was = *prev.IndexCurrent
				}
				known := prev.BaseVersion != nil
				if idx := d.ws.Index(); prev.Publishing != "" && idx != nil && idx.Current == prev.Publishing {
					// The earlier run's own save published, and it died
					// before it could say so: the tree is that revision
					// plus whatever changed since (its baseMark is -1, so
					// it saves again).
					was, ver, known = prev.Publishing, "", false
					d.log.Info("the resumed tree's own save had published before the earlier run stopped", "revision", prev.Publishing)
				}
				d.ws.Resume(revision.Resumed{Base: was, Version: ver, Known: known, Fork: prev.Fork})
				d.mu.Lock()
				d.resumed = &workState{IndexCurrent: &was}
				if known {
					d.resumed.BaseVersion = prev.BaseVersion
				}
				d.mu.Unlock()
				if idx := d.ws.Index(); (idx == nil && was != "") || (idx != nil && idx.Current != was) {
					cur := "(none)"
					if idx != nil {
						cur = idx.Current
					}
					d.notify("warning: the resumed tree was made when revision %q was current, but %q is current now: another writer published since, so saving it will fail with AML_PUBLISH_CONFLICT. Mount with --discard-unsaved to restore the current revision instead", was, cur)
				}
				// A tree its users reached only through FUSE cannot hold
				// a marker they planted: older markers count there.
				legacy := prev.Serve != ServeNative
				if n, err := d.ws.Placeholders().Resume(d.workDir, cfg.Selection(), legacy); err != nil {
					return err
				} else if n > 0 {
					d.log.Info("the resumed tree has files whose bytes are still to be fetched", "files", n)
				}
				return d.writeState()
			}
		}
	}
	if err := os.RemoveAll(d.workDir); err != nil {
		return err
	}
	// A tree made here, not resumed: a start that fails before it is
	// served removes it again, so no next mount takes it for unsaved work.
	d.fresh = true
	idx := d.ws.Index()
	switch {
	case cfg.Load == "none":
		d.log.Info("starting from an empty tree (--load none)")
		if err := os.Mkdir(d.workDir, 0o755); err != nil {
			return err
		}
		d.baseMark = -1
	case cfg.From != "":
		from, rev, _ := strings.Cut(cfg.From, "@")
		start := time.Now()
		e, err := d.ws.RestoreFork(ctx, from, rev, d.workDir, cfg.Selection())
		d.metrics.Restore(err == nil, time.Since(start), d.restoredBytes.Load())
		if err != nil {
			return err
		}
		// Unsaved until its first save, which copies from the source.
		d.baseRev, d.baseMark = e.ID, -1
		d.log.Info("forked", "from", from, "revision", e.ID, "format", e.Format, "seconds", time.Since(start).Seconds())
	case idx == nil && cfg.Load == "current":
		d.log.Info("new workspace: the store has no index yet", "id", cfg.ID)
		if err := os.Mkdir(d.workDir, 0o755); err != nil {
			return err
		}
	default:
		start := time.Now()
		e, err := d.ws.Restore(ctx, cfg.Load, d.workDir, cfg.Selection())
		d.metrics.Restore(err == nil, time.Since(start), d.restoredBytes.Load())
		if err != nil {
			return err
		}
		d.baseRev = e.ID
		d.log.Info("restored", "revision", e.ID, "format", e.Format, "seconds", time.Since(start).Seconds())
	}
	return d.writeState()
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
// writer. unsafe turns the refusal into a warning.
func CheckConditionalWrites(ctx context.Context, st store.Store, unsafe bool, notify func(string, ...any)) error {
	p := st.Probe(ctx)
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
		os.RemoveAll(d.workDir)
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

// loop waits for a stop: a signal, a control request, or an external
// unmount.
func (d *Daemon) loop(ctx context.Context) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGHUP)
	defer signal.Stop(sigs)
	served := make(chan struct{})
	go func() { d.fs.Wait(); close(served) }()
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGUSR1:
				go func() {
					info, err := d.Commit(ctx, "")
					if err != nil {
						d.log.Error("checkpoint on SIGUSR1 failed", "provider", "workspace", "op", "commit", "path", d.cfg.Mountpoint, "err", err)
						return
					}
					d.log.Info("checkpoint on SIGUSR1", "revision", info.Revision, "skipped", info.Skipped)
				}()
			case syscall.SIGHUP:
				refreshed, _ := d.Refresh("")
				d.log.Info("SIGHUP: dropped the kernel's caches of the live mounts", "mounts", refreshed)
			default:
				res := d.stop(ctx, stopRequest{reason: sig.String()}, true)
				return resultErr(res)
			}
		case req := <-d.stopReqs:
			res := d.stop(ctx, req, true)
			req.done <- res
			return resultErr(res)
		case <-served:
			d.log.Warn("the mount went away (unmounted externally)")
			res := d.stop(ctx, stopRequest{reason: "external unmount"}, false)
			return resultErr(res)
		}
	}
}

func resultErr(res StopResult) error {
	if res.Error == nil {
		return nil
	}
	return res.Error.Err()
}

// stop unmounts, saves per policy, and releases the lease.
func (d *Daemon) stop(ctx context.Context, req stopRequest, unmount bool) StopResult {
	d.mu.Lock()
	d.stopping = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.stopped = true
		d.mu.Unlock()
	}()
	if req.noSave || d.cfg.Save == SaveNever {
		// A commit under way finishes before the daemon stops, and none
		// runs after it says it stopped (save refuses once stopped).
		d.saveMu.Lock()
		defer d.saveMu.Unlock()
	}
	d.log.Info("stopping", "reason", req.reason, "save", d.cfg.Save, "noSave", req.noSave)
	d.stopPrefetch()
	<-d.prefetchDone
	d.setPhase("unmounting")
	var res StopResult
	// The tools' descriptor of the root would hold the mount busy.
	if d.tools != nil {
		d.tools.Close()
	}
	d.unmountLive()
	if unmount {
		if err := d.fs.Unmount(3*time.Second, true); err != nil {
			d.log.Error("unmount", "provider", "daemon", "op", "unmount", "path", d.cfg.Mountpoint, "err", err)
		}
	}
	if d.ws == nil {
		// --store none: nothing to save or release.
		d.fs.Close()
		for _, c := range d.closers {
			c()
		}
		os.RemoveAll(d.workDir)
		d.setPhase("stopped")
		d.log.Info("stopped", "exitCode", 0)
		return res
	}
	if !req.noSave && d.cfg.Save != SaveNever {
		d.setPhase("saving")
		// After a lazy detach, open files may still be written through
		// FUSE: hold mutations back while the snapshot is taken.
		thaw := d.fs.Freeze()
		info, err := d.save(ctx, req.revision)
		thaw()
		if err != nil {
			d.log.Error("save failed; the previous revision is still current, and the working tree is kept for recovery", "provider", "workspace", "op", "save", "path", d.workDir, "err", err)
			if amlerr.Code(err) == "" {
				err = amlerr.Wrap(amlerr.SaveFailed, d.workDir, err)
			}
			body := amlerr.BodyOf(err)
			res.Error, res.ExitCode = &body, body.ExitCode
		} else {
			res.Saved = &info
		}
	}
	d.setPhase("releasing")
	if d.fs.Stranded() {
		// Processes still hold the detached mount's files open: give
		// them every placeholder's bytes before the daemon goes, within
		// one fetch timeout.
		pctx, cancel := context.WithTimeout(ctx, d.fetchTimeout())
		d.ws.Placeholders().Prefetch(pctx, max(d.cfg.Prefetch, 4))
		cancel()
	}
	// A fill waiting on a stalled store must not hold the stop: every
	// fetch under way ends now, and its reader gets EIO.
	d.ws.Placeholders().Stop()
	d.fs.Close()
	for _, c := range d.closers {
		c()
	}
	if err := d.ws.Close(context.WithoutCancel(ctx)); err != nil {
		d.log.Error("release lock", "provider", "workspace", "op", "release", "path", d.ws.Store().String(), "err", err)
		if res.Error == nil {
			body := amlerr.BodyOf(err)
			res.Error, res.ExitCode = &body, amlerr.ExitOther
		}
	}
	d.mu.Lock()
	dirty := d.dirtyLocked()
	d.mu.Unlock()
	if res.Error == nil && (!dirty || d.cfg.Save == SaveNever || req.noSave) {
		// Nothing unsaved is worth keeping: drop the working tree.
		if dirty {
			d.log.Info("discarding unsaved changes (save disabled)")
		}
		os.RemoveAll(d.workDir)
		os.Remove(d.state)
	}
	d.slot.Close()
	d.setPhase("stopped")
	d.log.Info("stopped", "exitCode", res.ExitCode)
	writeLastStop(d.cfg, res)
	return res
}

// LastStop is the final state of the last daemon to serve a mountpoint,
// kept in the runtime dir so that a retried unmount can report it.
type LastStop struct {
	StopResult
	ID        string    `json:"id"`
	StoppedAt time.Time `json:"stoppedAt"`
}

func lastStopPath(mountpoint string) string {
	return filepath.Join(RuntimeDir(), mountKey(mountpoint)+".last.json")
}

func writeLastStop(cfg Config, res StopResult) {
	data, _ := json.Marshal(LastStop{StopResult: res, ID: cfg.ID, StoppedAt: time.Now().UTC()})
	atomicfile.Write(lastStopPath(cfg.Mountpoint), "", data, 0o600)
}

// ReadLastStop returns the final state of the last daemon that served
// mountpoint, if one was recorded.
func ReadLastStop(mountpoint string) (LastStop, bool) {
	var ls LastStop
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return ls, false
	}
	// A record in a runtime dir others could write to proves nothing.
	if !runtimeDirTrusted() {
		return ls, false
	}
	f, err := os.OpenFile(lastStopPath(abs), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return ls, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil || json.Unmarshal(data, &ls) != nil {
		return ls, false
	}
	return ls, true
}

func (d *Daemon) fetchTimeout() time.Duration {
	if d.cfg.FetchTimeout > 0 {
		return d.cfg.FetchTimeout
	}
	return revision.DefaultFetchTimeout
}

// Commit checkpoints the workspace without unmounting.
func (d *Daemon) Commit(ctx context.Context, revID string) (SaveInfo, error) {
	return d.frozen("commit", func() (SaveInfo, error) { return d.save(ctx, revID) })
}

// CommitFork publishes the tree as the first revision of the new
// workspace newID on the same store, under that workspace's own lease. The
// mounted workspace stays as it was: its base, its unsaved changes, its
// lease.
func (d *Daemon) CommitFork(ctx context.Context, newID, revID string) (SaveInfo, error) {
	return d.frozen("fork", func() (SaveInfo, error) {
		d.saveMu.Lock()
		defer d.saveMu.Unlock()
		d.mu.Lock()
		base, stopped := d.baseRev, d.stopped
		d.mu.Unlock()
		if stopped {
			return SaveInfo{}, errors.New("the daemon has stopped")
		}
		res, err := d.ws.SaveFork(ctx, d.workDir, d.cfg.Selection(), newID, revID, base)
		if err != nil {
			d.metrics.Save("failed", 0, 0, 0)
			return SaveInfo{}, err
		}
		d.metrics.Save("published", res.Elapsed, res.UploadedBytes, res.Bytes-res.UploadedBytes)
		d.log.Info("saved the tree as a fork", "fork", newID, "revision", res.Entry.ID, "files", res.Files,
			"uploaded", res.Uploaded, "reused", res.Reused, "seconds", res.Elapsed.Seconds())
		info := saveInfo(res)
		info.Fork = newID
		return info, nil
	})
}

// frozen runs a checkpoint (what: commit or fork) with every mutating FUSE
// call held back and the phase "committing".
func (d *Daemon) frozen(what string, fn func() (SaveInfo, error)) (SaveInfo, error) {
	d.mu.Lock()
	stopping := d.stopping
	d.mu.Unlock()
	if stopping {
		return SaveInfo{}, errors.New("the daemon is stopping")
	}
	if d.ws == nil {
		return SaveInfo{}, invalid(d.cfg.Mountpoint, "mounted with --store none: there is no workspace to %s", what)
	}
	thaw := d.fs.Freeze()
	defer thaw()
	d.setPhase("committing")
	defer func() {
		d.mu.Lock()
		if d.phase == "committing" {
			d.phase = "serving"
		}
		d.mu.Unlock()
	}()
	return fn()
}

// saveInfo reports a published save.
func saveInfo(res revision.SaveResult) SaveInfo {
	info := SaveInfo{Revision: res.Entry.ID, At: time.Now(), Files: res.Files, Bytes: res.Bytes, Seconds: res.Elapsed.Seconds(),
		Uploaded: res.Uploaded, UploadedBytes: res.UploadedBytes, Reused: res.Reused, BaseGone: res.BaseGone,
		Symlinks: res.Symlinks, SpecialFilesSkipped: len(res.Skipped), SpecialFiles: res.Skipped[:min(len(res.Skipped), maxListed)],
		Attempts: res.Attempts}
	if res.Unsettled {
		info.Warning = fmt.Sprintf("the tree changed during each of the save's %d readings of it (served natively, writes are not held back): each file is saved as its bytes at one instant, the tree as a whole is not one instant", res.Attempts)
	}
	return info
}

// saveWatch is the workspace's Options.Watch when the tree is served
// natively, where a save cannot hold writes back: each reading of the
// tree starts a watch for changes (Mark), and a save whose reading saw
// one reads the tree again (revision.SaveAttempts).
func (d *Daemon) saveWatch() func() func() bool {
	if d.serve != ServeNative {
		return nil
	}
	return func() func() bool {
		if d.fs == nil {
			return nil
		}
		m := d.saveMark
		if m < 0 {
			m = d.fs.Mark()
		}
		d.saveMark, d.readMark = -1, m
		return func() bool { return d.fs.Changes() != m }
	}
}

// save publishes the working tree unless it is unchanged since it was
// restored or last saved and that revision is still current.
func (d *Daemon) save(ctx context.Context, revID string) (SaveInfo, error) {
	d.saveMu.Lock()
	defer d.saveMu.Unlock()
	d.mu.Lock()
	stopped := d.stopped
	d.mu.Unlock()
	if stopped {
		return SaveInfo{}, errors.New("the daemon has stopped")
	}
	mark := d.fs.Mark()
	d.saveMark, d.readMark = mark, mark
	defer func() { d.saveMark = -1 }()
	d.mu.Lock()
	baseRev, baseMark := d.baseRev, d.baseMark
	d.mu.Unlock()
	skip := func(rev string) (SaveInfo, error) {
		d.metrics.Save("unchanged", 0, 0, 0)
		info := SaveInfo{Revision: rev, At: time.Now(), Skipped: true}
		d.mu.Lock()
		d.lastSave = &info
		d.mu.Unlock()
		return info, nil
	}
	if idx := d.ws.Index(); revID != "" && idx != nil && idx.Current == revID && baseRev == revID && baseMark == mark {
		// A retry: the caller's id is current and holds this tree.
		d.log.Info("revision id is current and the tree is unchanged; nothing written", "revision", revID)
		return skip(revID)
	}
	if idx := d.ws.Index(); revID == "" && baseMark == mark && idx != nil && idx.Current == baseRev {
		// Say what the store says, not what this mount remembers.
		cur, err := d.ws.StoreCurrent(ctx)
		if err != nil {
			return SaveInfo{}, err
		}
		if cur != baseRev {
			msg := fmt.Sprintf("the tree is unchanged since revision %s, but the store's current revision is %s (another writer published); nothing saved", baseRev, cur)
			d.log.Warn(msg, "revision", baseRev, "current", cur)
			info, err := skip(cur)
			info.Warning = msg
			return info, err
		}
		d.log.Info("no changes since the last revision; it stays current", "revision", baseRev)
		return skip(baseRev)
	}
	// The id is chosen here, and the state file names it before the save
	// publishes: if the daemon dies after the publication but before the
	// state file says the tree is saved, the next mount sees that the
	// revision now current is this tree's own, not another writer's.
	if revID == "" {
		revID = uuid.NewString()
	}
	d.mu.Lock()
	d.publishing = revID
	d.mu.Unlock()
	if err := d.writeState(); err != nil {
		return SaveInfo{}, err
	}
	res, err := d.ws.Save(ctx, d.workDir, d.cfg.Selection(), revID)
	mark = d.readMark // natively, the last reading's
	d.mu.Lock()
	d.publishing = ""
	d.mu.Unlock()
	if err != nil {
		d.metrics.Save("failed", 0, 0, 0)
		return SaveInfo{}, err
	}
	d.metrics.Save("published", res.Elapsed, res.UploadedBytes, res.Bytes-res.UploadedBytes)
	info := saveInfo(res)
	d.mu.Lock()
	d.baseRev, d.baseMark = res.Entry.ID, mark
	d.lastSave = &info
	d.resumed = nil
	d.mu.Unlock()
	if err := d.writeState(); err != nil {
		d.log.Warn("write state", "provider", "workspace", "op", "write-state", "path", d.state, "err", err)
	}
	d.log.Info("saved revision", "revision", res.Entry.ID, "files", res.Files, "bytes", res.Bytes,
		"uploaded", res.Uploaded, "uploadedBytes", res.UploadedBytes, "reused", res.Reused, "baseGone", res.BaseGone, "symlinks", res.Symlinks,
		"specialFilesSkipped", len(res.Skipped), "seconds", res.Elapsed.Seconds(), "attempts", res.Attempts, "pruned", res.Pruned)
	return info, nil
}

// dirtyLocked reports whether the tree has changes no revision holds: it
// was never saved, or changed since baseMark. Must hold d.mu.
func (d *Daemon) dirtyLocked() bool {
	return d.baseMark == -1 || d.fs.Changes() != d.baseMark
}

// Status reports the daemon's state.
func (d *Daemon) Status() Status {
	// The gauges read daemon state under d.mu: gather them first.
	snap := d.metrics.Snapshot()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := Status{
		Metrics: snap,
		ID:      d.cfg.ID, Store: StoreNone, Mountpoint: d.cfg.Mountpoint, MountID: d.fs.Mount().ID(), MountedAt: d.fs.Mount().Where(), WorkDir: d.workDir,
		PID: os.Getpid(), Phase: d.phase, BaseRevision: d.baseRev, Changes: d.fs.Changes(),
		Passthrough: d.fs.Passthrough(), Serve: d.serve, ServeWhy: d.serveWhy, SavePolicy: d.cfg.Save, LastSave: d.lastSave, StartedAt: d.startedAt,
		Lock: "none", Health: "ok",
	}
	for i, p := range d.live {
		m := d.cfg.Live[i]
		ms := MountStatus{Prefix: m.Prefix, URL: m.URL, RO: m.RO, Health: "ok"}
		if err := p.Health(); err != nil {
			ms.Health = err.Error()
		}
		if q, ok := p.(queued); ok {
			ms.Pending = q.Pending()
		}
		st.Mounts = append(st.Mounts, ms)
	}
	if d.ws == nil {
		st.SavePolicy = SaveNever
		return st
	}
	st.Store = d.ws.Store().String()
	st.Dirty = d.dirtyLocked()
	st.PendingFiles, st.PendingBytes = d.ws.Placeholders().Pending()
	st.ForkOf = d.ws.Fork()
	if st.GoneFiles = d.ws.Placeholders().Gone(); st.GoneFiles > 0 {
		st.Health = fmt.Sprintf("%d lazily restored files cannot be fetched: another writer pruned the revision holding their bytes; reads give EIO and a save fails with %s until they are removed or rewritten (or remount with --discard-unsaved)", st.GoneFiles, amlerr.BaseRevisionGone)
	}
	if idx := d.ws.Index(); idx != nil {
		st.CurrentRevision = idx.Current
	}
	st.Lock = "held"
	if d.cfg.NoLock {
		st.Lock = "none"
	} else if err := d.ws.CheckLease(); err != nil {
		st.Lock = "lost: " + err.Error()
	}
	return st
}

// Refresh drops the kernel's cached entries, attributes and pages of path
// (relative to the mount root; "" for every live mount) in the live mount
// holding it. It returns the prefixes refreshed. The workspace has nothing
// to refresh: amlfs is its only writer.
func (d *Daemon) Refresh(path string) ([]string, error) {
	rel := strings.Trim(filepath.ToSlash(filepath.Clean("/"+path)), "/")
	var done []string
	for i, p := range d.live {
		m := d.cfg.Live[i]
		var sub string
		switch {
		case rel == "":
		case rel == m.Rel():
		case strings.HasPrefix(rel, m.Rel()+"/"):
			sub = strings.TrimPrefix(rel, m.Rel()+"/")
		default:
			continue
		}
		if err := p.Refresh(sub); err != nil {
			return done, err
		}
		done = append(done, m.Prefix)
	}
	if rel != "" && len(done) == 0 {
		return nil, invalid(path, "not under a live mount; the workspace needs no refresh")
	}
	return done, nil
}

// openLive opens the live mounts' providers. A bucket that does not
// answer now is mounted all the same: its paths give EIO until it does,
// and status shows its health.
func (d *Daemon) openLive(ctx context.Context) ([]fuse.Live, error) {
	var live []fuse.Live
	var client *s3.Client
	var dataCache *cache.Cache
	for i, m := range d.cfg.Live {
		log := d.log.With("provider", m.Kind, "mount", m.Prefix)
		tag := uint16(i + 1)
		switch m.Kind {
		case "file":
			p, err := local.New(local.Options{Dir: m.Dir, RO: m.RO, Tag: tag, Log: log})
			if err != nil {
				return nil, amlerr.Wrap(amlerr.InvalidConfig, m.Prefix, fmt.Errorf("live mount %s: %w", m.URL, err))
			}
			d.closers = append(d.closers, p.Close)
			d.live = append(d.live, p)
			attr, err := p.RootAttr()
			if err != nil {
				return nil, err
			}
			live = append(live, fuse.Live{Rel: m.Rel(), Root: p.Root(), Attr: attr})
		case "s3":
			if client == nil {
				o := d.cfg.S3
				// A live mount answers EIO soon rather than retrying
				// for a minute: the caller may retry.
				o.MaxAttempts = 3
				var err error
				if client, err = s3client.NewClient(ctx, o); err != nil {
					return nil, amlerr.Wrap(amlerr.InvalidConfig, m.Prefix, err)
				}
				dir, err := liveCacheDir(d.cfg.CacheDir)
				if err != nil {
					return nil, err
				}
				if dataCache, err = cache.New(dir, d.cfg.CacheSize); err != nil {
					return nil, amlerr.Wrap(amlerr.InvalidConfig, "--cache-size", err)
				}
				d.closers = append(d.closers, func() error { return os.RemoveAll(dir) })
			}
			p := s3p.NewLive(s3p.LiveOptions{Client: client, Bucket: m.Bucket, Prefix: m.Key, RO: m.RO, TTL: d.cfg.MetadataTTL,
				Cache: dataCache, Log: log, Tag: tag, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())})
			if err := p.Check(ctx); err != nil {
				log.Error("S3 live mount does not answer; its paths give EIO until it does", "op", "check", "path", m.URL, "err", err)
			}
			// Uploads still waiting at unmount get this long.
			d.closers = append([]func() error{func() error { return p.Close(5 * time.Minute) }}, d.closers...)
			d.live = append(d.live, p)
			live = append(live, fuse.Live{Rel: m.Rel(), Root: p.Root(), Attr: p.RootAttr()})
		}
		log.Info("live mount", "prefix", m.Prefix, "url", m.URL, "ro", m.RO)
	}
	return live, nil
}

// liveCacheDir is this process's S3 data cache directory under the cache
// dir. Those of processes that are gone are removed.
func liveCacheDir(cacheDir string) (string, error) {
	old, _ := filepath.Glob(filepath.Join(cacheDir, "live-*"))
	for _, o := range old {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(o), "live-"))
		if err == nil && pid != os.Getpid() && syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(o)
		}
	}
	return filepath.Join(cacheDir, fmt.Sprintf("live-%d", os.Getpid())), nil
}
