package revision

import (
	"os"
	"path/filepath"
	"syscall"

	"github.com/amlfs/amlfs/revision/format"

	"golang.org/x/sys/unix"
)

// A StatView is what the serving side shows for restored files (FUSE
// shows them with the inode numbers and ctimes they were saved with:
// fuse/shown). The engine tells it what a restore makes and a fetch
// fills, and asks it what a save records. Without one, the stat data are
// the disk's own.
type StatView interface {
	// Reset starts over for a restore of entries; it clears the Stat of
	// an entry whose saved number it will not show.
	Reset(entries []format.TreeEntry)
	// Restored records that the backing inode st was made for te.
	Restored(st *unix.Statx_t, te format.TreeEntry)
	// Filled says that a restored file's bytes were fetched in place.
	Filled(ino uint64, ctime int64)
	// Saved gives the number and ctime a save records for the backing
	// inode ino whose ctime is ctime (ns).
	Saved(ino uint64, ctime int64) (uint64, int64)
}

// diskView shows the disk's own stat data.
type diskView struct{}

func (diskView) Reset([]format.TreeEntry)                      {}
func (diskView) Restored(*unix.Statx_t, format.TreeEntry)      {}
func (diskView) Filled(uint64, int64)                          {}
func (diskView) Saved(ino uint64, ctime int64) (uint64, int64) { return ino, ctime }

// recordView tells v of the symlinks of a restore into dir, and with files its
// files.
func recordView(v StatView, dir string, entries []format.TreeEntry, files bool) {
	for _, te := range entries {
		if te.Stat.Ino == 0 || (te.Type == format.TypeFile && !files) {
			continue
		}
		var st unix.Statx_t
		if statx(filepath.Join(dir, filepath.FromSlash(te.Path)), &st) == nil {
			v.Restored(&st, te)
		}
	}
}

// statx describes the entry at path, never following it.
func statx(path string, st *unix.Statx_t) error {
	return unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, st)
}

func tsOf(ts unix.StatxTimestamp) syscall.Timespec {
	return syscall.Timespec{Sec: ts.Sec, Nsec: int64(ts.Nsec)}
}

// chownSaved gives a restored entry, by its descriptor, the owner it was
// saved with, if the daemon may (as root: as tar does for root), so that
// the user who made the files can change them again.
func chownSaved(fd int, te format.TreeEntry) error {
	if te.Stat == (format.EntryStat{}) || os.Geteuid() != 0 {
		return nil
	}
	// A new file is the daemon's (or its directory's group's) already,
	// most often the owner saved: a chown would only write the inode.
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil && st.Uid == te.Stat.Uid && st.Gid == te.Stat.Gid {
		return nil
	}
	return unix.Fchownat(fd, "", int(te.Stat.Uid), int(te.Stat.Gid), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
}

// chownSavedAt is chownSaved for the entry at path, never followed.
func chownSavedAt(path string, te format.TreeEntry) error {
	if te.Stat == (format.EntryStat{}) || os.Geteuid() != 0 {
		return nil
	}
	if err := unix.Fchownat(unix.AT_FDCWD, path, int(te.Stat.Uid), int(te.Stat.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "chown", Path: path, Err: err}
	}
	return nil
}
