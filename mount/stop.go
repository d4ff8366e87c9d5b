package mount

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/atomicfile"
	"golang.org/x/sys/unix"
)

// loop waits for a stop: a signal, a control request, or an external
// unmount.
func (d *Daemon) loop(ctx context.Context, sigs <-chan os.Signal) error {
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
		// --store none: nothing to save or release. Its tree is not in
		// a slot: removed here, leaving the cache dir as it was.
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
		// FUSE: the save holds them back while it reads (saveFreeze).
		info, err := d.save(ctx, req.revision)
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
		// Nothing unsaved is worth keeping: the working tree goes.
		if dirty {
			d.log.Info("discarding unsaved changes (save disabled)")
		}
		// A tree that is its revision exactly is kept for the next
		// mount of it, in place of a restore.
		if dirty || !d.keepTree(unmount) {
			discard(d.workDir, d.cfg.Keeper, d.log)
		}
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
