package revision

import (
	"context"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"

	"github.com/amlfs/amlfs/amlerr"
)

// Forks. A fork is a new workspace that begins as a revision of another
// one on the same store. Its tree is restored, lazily as any other, from
// the source's objects by foreign keys (store.go), and its first save
// reuses them as an incremental save reuses its base's: a server-side copy
// on S3, a hard link on a file store. From then on the fork holds its own
// copies, and the source may prune the revision. The fork takes its own
// lease, never the source's; its first revision's manifest names the
// source in the extension key amlfs.fork, which AML ignores.

// RestoreFork restores revision rev ("" or "current" for the current one)
// of workspace from, on the same store, at dir, as the beginning of w,
// which must have no revisions yet.
func (w *Workspace) RestoreFork(ctx context.Context, from, rev, dir string, sel format.Selection) (format.Entry, error) {
	fam, ok := w.store.(store.Family)
	if !ok {
		return format.Entry{}, amlerr.New(amlerr.InvalidConfig, w.store.String(), "this store cannot fork")
	}
	if from == w.opts.ID {
		return format.Entry{}, amlerr.New(amlerr.InvalidConfig, from, "--from names the workspace itself")
	}
	if w.Index() != nil {
		return format.Entry{}, amlerr.New(amlerr.InvalidConfig, w.opts.ID, "workspace %q already has revisions in %s; --from seeds a new workspace (choose a new --id, or mount without --from)", w.opts.ID, w.store)
	}
	ss, err := fam.Sibling(from) // refuses an id AML refuses
	if err != nil {
		return format.Entry{}, amlerr.Wrap(amlerr.InvalidConfig, from, err)
	}
	idx, _, err := readIndex(ctx, ss)
	if err != nil {
		return format.Entry{}, err
	}
	if idx == nil {
		return format.Entry{}, amlerr.New(amlerr.InvalidConfig, from, "workspace %q has no revisions in %s to fork from", from, ss)
	}
	e, ok := idx.Resolve(rev)
	if !ok {
		return format.Entry{}, amlerr.New(amlerr.InvalidConfig, rev, "no such revision of %q in %s", from, ss)
	}
	origin := &format.ForkOrigin{ID: from, Revision: e.ID}
	e.Path = ss.(store.Family).Foreign(e.Path)
	if _, err := w.restore(ctx, e, dir, sel); err != nil {
		return format.Entry{}, err
	}
	w.setFork(origin)
	return e, nil
}

// setFork says that the tree is a fork of origin not saved yet (a fork
// resumed after a crash): its first save records it.
func (w *Workspace) setFork(origin *format.ForkOrigin) {
	w.lmu.Lock()
	defer w.lmu.Unlock()
	w.fork = origin
}

// Fork returns the origin of a fork whose first save is still to come, or
// nil.
func (w *Workspace) Fork() *format.ForkOrigin {
	w.lmu.Lock()
	defer w.lmu.Unlock()
	return w.fork
}

// SaveFork publishes the tree at dir, w's working tree, as the first
// revision of the new workspace newID on the same store, under newID's own
// lease, and leaves w as it was: its base, lease and index do not change.
// Files unchanged since w's base revision are copied from it server-side
// (or hard-linked). base names that revision, for the fork's record.
func (w *Workspace) SaveFork(ctx context.Context, dir string, sel format.Selection, newID, revID, base string) (SaveResult, error) {
	fam, ok := w.store.(store.Family)
	if !ok {
		return SaveResult{}, amlerr.New(amlerr.InvalidConfig, w.store.String(), "this store cannot fork")
	}
	if newID == w.opts.ID {
		return SaveResult{}, amlerr.New(amlerr.InvalidConfig, newID, "--fork names the mounted workspace itself; a fork needs a new id")
	}
	ns, err := fam.Sibling(newID) // refuses an id AML refuses
	if err != nil {
		return SaveResult{}, amlerr.Wrap(amlerr.InvalidConfig, newID, err)
	}
	// A new workspace needs no lease and no read of its index: its first
	// publication is conditional on there being none (If-None-Match), so
	// a writer that made the workspace in between, or a second fork of
	// the same name, makes this one fail, never overwrites it. That keeps
	// a fork's first save to the artifact and the publication.
	opts := w.opts
	opts.ID, opts.NoLock = newID, true
	nw, err := newWorkspace(ns, opts)
	if err != nil {
		return SaveResult{}, err
	}
	defer nw.Close(context.WithoutCancel(ctx))
	nw.settleFormat()
	nw.orphansMaybe = false // no earlier save of its own can have left any
	nw.created = true
	origin := &format.ForkOrigin{ID: w.opts.ID, Revision: base}
	if f := w.Fork(); f != nil {
		origin = f // w is a fork not saved yet: the origin is its source's
	}
	nw.setFork(origin)
	return nw.save(ctx, dir, sel, revID, w, nw.opts.Retention)
}
