package revision

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Identity. The kernel gives a freed inode number to the next file made,
// so a record the engine keeps about a file of the working tree (a
// placeholder to fill, a directory to populate) names it by its file
// handle (name_to_handle_at: on ext4, xfs and btrfs the inode number and
// its generation), which names that file only: a file made later with
// the same number has another handle. Records are indexed by inode number
// (a number is one file at a time), and a file matches a record only if
// its handle is the record's.

// fileID is a file's identity: its inode number and handle.
type fileID struct {
	ino uint64
	// handle is the handle's type and bytes; "" on a file system that
	// gives no handles, where the marker a placeholder carries is the
	// only check left (fillFile, fillDir).
	handle string
}

func (id fileID) String() string { return fmt.Sprintf("inode %d (handle %x)", id.ino, id.handle) }

// idOf is the identity of the file open as fd (any descriptor, O_PATH
// ones too), whose stat is st.
func idOf(fd int, st *unix.Stat_t) (fileID, error) {
	h, err := handleOf(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return fileID{}, err
	}
	return fileID{ino: st.Ino, handle: h}, nil
}

// idOfFd is the identity of the file open as fd.
func idOfFd(fd int) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, err
	}
	return idOf(fd, &st)
}

// idAt is the identity of the entry name in the directory open as dirfd
// (AT_FDCWD: a path), with no symlink followed, and its stat. It opens
// the entry, so that the number and the handle are of one file.
func idAt(dirfd int, name string) (fileID, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fileID{}, st, &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, st, err
	}
	id, err := idOf(fd, &st)
	return id, st, err
}

// idOfPath is the identity of the file at p, with no symlink followed.
func idOfPath(p string) (fileID, error) {
	id, _, err := idAt(unix.AT_FDCWD, p)
	return id, err
}

// handleOf is name_to_handle_at's handle of name in dirfd, as a string:
// its type (4 bytes, little-endian), then its bytes.
func handleOf(dirfd int, name string, flags int) (string, error) {
	h, _, err := unix.NameToHandleAt(dirfd, name, flags)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return "", nil
	}
	if err != nil {
		return "", &os.PathError{Op: "name_to_handle_at", Path: name, Err: err}
	}
	b := make([]byte, 4, 4+len(h.Bytes()))
	binary.LittleEndian.PutUint32(b, uint32(h.Type()))
	return string(append(b, h.Bytes()...)), nil
}
