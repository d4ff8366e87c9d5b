package store

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
)

// stableTries bounds how often a save reads a file that keeps changing
// under it before it gives up (ErrUnsettled: the engine then saves the
// file's previous bytes); between tries it waits stableWait, doubled each
// time (about a quarter of a second in all), for the writer to pause.
const (
	stableTries = 9
	stableWait  = time.Millisecond
)

// errChanged is what a read function returns when the file ended before
// the size it was told: the file changed, so the read is tried again.
var errChanged = errors.New("file changed while it was read")

// ErrUnsettled is what ReadStable's error wraps when the file changed
// during every reading: a writer that holds it open rewrites it without
// pause. Its bytes could not be taken at one instant.
var ErrUnsettled = errors.New("changed during every reading")

// FileStamp is f's stamp, by descriptor.
func FileStamp(f *os.File) (Stamp, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return Stamp{}, err
	}
	return Stamp{Ino: st.Ino, Size: uint64(st.Size), Mtime: st.Mtim, Ctime: st.Ctim}, nil
}

// ReadStable gives read the bytes of f as they were at one instant, and
// returns their stamp (whose size is their length). read is told the
// attempt (0 first), so that a retry may replace what an earlier one wrote.
//
// A stamp alone cannot tell: a write moves ctime when it starts, before it
// copies its bytes, so a read racing a long write sees a torn file under an
// unchanged stamp. So ReadStable first asks the kernel for a read lease on
// f. Granted, no one holds the file open for writing, and no one can open
// it for writing (or truncate it) until the lease is dropped: the read is
// consistent. Refused (EAGAIN: a process has it open for writing, as a log,
// a database or a passthrough descriptor), the file is hashed before and
// after read, and the read counts only if both hashes and the stamps
// agree. A changed file is read again, up to stableTries times.
func ReadStable(f *os.File, read func(size int64, attempt int) error) (Stamp, error) {
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
	return Stamp{}, amlerr.Wrap(amlerr.SaveFailed, f.Name(), fmt.Errorf("%w: changed during each of %d reads; not saving torn bytes", ErrUnsettled, stableTries))
}

// readOnce is one try of ReadStable; ok is false if f changed.
func readOnce(f *os.File, leased bool, read func(size int64) error) (Stamp, bool, error) {
	before, err := FileStamp(f)
	if err != nil {
		return Stamp{}, false, err
	}
	var h1 [sha256.Size]byte
	if !leased {
		if h1, err = hashPrefix(f, int64(before.Size)); err != nil {
			return Stamp{}, false, err
		}
	}
	rerr := read(int64(before.Size))
	after, err := FileStamp(f)
	if err != nil {
		return Stamp{}, false, err
	}
	if after != before {
		return Stamp{}, false, nil // whatever read did or said
	}
	if !leased {
		h2, err := hashPrefix(f, int64(before.Size))
		if err != nil {
			return Stamp{}, false, err
		}
		if again, err := FileStamp(f); err != nil || again != before || h2 != h1 {
			return Stamp{}, false, err
		}
		// A writer that holds the file open may be inside one long
		// write, preempted: the bytes are torn yet hold still while
		// they are hashed twice. Once more after a pause, so that it
		// would have to stay preempted through that too.
		time.Sleep(stableWait)
		h3, err := hashPrefix(f, int64(before.Size))
		if err != nil {
			return Stamp{}, false, err
		}
		if again, err := FileStamp(f); err != nil || again != before || h3 != h1 {
			return Stamp{}, false, err
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

// CopyExactly copies the first size bytes of f to w (by copy_file_range
// where w is a file); a shorter f is errChanged.
func CopyExactly(w io.Writer, f *os.File, size int64) (int64, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err == nil && n != size {
		err = fmt.Errorf("%w (%d of %d bytes)", errChanged, n, size)
	}
	return n, err
}

// CloseLocal closes f if it is not nil.
func CloseLocal(f *os.File) {
	if f != nil {
		f.Close()
	}
}

// BaseGone is the error of a save that needs an object of its base
// revision that is gone, and has no bytes of its own to write instead.
func BaseGone(key string) error {
	return amlerr.New(amlerr.BaseRevisionGone, key, "a lazily restored file was never fetched, and its bytes are gone from the store (another writer pruned the revision it came from); nothing was published. "+
		"Its content is lost to this tree: mount with --discard-unsaved to take the current revision")
}

// isPlaceholder reports whether f is a lazily restored file whose bytes

// A Stamp identifies a file's content by its stat data, as git's index
// does: the same inode, size, mtime and ctime mean the same bytes, because
// every write, truncate, chmod, rename or link moves ctime forward. amlfs
// keeps, for the tree it last restored or saved, each file's Stamp and the
// store key of its bytes, so that a save can reuse an unchanged file's
// object (a hard link, or a server-side copy) instead of uploading it.
type Stamp struct {
	Ino, Size    uint64
	Mtime, Ctime syscall.Timespec
}
