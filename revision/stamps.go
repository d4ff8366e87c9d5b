package revision

import (
	"path/filepath"
	"sync"
	"syscall"
)

// A stamp identifies a file's content by its stat data, as git's index
// does: the same inode, size, mtime and ctime mean the same bytes, because
// every write, truncate, chmod, rename or link moves ctime forward. amlfs
// keeps, for the tree it last restored or saved, each file's stamp and the
// store key of its bytes, so that a save can reuse an unchanged file's
// object (a hard link, or a server-side copy) instead of uploading it.
type stamp struct {
	ino, size    uint64
	mtime, ctime syscall.Timespec
}

type baseFile struct {
	stamp stamp
	key   string // the store key holding this file's bytes
}

// baseTree is the tree a working directory was restored from or last
// saved as.
type baseTree struct {
	dir     string
	rev     string // the revision the keys point into
	revPath string // its artifact path
	mu      sync.Mutex
	files   map[string]baseFile // GUARDED_BY(mu): by revision path
}

// refresh updates p's stamp after its bytes were fetched in place, if p is
// still that inode.
func (b *baseTree) refresh(p string, ino uint64, st stamp) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f, ok := b.files[p]; ok && f.stamp.ino == ino {
		f.stamp = st
		b.files[p] = f
	}
}

func statStamp(path string) (stamp, bool) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return stamp{}, false
	}
	return stamp{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim, ctime: st.Ctim}, true
}

// reusable returns the key of p's bytes in the base revision if the file
// at dir/p is unchanged since.
func (b *baseTree) reusable(dir, p string) (string, stamp, bool) {
	cur, ok := statStamp(filepath.Join(dir, filepath.FromSlash(p)))
	if !ok {
		return "", cur, false
	}
	if b == nil || b.dir != dir {
		return "", cur, false
	}
	b.mu.Lock()
	f, ok := b.files[p]
	b.mu.Unlock()
	if !ok || f.stamp != cur {
		return "", cur, false
	}
	return f.key, cur, true
}

// recordTree stamps every file of entries under dir, keyed into the folder
// revision e.
func recordTree(dir string, e Entry, entries []TreeEntry) *baseTree {
	revPath := e.Path
	b := &baseTree{dir: dir, rev: e.ID, revPath: e.Path, files: make(map[string]baseFile, len(entries))}
	for _, e := range entries {
		if e.Type != TypeFile {
			continue
		}
		if st, ok := statStamp(filepath.Join(dir, filepath.FromSlash(e.Path))); ok {
			b.files[e.Path] = baseFile{stamp: st, key: revPath + "files/" + e.Path}
		}
	}
	return b
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
