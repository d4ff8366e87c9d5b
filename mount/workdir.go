package mount

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"time"

	"github.com/amlfs/amlfs/revision"
)

// prepareWorkDir restores the chosen revision into the working directory,
// or resumes an unsaved one left by an earlier run.
func (d *Daemon) prepareWorkDir(ctx context.Context) error {
	cfg := &d.cfg
	// A working tree with its state file is unsaved work from an earlier
	// run (a crash, or a failed save): resume it rather than lose it.
	if data, err := os.ReadFile(d.state); err == nil {
		// Unsaved work wins over a kept tree's record (a stop that
		// died after writing it, before removing the state file).
		os.Remove(d.kept)
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
	// A tree made here, not resumed (or adopted as the revision it
	// still is): a start that fails before it is served removes it
	// again, so no next mount takes it for unsaved work.
	d.fresh = true
	if d.adoptKept(ctx) {
		return d.writeState()
	}
	if err := discard(d.workDir, cfg.Keeper, d.log); err != nil {
		return err
	}
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
