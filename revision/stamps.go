package revision

import (
	"path/filepath"
	"sync"
	"syscall"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

type baseFile struct {
	stamp store.Stamp
	key   string // the store key holding this file's bytes
	// prior is its stamp as a placeholder, before a fill (refresh) gave
	// it stamp: a save that listed the placeholder before the fill reuses
	// the same bytes.
	prior store.Stamp
}

// baseTree is the tree a working directory was restored from or last
// saved as.
type baseTree struct {
	dir     string
	rev     string // the revision the keys point into
	revPath string // its artifact path
	// index is an archive revision's index (its members), nil for a
	// folder's.
	index *format.ArchiveIndex
	mu    sync.Mutex
	files map[string]baseFile // GUARDED_BY(mu): by revision path
}

// earlier returns what the base holds of file p (its stamp when saved or
// restored, and its key), whatever the file is now: the bytes a save
// takes for a file whose every reading changed under it. A database
// journal (journalOf) has none: it is left out instead.
func (b *baseTree) earlier(p string) (baseFile, bool) {
	if b == nil || journalOf(p) {
		return baseFile{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	f, ok := b.files[p]
	return f, ok
}

// fromStamp gives te the size and mtime of the bytes st describes, and
// their backing inode number and ctime.
func fromStamp(te *format.TreeEntry, st store.Stamp) {
	te.Size, te.Mtime = int64(st.Size), format.Mtime(st.Mtime.Nano())
	te.Stat.Ino, te.Stat.Ctime = st.Ino, format.Mtime(st.Ctime.Nano())
}

// showStat gives te the inode number and ctime view shows for the backing
// inode ino with ctime (ns); a number past MaxShownIno is not kept.
func showStat(te *format.TreeEntry, view StatView, ino uint64, ctime int64) {
	ino, ctime = view.Saved(ino, ctime)
	te.Stat.Ino, te.Stat.Ctime = ino, format.Mtime(ctime)
	if te.Stat.Ino > format.MaxShownIno {
		te.Stat.Ino, te.Stat.Ctime = 0, 0
	}
}

// refresh updates p's stamp after its bytes were fetched in place, if p is
// still that inode, untouched until the fill (its stamp then, before, the
// one recorded): a placeholder chmod'ed before its fill holds the base's
// bytes but not its mode, and stays changed.
// A file the base listed from its revision, not made then (virtual.go:
// no stamp), is of the same bytes too.
func (b *baseTree) refresh(p string, ino uint64, before, st store.Stamp) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f, ok := b.files[p]; ok && (f.stamp.Ino == ino && f.stamp == before || f.stamp.Ino == 0) {
		f.prior, f.stamp = f.stamp, st
		b.files[p] = f
	}
}

func statStamp(path string) (store.Stamp, bool) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return store.Stamp{}, false
	}
	return stampOfStat(&st), true
}

// stampOfStat is the stamp of the file st describes.
func stampOfStat(st *syscall.Stat_t) store.Stamp {
	return store.Stamp{Ino: st.Ino, Size: uint64(st.Size), Mtime: st.Mtim, Ctime: st.Ctim}
}

// reusable returns the key of p's bytes in the base revision if the file
// at dir/p is unchanged since.
func (b *baseTree) reusable(dir, p string) (string, store.Stamp, bool) {
	cur, ok := statStamp(filepath.Join(dir, filepath.FromSlash(p)))
	if !ok {
		return "", cur, false
	}
	key, ok := b.reusableAs(dir, p, cur)
	return key, cur, ok
}

// stampOf is the stamp of a file as Snapshot listed it (its backing
// inode, size, mtime and ctime, before any view's): what statStamp gave
// at that instant, with no second lstat.
func stampOf(te format.TreeEntry) store.Stamp {
	return store.Stamp{Ino: te.Stat.Ino, Size: uint64(te.Size),
		Mtime: syscall.NsecToTimespec(int64(te.Mtime)), Ctime: syscall.NsecToTimespec(int64(te.Stat.Ctime))}
}

// reusableAs returns the key of p's bytes in the base revision if cur,
// the stamp of the file at dir/p, is the one the base recorded.
func (b *baseTree) reusableAs(dir, p string, cur store.Stamp) (string, bool) {
	if b == nil || b.dir != dir {
		return "", false
	}
	b.mu.Lock()
	f, ok := b.files[p]
	b.mu.Unlock()
	if !ok || f.stamp != cur && (f.prior.Ino == 0 || f.prior != cur) {
		return "", false
	}
	return f.key, true
}

// writers adds the files open for writing now (Options.Writers) to set,
// which it returns.
func (w *Workspace) writers(set map[uint64]bool) map[uint64]bool {
	if w.opts.Writers == nil {
		return set
	}
	now := w.opts.Writers()
	if set == nil {
		return now
	}
	for ino := range now {
		set[ino] = true
	}
	return set
}

// distrusted is the stamp of the file ino that a writer held open as a
// save read it: no file has it (no size is that large), so the next save
// reads the file again.
func distrusted(ino uint64) store.Stamp { return store.Stamp{Ino: ino, Size: ^uint64(0)} }

// distrust makes the files with the inode numbers in inos count as
// changed at the next save, whatever their stamps say then. A number
// stands for the file a writer holds open, here or a file that took its
// number since: the one wrongly taken is only read again.
func (b *baseTree) distrust(inos map[uint64]bool) {
	if len(inos) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for p, f := range b.files {
		if inos[f.stamp.Ino] {
			f.stamp, f.prior = distrusted(f.stamp.Ino), store.Stamp{}
			b.files[p] = f
		}
	}
}

// Tracks reports whether the tree last restored or saved has a file with
// one of the inode numbers inos (Options.Writers' files open for writing
// now, which may be anywhere on the disk): such a file may have changed
// with no change of its stamp, and the tree counts as changed.
func (w *Workspace) Tracks(inos map[uint64]bool) bool {
	b := w.baseTree()
	if b == nil || len(inos) == 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range b.files {
		if inos[f.stamp.Ino] {
			return true
		}
	}
	return false
}

// recordTree stamps every file of entries under dir, keyed into revision
// e: a folder, or an archive whose index is x.
func recordTree(dir string, e format.Entry, entries []format.TreeEntry, x *format.ArchiveIndex) *baseTree {
	b := &baseTree{dir: dir, rev: e.ID, revPath: e.Path, index: x, files: make(map[string]baseFile, len(entries))}
	keys := fileKeys(e.Path, x)
	for _, e := range entries {
		if e.Type != format.TypeFile {
			continue
		}
		if st, ok := statStamp(filepath.Join(dir, filepath.FromSlash(e.Path))); ok {
			key, _ := keys(e.Path)
			b.files[e.Path] = baseFile{stamp: st, key: key}
		}
	}
	return b
}

// fileKeys gives the key of each file's bytes in the revision at revPath:
// a folder's object, or with x an archive's member (memberKey).
// The second result is the file's entry in x (-1 for a folder).
func fileKeys(revPath string, x *format.ArchiveIndex) func(p string) (string, int) {
	if x == nil {
		return func(p string) (string, int) { return revPath + "files/" + p, -1 }
	}
	at := make(map[string]int, len(x.Entries))
	for i := range x.Entries {
		at[x.Entries[i].Path] = i
	}
	return func(p string) (string, int) {
		i, ok := at[p]
		if !ok {
			return memberKey(revPath, format.ArchiveEntry{}), -1
		}
		return memberKey(revPath, x.Entries[i]), i
	}
}

// add records a file made after the base was taken (a lazily populated
// placeholder), if the base is still revision rev's tree.
func (b *baseTree) add(p string, f baseFile, revPath string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.revPath == revPath {
		b.files[p] = f
	}
}

// restamp records the stamp a placeholder at p has after its marker was
// rewritten for key (repoint), if the base still records it at key with
// the same inode, size and mtime.
func (b *baseTree) restamp(p string, stp store.Stamp, key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f, ok := b.files[p]
	if ok && f.key == key && f.stamp.Ino == stp.Ino && f.stamp.Size == stp.Size && f.stamp.Mtime == stp.Mtime {
		f.stamp = stp
		b.files[p] = f
	}
}

// fillLog records, while a save runs, the stamp of each placeholder just
// filled, by inode. The save's snapshot may have listed a placeholder
// before it was filled: the base it records would keep the placeholder's
// stamp, and the next save take the filled file for changed and upload
// it again. A placeholder holds its revision's bytes until it is filled
// (nothing writes one before), so a stamp of the new base for the same
// inode, size and mtime, from no later than the fill, is of the same
// bytes as the filled file: it becomes the fill's stamp. A change after
// the fill changes that stamp, so the next save sees it.
// A file the new base listed from its revision, not made then (no
// stamp), and made and filled since at its path, is of the same bytes too.
type fillLog map[uint64]filled

// filled is a placeholder's fill: where it was made, and its stamp after.
type filled struct {
	path  string
	after store.Stamp
}

// startFills starts the log of a save.
func (w *Workspace) startFills() {
	w.lmu.Lock()
	w.fills = fillLog{}
	w.lmu.Unlock()
}

// noteFill records that the placeholder p (inode ino) was filled and now
// has the stamp after: in the base, and in the log if a save runs. Under
// lmu, so that a fill is either in the log or in the base a save sets.
func (w *Workspace) noteFill(p string, ino uint64, before, after store.Stamp) {
	w.lmu.Lock()
	b := w.base
	if w.fills != nil {
		w.fills[ino] = filled{p, after}
	}
	w.lmu.Unlock()
	if b != nil {
		b.refresh(p, ino, before, after)
	}
}

// setBaseAfterFills makes b the base, with the fills logged since
// startFills applied, and stops the log.
func (w *Workspace) setBaseAfterFills(b *baseTree) {
	w.lmu.Lock()
	fills := w.fills
	w.fills = nil
	w.base = b
	w.lmu.Unlock()
	if len(fills) == 0 || b == nil {
		return
	}
	at := make(map[string]store.Stamp, len(fills))
	for _, fl := range fills {
		at[fl.path] = fl.after
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for p, f := range b.files {
		if f.stamp.Ino == 0 {
			if after, ok := at[p]; ok {
				f.stamp = after
				b.files[p] = f
			}
			continue
		}
		fl, ok := fills[f.stamp.Ino]
		if ok && f.stamp.Size == fl.after.Size && f.stamp.Mtime == fl.after.Mtime && !timeAfter(f.stamp.Ctime, fl.after.Ctime) {
			f.stamp = fl.after
			b.files[p] = f
		}
	}
}

// timeAfter reports whether a is later than b.
func timeAfter(a, b syscall.Timespec) bool { return a.Nano() > b.Nano() }

// stopFills stops the log (a save that published no base).
func (w *Workspace) stopFills() {
	w.lmu.Lock()
	w.fills = nil
	w.lmu.Unlock()
}
