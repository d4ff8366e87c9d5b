package revision

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
)

// stableTries bounds how often a save reads a file that keeps changing
// under it before it gives up; between tries it waits stableWait, doubled
// each time (about 2 s in all), for the writer to pause.
const (
	stableTries = 12
	stableWait  = time.Millisecond
)

// errChanged is what a read function returns when the file ended before
// the size it was told: the file changed, so the read is tried again.
var errChanged = errors.New("file changed while it was read")

// fstamp is f's stamp, by descriptor.
func fstamp(f *os.File) (stamp, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return stamp{}, err
	}
	return stamp{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim, ctime: st.Ctim}, nil
}

// readStable gives read the bytes of f as they were at one instant, and
// returns their stamp (whose size is their length). read is told the
// attempt (0 first), so that a retry may replace what an earlier one wrote.
//
// A stamp alone cannot tell: a write moves ctime when it starts, before it
// copies its bytes, so a read racing a long write sees a torn file under an
// unchanged stamp. So readStable first asks the kernel for a read lease on
// f. Granted, no one holds the file open for writing, and no one can open
// it for writing (or truncate it) until the lease is dropped: the read is
// consistent. Refused (EAGAIN: a process has it open for writing, as a log,
// a database or a passthrough descriptor), the file is hashed before and
// after read, and the read counts only if both hashes and the stamps
// agree. A changed file is read again, up to stableTries times.
func readStable(f *os.File, read func(size int64, attempt int) error) (stamp, error) {
	fd := int(f.Fd())
	for attempt := range stableTries {
		_, lerr := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_RDLCK)
		leased := lerr == nil
		st, ok, err := readOnce(f, leased, func(size int64) error { return read(size, attempt) })
		if leased {
			unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
		}
		if err != nil || ok {
			return st, err
		}
		time.Sleep(stableWait << attempt)
	}
	return stamp{}, amlerr.New(amlerr.SaveFailed, f.Name(), "changed during each of %d reads; not saving torn bytes (the next save tries again)", stableTries)
}

// readOnce is one try of readStable; ok is false if f changed.
func readOnce(f *os.File, leased bool, read func(size int64) error) (stamp, bool, error) {
	before, err := fstamp(f)
	if err != nil {
		return stamp{}, false, err
	}
	var h1 [sha256.Size]byte
	if !leased {
		if h1, err = hashPrefix(f, int64(before.size)); err != nil {
			return stamp{}, false, err
		}
	}
	rerr := read(int64(before.size))
	after, err := fstamp(f)
	if err != nil {
		return stamp{}, false, err
	}
	if after != before {
		return stamp{}, false, nil // whatever read did or said
	}
	if !leased {
		h2, err := hashPrefix(f, int64(before.size))
		if err != nil {
			return stamp{}, false, err
		}
		if again, err := fstamp(f); err != nil || again != before || h2 != h1 {
			return stamp{}, false, err
		}
	}
	return before, rerr == nil, rerr
}

// hashPrefix hashes the first size bytes of f.
func hashPrefix(f *os.File, size int64) ([sha256.Size]byte, error) {
	h := sha256.New()
	n, err := io.Copy(h, io.NewSectionReader(f, 0, size))
	if err == nil && n != size {
		err = errChanged
	}
	var sum [sha256.Size]byte
	if err == nil {
		h.Sum(sum[:0])
	}
	if errors.Is(err, errChanged) {
		err = nil // a shorter file: the hashes differ, and it is read again
	}
	return sum, err
}

// copyExactly copies the first size bytes of f to w (by copy_file_range
// where w is a file); a shorter f is errChanged.
func copyExactly(w io.Writer, f *os.File, size int64) (int64, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err == nil && n != size {
		err = fmt.Errorf("%w (%d of %d bytes)", errChanged, n, size)
	}
	return n, err
}

// openSaved opens the working-tree file rel of t for a save, with no
// symlink anywhere in its path (tree.open). A file that is gone, or is no
// longer a regular file, reports gone: the tree changed after the
// snapshot, and the save leaves it out.
func openSaved(t *tree, rel string) (f *os.File, gone bool, err error) {
	f, err = t.open(rel, os.O_RDONLY)
	if changedUnder(err) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, true, nil
	}
	return f, false, nil
}

// placeholderAt reports whether rel is a placeholder, looked at through
// an O_PATH descriptor: no open of the file itself, which natively would
// fill it (FAN_OPEN_PERM). A save that reuses an unchanged file's object
// must not fetch a placeholder's bytes only to copy that object.
func placeholderAt(t *tree, rel string) bool {
	name := rel
	if name == "" {
		name = "."
	}
	// openat2 takes no other flag beside O_PATH (tree.open adds
	// O_NONBLOCK).
	fd, err := unix.Openat2(t.fd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: beneath})
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	_, err = unix.Getxattr("/proc/self/fd/"+strconv.Itoa(fd), PendingXattr(), nil)
	return err == nil
}

func closeLocal(f *os.File) {
	if f != nil {
		f.Close()
	}
}

// baseGone is the error of a save that needs an object of its base
// revision that is gone, and has no bytes of its own to write instead.
func baseGone(key string) error {
	return amlerr.New(amlerr.BaseRevisionGone, key, "a lazily restored file was never fetched, and its bytes are gone from the store (another writer pruned the revision it came from); nothing was published. "+
		"Its content is lost to this tree: mount with --discard-unsaved to take the current revision")
}

// isPlaceholder reports whether f is a lazily restored file whose bytes
// are not fetched yet.
func isPlaceholder(f *os.File) bool {
	_, err := unix.Fgetxattr(int(f.Fd()), PendingXattr(), nil)
	return err == nil
}
