package revision

import (
	"context"
	"os"

	"github.com/amlfs/amlfs/revision/format"
)

// Placeholders is a workspace's lazy restore, as the serving side and the
// daemon drive it: files whose bytes are fetched on first use, and
// directories whose entries are made on first use.
type Placeholders struct{ w *Workspace }

// Placeholders returns the workspace's lazy restore.
func (w *Workspace) Placeholders() Placeholders { return Placeholders{w} }

// Active is a cheap check, made before every fill: false once nothing is
// left to fetch or populate.
func (p Placeholders) Active() bool { return p.w.lazyActive() }

// Pending counts the placeholders still to fetch, and their bytes.
func (p Placeholders) Pending() (files int, bytes int64) { return p.w.pending() }

// Gone counts placeholders whose bytes are gone from the store (another
// writer pruned their revision).
func (p Placeholders) Gone() int { return p.w.gone() }

// Resume takes up the placeholders a crashed daemon left in dir.
func (p Placeholders) Resume(dir string, sel format.Selection, legacy bool) (int, error) {
	return p.w.resumePending(dir, sel, legacy)
}

// Fill gives the placeholder fd refers to its bytes (FUSE: the node's
// O_PATH descriptor).
func (p Placeholders) Fill(ctx context.Context, fd int) error { return p.w.fillFd(ctx, fd) }

// FillFile gives the placeholder open as f its bytes through f itself
// (natively: a pre-content event's descriptor).
func (p Placeholders) FillFile(ctx context.Context, f *os.File) error { return p.w.fillOpen(ctx, f) }

// FillOnAccess makes the workspace's own fetches go through the mount's
// pre-content events (native serving).
func (p Placeholders) FillOnAccess() { p.w.fillOnAccess() }

// OnFilled registers fn, called with each placeholder whose bytes were
// just written, while it is open.
func (p Placeholders) OnFilled(fn func(f *os.File)) { p.w.setOnFilled(fn) }

// EnsureDir makes the entries of the directory at rel, if they are still
// to be made.
func (p Placeholders) EnsureDir(ctx context.Context, rel string) error {
	return p.w.ensureDir(ctx, rel)
}

// PopulateAll makes every directory's entries present (native serving has
// no lookup to make them on demand).
func (p Placeholders) PopulateAll(ctx context.Context) error { return p.w.populateAll(ctx) }

// Prefetch fetches every pending file in the background, with at most
// workers fetches at once.
func (p Placeholders) Prefetch(ctx context.Context, workers int) { p.w.prefetch(ctx, workers) }

// Stop ends every fetch under way: its reader gets EIO.
func (p Placeholders) Stop() { p.w.stopFetches() }

// OnMade registers fn, called with a descriptor of every placeholder made
// from now on, before it is counted made: an error from it fails the
// population. Native serving marks each for pre-content events so.
func (p Placeholders) OnMade(fn func(fd int) error) {
	p.w.lmu.Lock()
	p.w.onMade = fn
	p.w.lmu.Unlock()
}
