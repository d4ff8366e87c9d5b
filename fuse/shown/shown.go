// Package shown is the stat data the FUSE mount shows for restored files:
// the inode numbers and ctimes they were saved with, so that git's index
// still matches them after a restore. The loopback asks it what to show
// (loopback.Shown), and the engine tells it what a restore makes and a
// fetch fills, and asks it what a save records (revision.StatView).
package shown

import (
	"sync"

	"github.com/amlfs/amlfs/revision/format"
	"golang.org/x/sys/unix"
)

// Shown stat data. git's index holds each file's mtime, ctime, inode
// number, size, uid and gid, and git rehashes every file whose stat data
// differ from its entry's. A restore makes new inodes with new numbers and
// ctimes, so the first git status after one would read every file (and
// fetch every lazily restored one). A folder revision therefore keeps, for
// each file and symlink, the inode number and ctime the mount showed when
// it was saved (EntryStat), and the mount shows them again for the files a
// restore made:
//
//   - the number for the life of the file, whatever happens to it, so
//     that it never changes under a program holding the file;
//   - the saved ctime only while the file is untouched: any change to it
//     (a write, truncate, chmod, chown, rename or link) moves its real
//     ctime, and from then on the real one shows.
//
// Numbers stay unique in the tree: every number a restored file shows is
// known once the restore has read the manifest (taken), and a file whose
// own number is taken shows another one, with bits 32-47 flipped.
type Shown struct {
	mu    sync.RWMutex
	files map[uint64]shownFile // GUARDED_BY(mu): restored files, by backing inode number
	taken map[uint64]bool      // GUARDED_BY(mu): the numbers they show; set by reset
}

type shownFile struct {
	gen        uint64 // the backing inode's birth time, as birth gives it
	ctime      int64  // its ctime (ns) while untouched since the restore
	ino        uint64 // the number it shows
	savedCtime int64  // the ctime it shows while untouched
}

// New returns an empty table: every inode shows its own stat data until a
// restore is reset into it.
func New() *Shown { return &Shown{files: map[uint64]shownFile{}, taken: map[uint64]bool{}} }

// Reset starts over for a restore of entries, whose stat data it checks:
// a number two entries claim (copies of one hard-linked file) is kept by
// the first only, and the rest show their own; so is 1, the root's in
// go-fuse's table, and one with bits 48-63 set.
func (s *Shown) Reset(entries []format.TreeEntry) {
	taken := map[uint64]bool{}
	for i, e := range entries {
		st := &entries[i].Stat
		if (e.Type != format.TypeFile && e.Type != format.TypeSymlink) || st.Ino <= 1 || st.Ctime == 0 || st.Ino > format.MaxShownIno || taken[st.Ino] {
			st.Ino, st.Ctime = 0, 0
			continue
		}
		taken[st.Ino] = true
	}
	s.mu.Lock()
	s.files, s.taken = map[uint64]shownFile{}, taken
	s.mu.Unlock()
}

// Restored records that the backing inode st describes was made for te.
func (s *Shown) Restored(st *unix.Statx_t, te format.TreeEntry) {
	if te.Stat.Ino == 0 || te.Stat.Ctime == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.taken[te.Stat.Ino] {
		return // not of the restore reset was told of
	}
	s.files[st.Ino] = shownFile{gen: birth(st), ctime: nsOf(st.Ctime), ino: te.Stat.Ino, savedCtime: int64(te.Stat.Ctime)}
}

// Filled says that a restored file's bytes were fetched into it, in place:
// not a change, so it keeps showing the saved ctime.
func (s *Shown) Filled(ino uint64, ctime int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.files[ino]; ok {
		f.ctime = ctime
		s.files[ino] = f
	}
}

// Show gives the number and ctime to show for a backing inode.
func (s *Shown) Show(ino, gen uint64, ctime unix.StatxTimestamp) (uint64, unix.StatxTimestamp) {
	s.mu.RLock()
	f, ok := s.files[ino]
	s.mu.RUnlock()
	if ok && f.gen != gen {
		// The restored file is gone and the filesystem reused its number.
		s.mu.Lock()
		if cur, ok := s.files[ino]; ok && cur.gen == f.gen {
			delete(s.files, ino)
		}
		s.mu.Unlock()
		ok = false
	}
	if !ok {
		return s.fresh(ino), ctime
	}
	if nsOf(ctime) == f.ctime {
		return f.ino, unix.StatxTimestamp{Sec: f.savedCtime / 1e9, Nsec: uint32(f.savedCtime % 1e9)}
	}
	return f.ino, ctime
}

// DirIno gives the number to show for a backing inode in a listing.
func (s *Shown) DirIno(ino uint64) uint64 {
	s.mu.RLock()
	f, ok := s.files[ino]
	s.mu.RUnlock()
	if ok {
		return f.ino
	}
	return s.fresh(ino)
}

// Saved gives the number and ctime a save records for a file whose
// backing inode has number ino and ctime ctime (ns): the ones the mount
// shows for it.
func (s *Shown) Saved(ino uint64, ctime int64) (uint64, int64) {
	s.mu.RLock()
	f, ok := s.files[ino]
	s.mu.RUnlock()
	switch {
	case !ok:
		return s.fresh(ino), ctime
	case ctime == f.ctime:
		return f.ino, f.savedCtime
	}
	return f.ino, ctime
}

// fresh is the number shown for a backing inode that is not a restored
// file's: its own, unless a restored file shows that one. Backing numbers
// below 2^32 (ext4's) stay unique that way, as bits 32-47 are theirs.
func (s *Shown) fresh(ino uint64) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.taken[ino] {
		return ino
	}
	for k := uint64(1); k < 1<<16; k++ {
		if c := ino ^ k<<32; !s.taken[c] {
			return c
		}
	}
	return ino
}

func nsOf(ts unix.StatxTimestamp) int64 { return ts.Sec*1e9 + int64(ts.Nsec) }

// birth is an inode's birth time in ns, 1 if the filesystem keeps none:
// the loopback's generation of it (loopback.genOf).
func birth(st *unix.Statx_t) uint64 {
	if st.Mask&unix.STATX_BTIME == 0 || (st.Btime.Sec == 0 && st.Btime.Nsec == 0) {
		return 1
	}
	return uint64(st.Btime.Sec)*1e9 + uint64(st.Btime.Nsec)
}
