package mount

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/amlfs/amlfs/revision"
)

// keptFile is a slot's record of a working tree kept at a clean stop
// (revision.WriteKept): the tree is then a revision exactly, saved, and
// the next mount of that revision adopts it rather than restoring it
// afresh. Without it a slot's tree with no state file is discarded.
const keptFile = "kept.json"

// keepTree keeps the working tree of a clean stop for the next mount of
// its revision, instead of discarding it: served natively (through FUSE a
// restore costs one mkdir per directory, and the files show the stat data
// the view gets only from a restore), the index's current revision, and
// unmounted with no process left in it (a detached mount's processes
// could still change it). --no-keep keeps none. It reports whether the
// tree was kept.
func (d *Daemon) keepTree(unmounted bool) bool {
	if d.cfg.NoKeep || d.serve != ServeNative || !unmounted || d.fs.Detached() || d.cfg.Restore != "lazy" {
		return false
	}
	d.mu.Lock()
	rev := d.baseRev
	d.mu.Unlock()
	if idx := d.ws.Index(); rev == "" || idx == nil || idx.Current != rev {
		return false
	}
	if d.ws.Tracks(d.writers()) {
		// A process in another mount namespace still holds a file of
		// the tree open for writing: it could change it with no new
		// stamp after the stop.
		d.log.Info("the working tree is not kept: a file of it is still open for writing", "revision", rev)
		return false
	}
	if err := d.ws.WriteKept(d.kept, d.workDir, rev); err != nil {
		d.log.Info("the working tree is not kept", "revision", rev, "why", err)
		return false
	}
	d.log.Info("kept the working tree for the next mount of its revision", "revision", rev, "path", d.workDir)
	return true
}

// adoptKept takes up the tree a clean stop kept in the slot if it is
// still the revision this mount restores, as revision.Adopt proves; an
// entry the revision does not have (one the save left out: ignored, a
// special file) is moved aside and removed. It reports whether the tree
// was adopted; if not, the caller discards it and restores afresh. The
// record is removed either way: from now on the state file speaks for
// the tree.
func (d *Daemon) adoptKept(ctx context.Context) bool {
	cfg := &d.cfg
	if _, err := os.Lstat(d.kept); err != nil {
		return false
	}
	defer os.Remove(d.kept)
	switch {
	case d.serve != ServeNative:
		d.log.Info("a tree kept by a native mount is not adopted through FUSE; restoring afresh")
		return false
	case cfg.Load == "none" || cfg.From != "" || d.ws.Index() == nil:
		return false
	}
	start := time.Now()
	trash, n := "", 0
	aside := func(rel string) error {
		if trash == "" {
			trash = trashName(filepath.Dir(d.workDir))
			if err := os.Mkdir(trash, 0o700); err != nil {
				return err
			}
		}
		n++
		return os.Rename(filepath.Join(d.workDir, filepath.FromSlash(rel)), filepath.Join(trash, strconv.Itoa(n)))
	}
	a, err := d.ws.Adopt(ctx, d.kept, cfg.Load, d.workDir, cfg.Selection(), aside)
	if trash != "" {
		removeTrash(trash, cfg.Keeper, d.log)
	}
	if err != nil {
		if errors.Is(err, revision.ErrNotKept) {
			d.log.Info("the tree kept at the last stop is not adopted; restoring afresh", "why", err)
		} else {
			d.log.Warn("adopt the tree kept at the last stop; restoring afresh", "op", "adopt", "path", d.workDir, "err", err)
		}
		return false
	}
	d.baseRev = a.Entry.ID
	d.adopted = true
	d.metrics.Restore(true, time.Since(start), 0)
	d.log.Info("adopted the tree kept at the last stop", "revision", a.Entry.ID, "format", a.Entry.Format,
		"placeholders", a.Pending, "movedAside", a.Aside, "seconds", time.Since(start).Seconds())
	return true
}
