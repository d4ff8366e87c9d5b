package revision

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/revision/format"
)

// Saves of lazily restored trees. A directory whose placeholders are not
// made yet holds its base revision's files unchanged: nothing creates an
// entry in it without populating it first. So a save of an archive lists
// such a directory's files from the revision, and copies their members on
// the store's side, without making a placeholder: the first checkpoint
// after a lazy restore costs what changed, not a placeholder per file.
// After the save the directory is repointed at the new archive, where the
// save copied its files, before the base is pruned.
//
// A directory is saved so only if it is where the revision had it and was
// restored from the save's base; with gitignore rules on, not if it holds
// a .gitignore (which the save must read). Any other is populated first,
// as is every directory whose files a save must read.

// pendingSnapshot is one save's view of its tree's pending directories.
type pendingSnapshot struct {
	w       *Workspace
	ctx     context.Context
	l       *lazyState
	virtual bool   // pending directories may be listed from the revision
	rev     string // the base archive, which they must come from
	sel     format.Selection
	dirs    map[fileID]string // GUARDED_BY(l.dirs.mu): listed from the revision: directory -> path
}

// snapshotPending prepares a save of src's tree (w's own when src == w)
// in the format of w. base is the tree the save composes from.
func (w *Workspace) snapshotPending(ctx context.Context, src *Workspace, base *baseTree, dir string, sel format.Selection) *pendingSnapshot {
	l := src.lazyState()
	if l == nil || l.dirs == nil || l.dir != dir {
		return nil
	}
	ps := &pendingSnapshot{w: src, ctx: ctx, l: l, sel: sel, dirs: map[fileID]string{}}
	ps.virtual = src == w && w.opts.Format == format.FormatArchive && base != nil && base.index != nil && base.dir == dir
	if ps.virtual {
		ps.rev = base.revPath
	}
	return ps
}

// prepare is the snapshot's hook for the directory rel: it returns the
// files to list from the revision, or makes the directory's placeholders
// (nil). Either way its .gitignore, if the save reads one, has its bytes.
func (ps *pendingSnapshot) prepare(rel string) ([]format.TreeEntry, error) {
	p := filepath.Join(ps.l.dir, filepath.FromSlash(rel))
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, nil
	}
	d := ps.l.dirs
	if d.n.Load() > 0 {
		d.mu.Lock()
		_, maybe := d.dirs[st.Ino]
		d.mu.Unlock()
		var id fileID
		if maybe {
			var err error
			if id, err = idOfPath(p); err != nil {
				return nil, nil
			}
		}
		d.mu.Lock()
		pd, pending := d.dir(id)
		pending = pending && maybe
		_, busy := d.calls[id.ino]
		files := d.files[pd.rev+"\x00"+pd.origPath]
		loaded := d.revs[pd.rev] != nil
		ok := pending && !busy && loaded && ps.virtual && pd.rev == ps.rev && pd.origPath == rel
		if ok && !ps.sel.NoGitignore {
			for _, te := range files {
				if path.Base(te.Path) == ".gitignore" {
					ok = false
				}
			}
		}
		if ok {
			ps.dirs[id] = rel
			d.mu.Unlock()
			return append([]format.TreeEntry(nil), files...), nil
		}
		// Listed by an earlier reading of this save (readHeld), and
		// made since: its placeholders are listed now.
		delete(ps.dirs, id)
		d.mu.Unlock()
		if pending {
			if err := ps.w.populate(ps.ctx, ps.l, id, p); err != nil {
				return nil, err
			}
		}
	}
	if !ps.sel.NoGitignore {
		gi := ".gitignore"
		if rel != "" {
			gi = rel + "/.gitignore"
		}
		if err := ps.w.ensure(ps.ctx, gi); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// listed reports the directories listed from the revision.
func (ps *pendingSnapshot) listed() map[fileID]string {
	if ps == nil {
		return nil
	}
	ps.l.dirs.mu.Lock()
	defer ps.l.dirs.mu.Unlock()
	out := make(map[fileID]string, len(ps.dirs))
	for id, rel := range ps.dirs {
		out[id] = rel
	}
	return out
}

// repointDirs moves the pending directories a save listed from its base
// (dirs: inode -> path) to the archive at rev it published, whose index
// is x: their files' members are there now. One that cannot be moved is
// populated, so that pruning the base fetches its files first.
func (w *Workspace) repointDirs(ctx context.Context, dirs map[fileID]string, rev string, x *format.ArchiveIndex) {
	l := w.lazyState()
	if l == nil || l.dirs == nil || len(dirs) == 0 || x == nil {
		return
	}
	// Where each directory is now: where the save listed it, unless an
	// ancestor moved since (which does not populate it).
	at := make(map[fileID]string, len(dirs))
	moved := map[fileID]bool{}
	for id, rel := range dirs {
		p := filepath.Join(l.dir, filepath.FromSlash(rel))
		if got, err := idOfPath(p); err == nil && got == id {
			at[id] = p
		} else {
			moved[id] = true
		}
	}
	for id, p := range findDirs(l.dir, moved) {
		at[id] = p
	}
	d := l.dirs
	d.mu.Lock()
	d.load(rev, d.sel.Filter(x.Tree()), x)
	failed := map[fileID]string{}
	for id, rel := range dirs {
		pd, ok := d.dir(id)
		if _, busy := d.calls[id.ino]; !ok || busy || pd.origPath != rel {
			continue // populated, or being populated, since
		}
		p, found := at[id]
		if !found {
			continue // removed: nothing needs its files
		}
		if !sameFiles(d.files[pd.rev+"\x00"+rel], d.files[rev+"\x00"+rel]) {
			// The save left out some of its files (its selection is
			// not the restore's): they are made from the base first.
			failed[id] = p
			continue
		}
		if err := remarkDir(p, id, []byte(rev+"\x00"+rel)); err != nil {
			if !errors.Is(err, unix.ENODATA) {
				failed[id] = p
			}
			continue
		}
		d.dirs[id.ino] = pendingDir{rev: rev, origPath: rel, handle: id.handle}
	}
	// The file lists of revisions no pending directory names any more.
	used := map[string]bool{}
	for _, pd := range d.dirs {
		used[pd.rev] = true
	}
	for r := range d.revs {
		if !used[r] {
			delete(d.revs, r)
		}
	}
	for k := range d.files {
		if r, _, _ := strings.Cut(k, "\x00"); !used[r] {
			delete(d.files, k)
		}
	}
	d.mu.Unlock()
	for id, p := range failed {
		if err := w.populate(ctx, l, id, p); err != nil {
			w.log.Error("make placeholders before the base is pruned", "op", "repoint", "path", p, "err", err)
		}
	}
}

// sameFiles reports whether b lists every file of a, by path.
func sameFiles(a, b []format.TreeEntry) bool {
	in := make(map[string]bool, len(b))
	for _, te := range b {
		in[te.Path] = true
	}
	for _, te := range a {
		if !in[te.Path] {
			return false
		}
	}
	return true
}

// remarkDir writes the marker of the pending directory id at p, through
// a descriptor of it: only if it is still that directory, and still
// marked (ENODATA: populated since).
func remarkDir(p string, id fileID, marker []byte) error {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if got, err := idOfFd(fd); err != nil || got != id {
		return fmt.Errorf("%s is no longer the directory %v", p, id)
	}
	return unix.Setxattr(fmt.Sprintf("/proc/self/fd/%d", fd), PendingDirXattr(), marker, unix.XATTR_REPLACE)
}

// findDirs finds the directories below root that want names, by walking
// the tree (they may have moved): directory -> path.
func findDirs(root string, want map[fileID]bool) map[fileID]string {
	out := map[fileID]string{}
	if len(want) == 0 {
		return out
	}
	inos := make(map[uint64]bool, len(want))
	for id := range want {
		inos[id.ino] = true
	}
	filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.IsDir() {
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) == nil && inos[st.Ino] {
				if id, err := idOfPath(p); err == nil && want[id] {
					out[id] = p
				}
			}
		}
		return nil
	})
	return out
}
