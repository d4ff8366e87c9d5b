package revision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"golang.org/x/sync/errgroup"
)

func (w *Workspace) openArtifact(ctx context.Context, key string) (io.ReadCloser, error) {
	r, err := w.store.Open(ctx, key)
	if errors.Is(err, store.ErrNotExist) {
		return nil, amlerr.New(amlerr.InvalidStore, key, "the index refers to it, but it is missing from %s", w.store)
	}
	return r, err
}

func (w *Workspace) manifest(ctx context.Context, e format.Entry) (*format.Manifest, error) {
	key := e.Path + "manifest.json"
	r, err := w.openArtifact(ctx, key)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	max := w.opts.Limits.ManifestBytes()
	data, err := store.ReadAllLimited(r, int64(max), key)
	if err != nil {
		if errors.Is(err, store.ErrTooLarge) {
			return nil, amlerr.New(amlerr.LimitExceeded, key, "the manifest is over %d bytes, the bound under --max-entries %d: the revision was saved with a raised limit; mount with the same --max-entries (the bound grows in proportion above %d entries)", max, w.opts.Limits.OrDefault().Entries, format.DefaultLimits.Entries)
		}
		return nil, amlerr.Wrap(amlerr.InvalidStore, key, err)
	}
	return format.ParseManifest(key, data, w.opts.Limits)
}

// Restore materializes revision rev ("current" or an id) into dir, which
// must not exist yet. On failure dir is left absent.
func (w *Workspace) Restore(ctx context.Context, rev, dir string, sel format.Selection) (format.Entry, error) {
	e, err := w.Resolve(rev)
	if err != nil {
		return format.Entry{}, err
	}
	return w.restore(ctx, e, dir, sel)
}

// restore materializes revision e, whose path may be a foreign key (a
// fork's source), at dir.
func (w *Workspace) restore(ctx context.Context, e format.Entry, dir string, sel format.Selection) (format.Entry, error) {
	tmp := dir + ".restoring"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return format.Entry{}, err
	}
	// An archive amlfs wrote has an index: its files are reachable one by
	// one, so it restores lazily as a folder does.
	var x *format.ArchiveIndex
	if e.Format == format.FormatArchive {
		var err error
		if x, err = w.archiveIndex(ctx, e.Path); err != nil {
			os.RemoveAll(tmp)
			return format.Entry{}, fmt.Errorf("restore revision %s: %w", e.ID, err)
		}
	}
	var lazy *lazyState
	if w.opts.LazyRestore && (e.Format == format.FormatFolder || x != nil) {
		lazy = newLazy(dir)
		lazy.dirs = newDirSet(sel)
	}
	restored, err := w.restoreInto(ctx, e, x, tmp, sel, lazy)
	if err != nil {
		os.RemoveAll(tmp)
		return format.Entry{}, fmt.Errorf("restore revision %s: %w", e.ID, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return format.Entry{}, err
	}
	if e.Format == format.FormatFolder || x != nil {
		stamped := restored
		if lazy != nil {
			stamped = nil // no file is made yet: fillDir notes each as it makes it
		}
		w.setBase(recordTree(dir, e, stamped, x))
		// A lazy restore's placeholders are noted as they are made.
		recordView(w.view, dir, restored, lazy == nil)
	}
	w.lmu.Lock()
	w.lazy = lazy
	w.restored = nil
	if _, disk := w.view.(diskView); disk && (e.Format == format.FormatFolder || x != nil) {
		// The disk's own stat data show: git's indexes are refreshed
		// from these (RefreshGitIndexes).
		w.restored = restored
	}
	w.lmu.Unlock()
	return e, nil
}

// restoreInto materializes e into dir and returns the entries it restored.
// With lazy set, files become placeholders (see lazy.go). x is an
// archive's index, if it has one.
func (w *Workspace) restoreInto(ctx context.Context, e format.Entry, x *format.ArchiveIndex, dir string, sel format.Selection, lazy *lazyState) ([]format.TreeEntry, error) {
	var entries []format.TreeEntry
	switch {
	case e.Format == format.FormatArchive && x == nil:
		w.view.Reset(nil) // an archive without an index keeps no stat data
		// Validate the whole archive before extracting anything.
		if _, err := w.treeOf(ctx, e); err != nil {
			return nil, err
		}
		r, err := w.openArtifact(ctx, e.Path)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return readArchive(r, dir, e.Path, w.opts.Limits, sel.Takes)
	case x != nil:
		entries = sel.Filter(x.Tree())
	default:
		m, err := w.manifest(ctx, e)
		if err != nil {
			return nil, err
		}
		entries = sel.Filter(m.Tree())
	}
	w.view.Reset(entries)
	var nfiles, nbytes int64
	for _, te := range entries {
		if te.Type == format.TypeFile {
			nfiles++
			nbytes += te.Size
		}
	}
	prog := startProgress(w.opts.Progress, "restore", nfiles, nbytes)
	defer prog.finish()
	mat := materializer{root: dir}
	// Directories first, parents before children; then the files, several
	// at once.
	for _, te := range entries {
		if te.Type == format.TypeDir {
			if err := mat.add(te, nil); err != nil {
				return nil, err
			}
		}
	}
	// Symlinks, never followed, cost nothing to make: made at once, even
	// in a lazy restore. No entry lies beneath one (ValidateEntries).
	for _, te := range entries {
		if te.Type == format.TypeSymlink {
			if err := mat.add(te, nil); err != nil {
				return nil, err
			}
		}
	}
	if lazy != nil {
		// Files are made on first use of their directory (lazydir.go).
		prog.files.Add(nfiles)
		if err := lazy.dirs.deferFiles(dir, e.Path, entries, x); err != nil {
			return nil, err
		}
		return entries, mat.finish()
	}
	if x != nil {
		if err := w.extractIndexed(ctx, e, x, &mat, entries, prog); err != nil {
			return nil, err
		}
		return entries, mat.finish()
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(restoreParallel)
	for _, te := range entries {
		if te.Type != format.TypeFile {
			continue
		}
		if gctx.Err() != nil {
			break
		}
		key := e.Path + "files/" + te.Path
		g.Go(func() error {
			if err := w.restoreFile(gctx, &mat, key, te, prog); err != nil {
				return err
			}
			prog.fileDone()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return entries, mat.finish()
}

// extractIndexed extracts the selected files of an indexed archive with
// one read of it, each checked against the index, which gives their
// metadata (nanosecond mtimes, owners).
func (w *Workspace) extractIndexed(ctx context.Context, e format.Entry, x *format.ArchiveIndex, mat *materializer, entries []format.TreeEntry, prog *progress) error {
	want := map[string]format.TreeEntry{}
	for _, te := range entries {
		if te.Type == format.TypeFile {
			want[te.Path] = te
		}
	}
	r, err := w.openArtifact(ctx, e.Path)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = format.ReadArchive(r, e.Path, w.opts.Limits, func(h format.TreeEntry, content io.Reader) error {
		te, ok := want[h.Path]
		if !ok || h.Type != format.TypeFile {
			return nil
		}
		if h.Size != te.Size {
			return amlerr.New(amlerr.InvalidStore, e.Path, "%s: the index says %d bytes, the archive holds %d", h.Path, te.Size, h.Size)
		}
		delete(want, h.Path)
		if err := mat.add(te, prog.reader(content)); err != nil {
			return err
		}
		prog.fileDone()
		return ctx.Err()
	})
	if err != nil {
		return err
	}
	for p := range want {
		return amlerr.New(amlerr.InvalidStore, e.Path, "%s is in its index, not in the archive", p)
	}
	return nil
}

func (w *Workspace) restoreFile(ctx context.Context, mat *materializer, key string, te format.TreeEntry, prog *progress) error {
	r, err := w.openArtifact(ctx, key)
	if err != nil {
		return err
	}
	defer r.Close()
	// The object must hold exactly the manifest's size.
	if err := mat.add(te, prog.reader(r)); err != nil {
		return amlerr.Wrap(amlerr.InvalidStore, key, err)
	}
	var one [1]byte
	if n, _ := r.Read(one[:]); n > 0 {
		return amlerr.New(amlerr.InvalidStore, key, "object is larger than the manifest's size %d", te.Size)
	}
	return nil
}
