package revision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/amlfs/amlfs/atomicfile"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

// Kept trees. A working tree that is a revision exactly when its daemon
// stops (saved, or restored and unchanged since) may be kept where it is,
// with the stamps of its files (WriteKept), instead of being removed. The
// next mount of that revision in the same place adopts it (Adopt) after
// one walk proves that it is still the revision's tree: every file with
// the stamp it had when saved (inode, size, mtime and ctime: no write,
// chmod, rename or xattr since leaves a ctime as it was), every directory
// and symlink as the revision has it, every placeholder's marker naming
// bytes the index still keeps. The files fetched before stay fetched, and
// no placeholder is made again. Anything that does not prove out makes
// Adopt refuse, and the caller restores the revision afresh.

// keptVersion is the kept file's format.
const keptVersion = 1

// maxKeptBytes bounds a kept file read back (it is the daemon's own, in
// its cache dir; the bound only keeps a damaged one from costing memory):
// about 100 bytes a file at the default entry limit.
const maxKeptBytes = 256 << 20

type keptTree struct {
	Version int         `json:"version"`
	Rev     string      `json:"revision"`
	RevPath string      `json:"path"`
	Dir     string      `json:"dir"`
	Files   []keptStamp `json:"files"`
}

type keptStamp struct {
	Path  string `json:"p"`
	Ino   uint64 `json:"i"`
	Size  uint64 `json:"s"`
	Mtime int64  `json:"m"`
	Ctime int64  `json:"c"`
}

// ErrNotKept says why a kept tree cannot be adopted: it is to be removed
// and the revision restored afresh.
var ErrNotKept = errors.New("the kept tree is not the revision's")

func notKept(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotKept, fmt.Sprintf(format, args...))
}

// WriteKept records in file that the tree at dir is revision rev, with
// its files' stamps, for a later Adopt. It refuses unless the tree's base
// (what it was restored from or last saved as) is rev, at dir. It waits
// first for the last save's repointing, which changes placeholders'
// stamps (as Close does).
func (w *Workspace) WriteKept(file, dir, rev string) error {
	w.prunes.Wait()
	b := w.baseTree()
	if b == nil || b.dir != dir || b.rev != rev {
		return fmt.Errorf("the tree's base is not revision %s", rev)
	}
	k := keptTree{Version: keptVersion, Rev: b.rev, RevPath: b.revPath, Dir: dir}
	b.mu.Lock()
	k.Files = make([]keptStamp, 0, len(b.files))
	for p, f := range b.files {
		if f.stamp.Ino == 0 {
			continue // listed from its revision, never made: not in the tree
		}
		k.Files = append(k.Files, keptStamp{Path: p, Ino: f.stamp.Ino, Size: f.stamp.Size, Mtime: f.stamp.Mtime.Nano(), Ctime: f.stamp.Ctime.Nano()})
	}
	b.mu.Unlock()
	data, err := json.Marshal(k)
	if err != nil {
		return err
	}
	return atomicfile.Write(file, "", data, 0o600)
}

// Adopted is what Adopt found.
type Adopted struct {
	Entry format.Entry
	// Pending counts the placeholders still to be fetched; Aside, the
	// entries the revision does not have (left by a save that did not
	// take them: ignored, or special files), given to aside.
	Pending, Aside int
}

// Adopt takes the tree at dir, kept by WriteKept in file, as revision rev
// ("current" or an id) restored with sel, if it is that revision's tree
// still. Every entry the revision does not have is handed to aside (by
// path relative to dir), which must take it out of the tree. An error
// wrapping ErrNotKept says the tree is not the revision's; the tree is
// then as it was, but for what aside took out.
func (w *Workspace) Adopt(ctx context.Context, file, rev, dir string, sel format.Selection, aside func(rel string) error) (Adopted, error) {
	var a Adopted
	if !w.opts.LazyRestore {
		return a, notKept("the mount restores whole (--restore full)")
	}
	if _, disk := w.view.(diskView); !disk {
		// Through FUSE, restored files show the stat data they were
		// saved with, which only a restore tells the view.
		return a, notKept("the tree is not served natively")
	}
	data, err := readKept(file)
	if err != nil {
		return a, err
	}
	var k keptTree
	if err := json.Unmarshal(data, &k); err != nil || k.Version != keptVersion {
		return a, notKept("%s is not a kept tree's record", file)
	}
	e, err := w.Resolve(rev)
	if err != nil {
		return a, err
	}
	if e.ID != k.Rev || e.Path != k.RevPath || k.Dir != dir {
		return a, notKept("the tree is revision %s, not %s", k.Rev, e.ID)
	}
	var x *format.ArchiveIndex
	var entries []format.TreeEntry
	switch {
	case e.Format == format.FormatArchive:
		if x, err = w.archiveIndex(ctx, e.Path); err != nil {
			return a, err
		}
		if x == nil {
			return a, notKept("revision %s is an archive without amlfs's index", e.ID)
		}
		entries = x.Tree()
	default:
		m, err := w.manifest(ctx, e)
		if err != nil {
			return a, err
		}
		entries = m.Tree()
	}
	entries = sel.Filter(entries)
	want := make(map[string]format.TreeEntry, len(entries))
	for _, te := range entries {
		want[te.Path] = te
	}
	stamps := make(map[string]store.Stamp, len(k.Files))
	for _, f := range k.Files {
		stamps[f.Path] = store.Stamp{Ino: f.Ino, Size: f.Size, Mtime: syscall.NsecToTimespec(f.Mtime), Ctime: syscall.NsecToTimespec(f.Ctime)}
	}
	kept := w.keptArtifacts()

	l := newLazy(dir)
	l.dirs = newDirSet(sel)
	if err := l.revs.load(); err != nil {
		return a, notKept("%v", err)
	}
	keys := fileKeys(e.Path, x)
	base := &baseTree{dir: dir, rev: e.ID, revPath: e.Path, index: x, files: make(map[string]baseFile, len(stamps))}
	kw := &keptWalk{ctx: ctx, want: want, stamps: stamps, keys: keys, kept: kept, l: l, base: base}
	kw.g.SetLimit(keptWorkers)
	kw.g.Go(func() error { return kw.dir(dir, "") })
	if err := kw.g.Wait(); err != nil {
		return a, err
	}
	found, extra := kw.found, kw.extra
	if found != len(want) {
		return a, notKept("%d of the revision's %d entries are missing", len(want)-found, len(want))
	}
	for _, rel := range extra {
		if err := aside(rel); err != nil {
			return a, err
		}
	}
	w.setBase(base)
	w.view.Reset(entries)
	w.lmu.Lock()
	w.lazy = l
	w.restored = nil // the inodes git's indexes name are the tree's own
	w.lmu.Unlock()
	return Adopted{Entry: e, Pending: len(l.pending), Aside: len(extra)}, nil
}

// keptWorkers is how many directories Adopt reads at once: on a tree the
// kernel no longer caches, each stat may wait for the disk.
const keptWorkers = 4

// keptWalk is one Adopt's walk of the tree, a directory per worker.
type keptWalk struct {
	ctx    context.Context
	want   map[string]format.TreeEntry
	stamps map[string]store.Stamp
	keys   func(string) (string, int)
	kept   func(string) bool
	g      errgroup.Group
	mu     sync.Mutex
	l      *lazyState // its pending files, GUARDED_BY(mu)
	base   *baseTree  // its files, GUARDED_BY(mu)
	found  int        // GUARDED_BY(mu)
	extra  []string   // GUARDED_BY(mu)
}

// dir checks the entries of the directory at p (rel in the tree), and
// those below it: its subdirectories on another worker when one is free.
func (k *keptWalk) dir(p, rel string) error {
	if err := k.ctx.Err(); err != nil {
		return err
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for _, d := range ents {
		r := d.Name()
		if rel != "" {
			r = rel + "/" + r
		}
		cp := filepath.Join(p, d.Name())
		te, ok := k.want[r]
		if !ok {
			k.mu.Lock()
			k.extra = append(k.extra, r)
			k.mu.Unlock()
			continue
		}
		if err := k.entry(cp, r, te, buf); err != nil {
			return err
		}
		if te.Type == format.TypeDir {
			if !k.g.TryGo(func() error { return k.dir(cp, r) }) {
				if err := k.dir(cp, r); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// entry checks the entry at p, the revision's te.
func (k *keptWalk) entry(p, rel string, te format.TreeEntry, buf []byte) error {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return err
	}
	if got := typeOf(st.Mode); got != te.Type {
		return notKept("%s is a %s, the revision's a %s", rel, got, te.Type)
	}
	switch te.Type {
	case format.TypeDir:
		if _, err := getMarker(p, PendingDirXattr(), PendingDirUserXattr, false, buf); err == nil {
			return notKept("directory %s is still to be populated", rel)
		}
		// A revision keeps a directory's permission bits only.
		if st.Mode&0o7777 != te.Mode&0o777 {
			return notKept("directory %s has mode %o, the revision %o", rel, st.Mode&0o7777, te.Mode&0o777)
		}
	case format.TypeSymlink:
		if t, err := os.Readlink(p); err != nil || t != te.Target {
			return notKept("symlink %s changed", rel)
		}
	case format.TypeFile:
		if st.Nlink != 1 {
			// A revision has one file per name: a restore would make
			// each its own copy, where this tree shares their bytes.
			return notKept("file %s has %d links", rel, st.Nlink)
		}
		cur := stampOfStat(&st)
		if s, ok := k.stamps[rel]; !ok || s != cur || int64(cur.Size) != te.Size {
			return notKept("file %s changed since it was saved", rel)
		}
		key, _ := k.keys(rel)
		var pf *pendingFile
		if n, err := getMarker(p, PendingXattr(), PendingUserXattr, false, buf); err == nil {
			mk, ok := k.l.revs.key(string(buf[:n]))
			if !ok || !k.kept(mk) {
				return notKept("placeholder %s names bytes the index no longer keeps", rel)
			}
			id, err := idOfPath(p)
			if err != nil || id.ino != st.Ino {
				return notKept("placeholder %s changed while it was read", rel)
			}
			pf = &pendingFile{key: mk, size: st.Size, origPath: rel, handle: id.handle}
		} // else fetched (ENODATA)
		k.mu.Lock()
		k.base.files[rel] = baseFile{stamp: cur, key: key}
		if pf != nil {
			k.l.pending[st.Ino] = *pf
			k.l.bytes += st.Size
		}
		k.mu.Unlock()
	}
	k.mu.Lock()
	k.found++
	k.mu.Unlock()
	return nil
}

func readKept(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, notKept("%v", err)
	}
	defer f.Close()
	data, err := store.ReadAllLimited(f, maxKeptBytes, file)
	if err != nil {
		return nil, notKept("%v", err)
	}
	return data, nil
}

// keptArtifacts reports whether a placeholder's key names bytes in a
// revision the index still lists (a folder's object or an archive's
// member): those a save's pruning never removes under the tree.
func (w *Workspace) keptArtifacts() func(key string) bool {
	var paths []string
	if idx := w.Index(); idx != nil {
		for _, e := range idx.Revisions {
			paths = append(paths, e.Path)
		}
	}
	return func(key string) bool {
		return slices.ContainsFunc(paths, func(p string) bool {
			if strings.HasSuffix(p, "/") {
				return strings.HasPrefix(key, p)
			}
			return strings.HasPrefix(key, p+"#")
		})
	}
}

// typeOf names a stat mode's type as a tree entry does.
func typeOf(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return format.TypeDir
	case syscall.S_IFLNK:
		return format.TypeSymlink
	case syscall.S_IFREG:
		return format.TypeFile
	}
	return "special file"
}
