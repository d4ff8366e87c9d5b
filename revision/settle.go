package revision

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

// Outcomes not seen. A publication whose reply was lost (a timeout, a
// reset connection, a 5xx after the request was sent, or a failed
// precondition on the SDK's retry of a request that had landed) may have
// happened. It is settled by reading the index back before anything else:
// an index that names the revision means it was published; one that moved
// on without it means it never will be (the publication was conditional
// on the version it replaced); one still at that version gets the same
// conditional publication again. Only a publication known not to have
// happened has its artifact removed.

var (
	// errOutcomeUnknown marks a publication no read-back could settle.
	errOutcomeUnknown = errors.New("the outcome of the publication is unknown")
	// errSuperseded marks a publication that happened, and that another
	// writer's followed.
	errSuperseded = errors.New("published, then superseded")
)

// settleTries bounds the read-backs of one settlement; settleWait is the
// first pause between them, doubled each time.
const (
	settleTries = 4
	settleWait  = 250 * time.Millisecond
)

// unknownPub is a publication whose outcome is not known.
type unknownPub struct {
	entry format.Entry
	prev  string // the index version it was conditional on
	// published does what follows the publication (Workspace.save).
	published func(next *format.Index, ver string)
}

// settle settles the publication of entry as data, which failed with
// perr: it returns the index's version if it happened, perr (wrapped) if
// it did not, and an error wrapping errOutcomeUnknown if that cannot be
// told. Must hold w.mu.
func (w *Workspace) settle(ctx context.Context, entry format.Entry, data []byte, perr error) (string, error) {
	// A caller gone does not end the settlement: its outcome is the
	// store's state.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	wait := settleWait
	var last error
	for try := 0; try < settleTries; try++ {
		if try > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				try = settleTries
				continue
			}
			wait *= 2
		}
		idx, ver, err := w.readBack(ctx)
		if err != nil {
			last = err
			continue
		}
		if named(idx, entry) {
			w.log.Warn("the publication's reply was lost, and the index read back names the revision: it is published", "op", "publish", "revision", entry.ID, "err", perr)
			if idx.Current != entry.ID {
				// Published, and another writer published on top since:
				// this tree is stale, as after any other writer.
				return "", amlerr.Wrap(amlerr.PublishConflict, w.opts.ID, fmt.Errorf("%w: revision %s was published, then another writer published %s on top of it; it stays in the index, nothing was removed, and the tree is kept", errSuperseded, entry.ID, idx.Current))
			}
			return ver, nil
		}
		if ver != w.version || try == settleTries-1 {
			// Moved on without it: the conditional publication can never
			// land now. Or still the version this save read after every
			// request of this save came back: none landed.
			return "", perr
		}
		// Still the version this save read: the request did not land.
		// The same conditional publication again settles it.
		v, err := w.store.PublishIndex(ctx, data, w.version)
		if err == nil {
			w.log.Warn("the publication failed, and was sent again", "op", "publish", "revision", entry.ID, "err", perr)
			return v, nil
		}
		last = err
	}
	return "", amlerr.Wrap(amlerr.SaveFailed, w.opts.ID, fmt.Errorf("%w: revision %s may or may not have been published (%v), and the index could not be read back (%v); its artifact is kept, and the next save or mount reads the index again",
		errOutcomeUnknown, entry.ID, perr, last))
}

// readBack reads the index as the store has it now ("" and nil: none).
func (w *Workspace) readBack(ctx context.Context) (*format.Index, string, error) {
	data, ver, err := w.store.ReadIndex(ctx)
	if errors.Is(err, store.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	idx, err := format.ParseIndex(data)
	if err != nil {
		return nil, "", amlerr.Wrap(amlerr.InvalidStore, format.IndexKey, err)
	}
	return idx, ver, nil
}

// named reports whether idx lists entry: the revision this process
// published (its id, artifact and time).
func named(idx *format.Index, entry format.Entry) bool {
	if idx == nil {
		return false
	}
	e, ok := idx.Find(entry.ID)
	return ok && e.Path == entry.Path && e.CreatedAt == entry.CreatedAt
}

// settleUnknown settles an earlier publication whose outcome was not
// known, if there is one: published, it takes effect now (the index, the
// base, the pruning); not, its artifact goes once no publication can name
// it. It reports the revision, if it was published and is current. Must
// hold w.mu.
func (w *Workspace) settleUnknown(ctx context.Context) (string, bool) {
	u := w.unknown
	if u == nil {
		return "", false
	}
	idx, ver, err := w.readBack(ctx)
	if err != nil {
		w.log.Warn("an earlier publication's outcome is still unknown: the index cannot be read", "op", "publish", "revision", u.entry.ID, "err", err)
		return "", false
	}
	switch {
	case named(idx, u.entry):
		w.unknown = nil
		if idx.Current != u.entry.ID {
			// Published, and superseded: the next save is stale.
			w.log.Warn("an earlier publication took place, and another writer published on top of it", "op", "publish", "revision", u.entry.ID, "current", idx.Current)
			return "", false
		}
		w.log.Info("an earlier publication whose reply was lost took place", "op", "publish", "revision", u.entry.ID)
		u.published(idx, ver)
		return u.entry.ID, true
	case ver != u.prev:
		// Moved on without it: it never will be published.
		w.unknown = nil
		w.removeUnpublished(ctx, u.entry.Path)
	}
	// Still at the version it was conditional on: the next publication,
	// conditional on that version too, decides (until then the artifact
	// stays).
	return "", false
}

// Settle settles an earlier publication whose outcome was not known (a
// lost reply), reading the index back. It reports the revision if it was
// published and is current: the tree as that save read it.
func (w *Workspace) Settle(ctx context.Context) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.settleUnknown(ctx)
}

// dropUnknown removes the artifact of an earlier publication whose
// outcome was unknown, once a publication conditional on the same version
// (prev) succeeded: it can never be published now. Must hold w.mu.
func (w *Workspace) dropUnknown(ctx context.Context, prev string) {
	u := w.unknown
	if u == nil || u.prev != prev {
		return
	}
	w.unknown = nil
	w.removeUnpublished(ctx, u.entry.Path)
}

// removeUnpublished removes the artifact at path of a publication known
// never to take place, even if ctx is done.
func (w *Workspace) removeUnpublished(ctx context.Context, path string) {
	if err := w.store.Remove(context.WithoutCancel(ctx), path); err != nil {
		w.log.Error("remove unpublished artifact", "op", "remove", "path", path, "err", err)
	}
}

// Unsettled reports whether a publication's outcome is still unknown.
func (w *Workspace) Unsettled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unknown != nil
}
