package revision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

// maxRuns bounds the runs of reused members a composed archive is made
// of: past it the archive is written whole again, so that no save needs
// more parts than a multipart upload allows, nor reads many short runs
// to fill parts up.
const maxRuns = 1000

// errFragmented says a composition would take more than maxRuns runs.
var errFragmented = errors.New("the archive is too fragmented to compose")

// archiveJob is one archive save's input.
type archiveJob struct {
	dir     string
	entries []format.TreeEntry // the snapshot
	src     *Workspace         // whose tree it is (placeholders, view)
	fork    *format.ForkOrigin
	// plan, if not nil, is what to reuse from the base archive.
	plan *archivePlan
	// base is the tree the base revision holds (nil for none): the
	// bytes of a file that changed during every reading come from it.
	base *baseTree
	prog *progress // counts the files as they go into the archive
	// staged, if not nil, holds the copies of the files to read, taken
	// while the writers were held.
	staged *staging
}

// archivePlan is what a save reuses of its base archive.
type archivePlan struct {
	key  string                 // the base archive, as w's store names it
	kept map[string]store.Stamp // unchanged files of the base, by path
	// runs are the runs of members whose files are all kept, to copy;
	// rewrite the members with kept files beside changed ones, with only
	// the kept entries, to write again from their bytes in the store.
	runs    []format.Member
	rewrite []format.Member
	reused  int64 // the bytes runs copy
}

// archiveOut is what an archive save wrote.
type archiveOut struct {
	index    *format.ArchiveIndex
	entries  []format.TreeEntry     // as saved
	stamps   map[string]store.Stamp // of every file saved, by path
	uploaded int                    // files written from the tree
	upBytes  int64
	reused   int // files kept from the base (copied or rewritten)
	// earlier and leftOut: files that changed during every reading,
	// written with the base's bytes, or left out (SaveResult).
	earlier, leftOut []string
}

// planArchive finds what of base, the archive at key, the snapshot
// entries of dir can reuse: nil when nothing.
// A file in virtual is not made yet: it is the base's, unchanged.
func planArchive(base *baseTree, key, dir string, entries []format.TreeEntry, virtual map[string]bool) (*archivePlan, error) {
	if base == nil || base.index == nil || base.dir != dir {
		return nil, nil
	}
	p := &archivePlan{key: key, kept: make(map[string]store.Stamp, len(entries))}
	inBase := make(map[string]int, len(base.index.Entries))
	for i := range base.index.Entries {
		inBase[base.index.Entries[i].Path] = i
	}
	for _, te := range entries {
		if te.Type != format.TypeFile {
			continue
		}
		i, ok := inBase[te.Path]
		if !ok || base.index.Entries[i].Type != format.TypeFile || base.index.Entries[i].Size != te.Size {
			continue
		}
		if virtual[te.Path] {
			p.kept[te.Path] = store.Stamp{} // no file, so no stamp
			continue
		}
		// The stamp Snapshot listed (entries are as it gave them).
		stp := stampOf(te)
		if _, ok := base.reusableAs(dir, te.Path, stp); ok {
			p.kept[te.Path] = stp
		}
	}
	for _, m := range base.index.Members() {
		all := true
		var kept []format.ArchiveEntry
		for _, e := range m.Entries {
			if _, ok := p.kept[e.Path]; ok && e.Type == format.TypeFile {
				kept = append(kept, e)
			} else {
				all = false
			}
		}
		switch {
		case all:
			if n := len(p.runs); n > 0 && p.runs[n-1].Off+p.runs[n-1].Len == m.Off {
				r := &p.runs[n-1]
				r.Len += m.Len
				if end := m.At + len(m.Entries); r.At+len(r.Entries) == m.At {
					// Next in the index too: the run is a longer slice
					// of it, not a copy.
					r.Entries = base.index.Entries[r.At:end:end]
				} else {
					r.Entries = append(r.Entries, m.Entries...)
				}
			} else {
				p.runs = append(p.runs, m)
			}
			p.reused += m.Len
		case len(kept) > 0:
			m.Entries = kept
			p.rewrite = append(p.rewrite, m)
		}
	}
	if len(p.runs) > maxRuns {
		return nil, fmt.Errorf("%w: %d runs of unchanged members", errFragmented, len(p.runs))
	}
	if len(p.kept) == 0 {
		return nil, nil
	}
	return p, nil
}

// writeArchive writes the archive of job to aw: the plan's runs, copied;
// the kept files of the members it rewrites, from the store; every other
// file from the tree, as it was at one instant (store.ReadStable), the
// lazily restored ones fetched first; then the directories and the
// symlinks (in the index only: AML's reader refuses them).
func (w *Workspace) writeArchive(ctx context.Context, aw *format.ComposeWriter, job archiveJob) (archiveOut, error) {
	out := archiveOut{stamps: make(map[string]store.Stamp, len(job.entries))}
	plan := job.plan
	if plan == nil {
		plan = &archivePlan{}
	}
	// A kept file's stat data is what the tree shows now (through the
	// view): the same as saved through FUSE, the disk's own natively.
	// A file not made yet (virtual.go) shows what it was saved with.
	// It returns the entry to write, and the kept stamp.
	shown := func(e format.ArchiveEntry) (format.ArchiveEntry, store.Stamp) {
		stp := plan.kept[e.Path]
		if stp.Ino != 0 {
			showStat(&e.TreeEntry, job.src.view, stp.Ino, stp.Ctime.Nano())
		}
		return e, stp
	}
	for _, r := range plan.runs {
		es := make([]format.ArchiveEntry, len(r.Entries))
		for i, e := range r.Entries {
			var stp store.Stamp
			es[i], stp = shown(e)
			out.stamps[e.Path] = stp
		}
		if err := aw.Reuse(plan.key, r.Off, r.Len, es); err != nil {
			return out, err
		}
		for _, e := range r.Entries {
			out.reused++
			job.prog.bytes.Add(e.Size)
			job.prog.fileDone()
		}
	}
	for _, m := range plan.rewrite {
		rc, _, err := w.store.ReadRange(ctx, plan.key, m.Off, m.Len)
		if err != nil {
			return out, err
		}
		err = format.MemberEntries(rc, m.Entries, func(e format.ArchiveEntry, r io.Reader) error {
			e, stp := shown(e)
			out.stamps[e.Path] = stp
			out.reused++
			job.prog.bytes.Add(e.Size)
			job.prog.fileDone()
			return aw.File(e.TreeEntry, r)
		})
		rc.Close()
		if err != nil {
			return out, err
		}
	}
	t, err := openTree(job.dir)
	if err != nil {
		return out, err
	}
	defer t.Close()
	var sp spool
	defer sp.close()
	for _, te := range job.entries {
		if te.Type != format.TypeFile {
			continue
		}
		if _, ok := plan.kept[te.Path]; ok {
			continue
		}
		if err := ctx.Err(); err != nil {
			return out, err
		}
		f, stp, gone, done, err := readStaged(ctx, job, t, &sp, te.Path)
		if err == nil && !gone {
			err = writeRead(aw, job, te, f, stp)
			done()
			if err != nil {
				return out, err
			}
			out.stamps[te.Path] = stp
			out.uploaded++
			out.upBytes += int64(stp.Size)
			job.prog.bytes.Add(int64(stp.Size))
			job.prog.fileDone()
			continue
		}
		done()
		if errors.Is(err, store.ErrUnsettled) {
			had, err := w.writeEarlier(ctx, aw, job, te)
			if err != nil {
				return out, err
			}
			if had {
				out.earlier = append(out.earlier, te.Path)
				out.reused++
			} else {
				out.leftOut = append(out.leftOut, te.Path)
			}
			continue
		}
		if err != nil {
			return out, err
		}
		// Gone: removed or replaced since the snapshot.
	}
	for _, te := range job.entries {
		var err error
		switch te.Type {
		case format.TypeDir:
			err = aw.Dir(te)
		case format.TypeSymlink:
			err = aw.Symlink(te)
		}
		if err != nil {
			return out, err
		}
	}
	aw.SetFork(job.fork)
	if _, out.index, err = aw.Close(); err != nil {
		return out, err
	}
	out.entries = out.index.Tree()
	return out, nil
}

// writeRead writes te into the archive with the bytes f holds, which
// stp describes.
func writeRead(aw *format.ComposeWriter, job archiveJob, te format.TreeEntry, f *os.File, stp store.Stamp) error {
	fromStamp(&te, stp)
	showStat(&te, job.src.view, stp.Ino, stp.Ctime.Nano())
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return aw.File(te, f)
}

// readStaged opens the bytes of the file rel to write into the archive,
// and returns their stamp: its copy, if the hold staged it, else read
// from the tree at one instant into sp (a placeholder fetched first).
// A staged copy is closed by done; the spool is the caller's.
func readStaged(ctx context.Context, job archiveJob, t *tree, sp *spool, rel string) (f *os.File, stp store.Stamp, gone bool, done func(), err error) {
	done = func() {}
	f, stp, ok, err := job.staged.open(rel)
	if ok || err != nil {
		if f != nil {
			done = func() { f.Close() }
		}
		return f, stp, false, done, err
	}
	if job.staged.isGone(rel) {
		return nil, stp, true, done, nil
	}
	if err := job.src.ensure(ctx, rel); err != nil {
		return nil, stp, false, done, err
	}
	f, gone, err = sp.read(t, rel)
	return f, sp.st, gone, done, err
}

// writeEarlier writes te, whose working-tree file changed during every
// reading, with its bytes of the base revision: the file as it was at an
// earlier instant, never torn. Its stamp is not recorded, so the next save
// reads it again. It reports false, having written nothing, when the base
// has no such file (or its bytes are gone).
func (w *Workspace) writeEarlier(ctx context.Context, aw *format.ComposeWriter, job archiveJob, te format.TreeEntry) (bool, error) {
	bf, ok := job.base.earlier(te.Path)
	if !ok {
		return false, nil
	}
	rc, err := job.src.openFileBytes(ctx, bf.key)
	if errors.Is(err, store.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	defer rc.Close()
	fromStamp(&te, bf.stamp)
	showStat(&te, job.src.view, bf.stamp.Ino, bf.stamp.Ctime.Nano())
	return true, aw.File(te, rc)
}

// uploadArchive writes an archive revision: composed from its base
// archive when there is one (a fork's source's, for a fork), else whole.
// A composition whose base is gone (another writer pruned it), or that
// would need too many parts, is written whole instead.
func (w *Workspace) uploadArchive(ctx context.Context, dir string, entry format.Entry, entries []format.TreeEntry, virtual map[string]bool, prog *progress, src *Workspace, staged *staging) (uploadStats, error) {
	base, baseKey := w.reusableBase(src)
	var key string
	if base != nil {
		key = baseKey(base.revPath)
	}
	plan, err := planArchive(base, key, dir, entries, virtual)
	if err != nil {
		w.log.Info("writing the archive whole", "op", "save", "reason", err)
	}
	job := archiveJob{dir: dir, entries: entries, src: src, fork: w.Fork(), plan: plan, base: base, prog: prog, staged: staged}
	if plan != nil {
		out, err := w.stageArchive(ctx, entry, job, prog)
		if err == nil || !errors.Is(err, store.ErrNotExist) && !errors.Is(err, store.ErrTooManyParts) {
			return archiveStats(entry, out, src.isPending), err
		}
		w.log.Warn("the base archive could not be composed from; writing the archive whole", "op", "save", "err", err)
		job.plan = nil
	}
	job.prog.reset()
	out, err := w.stageArchive(ctx, entry, job, prog)
	return archiveStats(entry, out, src.isPending), err
}

// stageArchive stages and commits the archive of job: composed (with a
// plan), or streamed whole.
func (w *Workspace) stageArchive(ctx context.Context, entry format.Entry, job archiveJob, prog *progress) (out archiveOut, err error) {
	st, err := w.store.Stage(ctx, entry.Path)
	if err != nil {
		return out, err
	}
	defer func() {
		if err != nil {
			st.Abort(context.WithoutCancel(ctx))
		}
	}()
	if job.plan != nil {
		pw, err := newPieceWriter()
		if err != nil {
			return out, err
		}
		defer pw.Close()
		aw, err := format.NewComposeWriter(pw, w.opts.Limits)
		if err != nil {
			return out, err
		}
		if out, err = w.writeArchive(ctx, aw, job); err != nil {
			return out, err
		}
		if err := st.Compose(ctx, pw.pieces); err != nil {
			return out, err
		}
		return out, st.Commit(ctx)
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		aw, err := format.NewComposeWriter(pw, w.opts.Limits)
		if err == nil {
			out, err = w.writeArchive(ctx, aw, job)
		}
		pw.CloseWithError(err)
		done <- err
	}()
	err = st.Put(ctx, "", pr, -1)
	pr.CloseWithError(err) // unblock the writer if Put stopped early
	if werr := <-done; err == nil {
		err = werr
	}
	if err != nil {
		return out, err
	}
	return out, st.Commit(ctx)
}

// archiveStats is an archive save's uploadStats: the files' keys are
// their members in the new archive, where the placeholders of kept files
// are repointed.
func archiveStats(entry format.Entry, out archiveOut, pending func(ino uint64) bool) uploadStats {
	up := uploadStats{entries: out.entries, uploaded: out.uploaded, uploadedBytes: out.upBytes, reused: out.reused, index: out.index,
		earlier: out.earlier, leftOut: out.leftOut}
	if out.index == nil {
		return up
	}
	up.stamps = make(map[string]baseFile, len(out.stamps))
	for i := range out.index.Entries {
		e := &out.index.Entries[i]
		if e.Type != format.TypeFile {
			continue
		}
		stp, ok := out.stamps[e.Path]
		if !ok {
			continue
		}
		key := memberKey(entry.Path, *e)
		up.stamps[e.Path] = baseFile{stamp: stp, key: key}
		if stp.Ino == 0 || !pending(stp.Ino) {
			continue // only placeholders not fetched yet are repointed
		}
		if up.moves == nil {
			up.moves = map[uint64]repointTo{}
		}
		up.moves[stp.Ino] = repointTo{path: e.Path, key: key, idx: i}
	}
	return up
}
