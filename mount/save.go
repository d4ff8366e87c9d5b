package mount

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/google/uuid"
)

func (d *Daemon) fetchTimeout() time.Duration {
	if d.cfg.FetchTimeout > 0 {
		return d.cfg.FetchTimeout
	}
	return revision.DefaultFetchTimeout
}

// Commit checkpoints the workspace without unmounting.
func (d *Daemon) Commit(ctx context.Context, revID string) (SaveInfo, error) {
	return d.CommitWith(ctx, revID, CommitOptions{})
}

// CommitOptions change, for one commit, what the mount's flags say: the
// selection (AML's per-save include, exclude and gitignore) and the
// retention. The zero value changes nothing.
type CommitOptions struct {
	// Include and Exclude, if either is set, replace the mount's globs.
	Include []string `json:"include"`
	Exclude []string `json:"exclude"`
	// Gitignore, if set, says whether .gitignore rules apply.
	Gitignore *bool `json:"gitignore,omitempty"`
	// Retention, if not 0, is how many revisions to keep, counting the
	// new one.
	Retention int `json:"retention,omitempty"`
}

// set reports whether o changes anything.
func (o CommitOptions) set() bool {
	return o.Include != nil || o.Exclude != nil || o.Gitignore != nil || o.Retention != 0
}

// selection is the selection of a commit with o over the mount's sel.
func (o CommitOptions) selection(sel format.Selection) (format.Selection, error) {
	if o.Include != nil || o.Exclude != nil {
		sel.Include, sel.Exclude = o.Include, o.Exclude
	}
	if o.Gitignore != nil {
		sel.NoGitignore = !*o.Gitignore
	}
	if o.Retention < 0 {
		return sel, amlerr.New(amlerr.InvalidConfig, "", "retention must be at least 1, not %d", o.Retention)
	}
	return sel, sel.Validate()
}

// selectionKey tells selections apart: a tree unchanged since a save made
// with another selection is saved again.
func selectionKey(sel format.Selection) string {
	return fmt.Sprintf("%q %q %v", sel.Include, sel.Exclude, sel.NoGitignore)
}

// CommitWith checkpoints as Commit does, with opts.
func (d *Daemon) CommitWith(ctx context.Context, revID string, opts CommitOptions) (SaveInfo, error) {
	sel, err := opts.selection(d.cfg.Selection())
	if err != nil {
		return SaveInfo{}, err
	}
	return d.frozen("commit", func() (SaveInfo, error) { return d.saveWith(ctx, revID, sel, opts.Retention) })
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

// frozen runs a checkpoint (what: commit or fork) in the phase
// "committing"; the save holds the writers itself (saveFreeze).
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
	var warn []string
	if res.Unsettled {
		warn = append(warn, fmt.Sprintf("the tree changed during each of the save's %d readings of it (served natively, writes are not held back): each file is saved as its bytes at one instant, the tree as a whole is not one instant", res.Attempts))
	}
	if n := len(res.Earlier); n > 0 {
		info.Earlier = res.Earlier[:min(n, maxListed)]
		warn = append(warn, fmt.Sprintf("%d files changed during every reading of them (a program rewrites them without pause), so they are saved as they were in the previous revision: %s (the next save reads them again)", n, strings.Join(info.Earlier, ", ")))
	}
	if n := len(res.LeftOut); n > 0 {
		info.LeftOut = res.LeftOut[:min(n, maxListed)]
		warn = append(warn, fmt.Sprintf("%d new files changed during every reading of them, so this revision leaves them out: %s (the next save reads them again)", n, strings.Join(info.LeftOut, ", ")))
	}
	info.Warning = strings.Join(warn, "; ")
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
	return d.saveWith(ctx, revID, d.cfg.Selection(), 0)
}

// saveWith saves per sel, keeping retention revisions (0: the mount's).
func (d *Daemon) saveWith(ctx context.Context, revID string, sel format.Selection, retention int) (SaveInfo, error) {
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
	// A save whose publication's reply was lost: if the index read back
	// names it, it is the base, as that save read the tree.
	if rev, ok := d.ws.Settle(ctx); ok {
		d.mu.Lock()
		d.baseRev, d.baseMark, d.baseSel = rev, d.unknownMark, d.unknownSel
		d.mu.Unlock()
	}
	d.mu.Lock()
	baseRev, baseMark := d.baseRev, d.baseMark
	if selectionKey(sel) != d.baseSel {
		baseMark = -1 // the base was saved with another selection
	}
	d.mu.Unlock()
	if baseMark == mark && d.ws.Tracks(d.writers()) {
		// A file of the tree open for writing, or mapped: it may have
		// changed with no event and no new stamp.
		baseMark = -1
	}
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
	var res revision.SaveResult
	var err error
	if retention == 0 {
		res, err = d.ws.Save(ctx, d.workDir, sel, revID)
	} else {
		res, err = d.ws.SaveRetaining(ctx, d.workDir, sel, revID, retention)
	}
	mark = d.readMark // natively, the last reading's
	d.mu.Lock()
	d.publishing = ""
	d.mu.Unlock()
	if err != nil {
		if d.ws.Unsettled() {
			d.unknownMark, d.unknownSel = mark, selectionKey(sel)
		}
		d.metrics.Save("failed", 0, 0, 0)
		return SaveInfo{}, err
	}
	d.metrics.Save("published", res.Elapsed, res.UploadedBytes, res.Bytes-res.UploadedBytes)
	info := saveInfo(res)
	d.mu.Lock()
	d.baseRev, d.baseMark, d.baseSel = res.Entry.ID, mark, selectionKey(sel)
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
	// Earlier names the files that changed during every reading of them
	// (a writer holding them open rewrote them without pause), saved with
	// their bytes of the previous revision; LeftOut, such files the
	// previous revision did not have. The first maxListed of each.
	Earlier []string `json:"earlier,omitempty"`
	LeftOut []string `json:"leftOut,omitempty"`
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

// writers is the workspace's Options.Writers: the serving side's, once
// it serves.
func (d *Daemon) writers() map[uint64]bool {
	if d.fs == nil {
		return nil
	}
	return d.fs.Writers()
}

// saveFreeze is the workspace's Options.Freeze: a save holds the writers
// only while it reads what changed since it began, then uploads from its
// copies. With their cgroup known (--freeze-cgroup, amlfs exec) it freezes
// the cgroup; through FUSE it also holds every mutating call back (the
// barrier), which is enough without a cgroup. Served natively with no
// cgroup, nothing can hold the writers: nil, and saves watch for changes
// instead (saveWatch).
func (d *Daemon) saveFreeze() func(context.Context) (func(uint64) bool, func(), error) {
	if d.freezer == nil && d.serve == ServeNative {
		return nil
	}
	return func(ctx context.Context) (func(uint64) bool, func(), error) {
		thaw := func() {}
		if d.freezer != nil {
			t, err := d.freezeWriters(ctx)
			switch {
			case err == nil:
				thaw = t
			case d.serve == ServeNative:
				return nil, nil, err
			default:
				d.log.Warn("could not freeze the writers' cgroup; holding back only what reaches the mount", "op", "freeze", "err", err)
			}
		}
		// The cgroup first: a process it holds must not be waiting on
		// a FUSE call the barrier holds back.
		thawFS := d.fs.Freeze()
		var once sync.Once
		return d.fs.Clean(), func() { once.Do(func() { thawFS(); thaw() }) }, nil
	}
}

// freezeWriters freezes the writers' cgroup and returns what thaws it
// (at most once). A cgroup that does not freeze in time is thawed, and
// the save reads the tree as it changes, as without one; so is one the
// save would hold longer than maxFreeze.
func (d *Daemon) freezeWriters(ctx context.Context) (func(), error) {
	start := time.Now()
	thawCgroup, err := d.freezer.Freeze(ctx)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	thaw := func() {
		once.Do(func() {
			thawCgroup()
			d.metrics.Frozen(time.Since(start))
			d.log.Debug("writers thawed", "op", "freeze", "seconds", time.Since(start).Seconds())
		})
	}
	limit := time.AfterFunc(maxFreeze, func() {
		d.log.Warn("the checkpoint held the writers frozen for the longest it may; thawed them, and it reads the rest of the tree as it changes", "op", "freeze", "limit", maxFreeze)
		thaw()
	})
	return func() {
		limit.Stop()
		thaw()
	}, nil
}

// maxFreeze bounds how long a checkpoint holds the writers frozen.
const maxFreeze = 30 * time.Second
