package mount

import (
	"fmt"
	"os"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
)

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
	MountedAt string `json:"mountedAt"`
	WorkDir   string `json:"workDir"`
	// Socket is this daemon's control socket: the HTTP API of commits,
	// unmounts and the file tools.
	Socket          string `json:"socket"`
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

// dirtyLocked reports whether the tree has changes no revision holds: it
// was never saved, or changed since baseMark. Must hold d.mu.
func (d *Daemon) dirtyLocked() bool {
	return d.baseMark == -1 || d.fs.Changes() != d.baseMark
}

// status reports the daemon's state; with askStore, whether the lease is
// still held is asked of the store (one request), not only the heartbeat.
func (d *Daemon) status(askStore bool) Status {
	// The gauges read daemon state under d.mu: gather them first.
	snap := d.metrics.Snapshot()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := Status{
		Metrics: snap,
		ID:      d.cfg.ID, Store: StoreNone, Mountpoint: d.cfg.Mountpoint, MountID: d.fs.Mount().ID(), MountedAt: d.fs.Mount().Where(), WorkDir: d.workDir, Socket: SocketPath(d.cfg.Mountpoint),
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
	} else if askStore {
		if err := d.ws.CheckLease(); err != nil {
			st.Lock = "lost: " + err.Error()
		}
	} else if err := d.ws.LeaseErr(); err != nil {
		st.Lock = "lost: " + err.Error()
	}
	return st
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
