package revision

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A working tree may be changed by its users while the daemon reads it:
// served natively (a bind mount), a user can swap a directory for a
// symlink at any moment, also during a save. So the save and lazy restore
// reach a working-tree path only through openat2 with RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS from the tree's root: a symlink anywhere in the path
// fails with ELOOP, ".." can never leave the tree, and neither can a bind
// mount a user could not make anyway (RESOLVE_NO_XDEV).
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// tree is a working tree's root, open (O_PATH) for paths to be opened
// beneath it.
type tree struct {
	fd  int
	dir string
}

func openTree(dir string) (*tree, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return &tree{fd: fd, dir: dir}, nil
}

func (t *tree) Close() { unix.Close(t.fd) }

// openBeneath opens rel under the directory root, for one file (a tree
// opened once serves many: tree.open).
func openBeneath(root, rel string, flags int) (*os.File, error) {
	t, err := openTree(root)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	return t.open(rel, flags)
}

// open opens rel (slash-separated, "" for the root itself) beneath the
// root. O_NOFOLLOW and O_NONBLOCK (but with O_PATH) are always added: a
// fifo a user planted must not block the daemon.
func (t *tree) open(rel string, flags int) (*os.File, error) {
	name := rel
	if name == "" {
		name = "."
	}
	var fd int
	var err error
	// EAGAIN: a rename raced the resolution; retried a bounded number
	// of times, so a user renaming in a loop cannot hold the daemon.
	add := unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK
	if flags&unix.O_PATH != 0 {
		add &^= unix.O_NONBLOCK // openat2 refuses it with O_PATH, which opens nothing
	}
	for range 64 {
		fd, err = unix.Openat2(t.fd, name, &unix.OpenHow{
			Flags:   uint64(flags | add),
			Resolve: beneath,
		})
		if err != unix.EINTR && err != unix.EAGAIN {
			break
		}
	}
	if err == unix.EAGAIN {
		// Not a rename, but a lease another process holds on the file
		// (F_SETLEASE): a non-blocking open is refused for as long as
		// it is held. The file, checked regular, is opened again
		// blocking, so that the kernel breaks the lease (within
		// /proc/sys/fs/lease-break-time), and a user's lease never
		// fails a save.
		fd, err = openLeased(t.fd, name, flags, beneath)
	}
	p := filepath.Join(t.dir, filepath.FromSlash(rel))
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// openLeased opens name in dirfd, a regular file under a lease, without
// O_NONBLOCK: through an O_PATH descriptor of it (resolved with
// resolve), so that no fifo put in its place can block the open.
func openLeased(dirfd int, name string, flags int, resolve uint64) (int, error) {
	pfd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolve})
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1, unix.EAGAIN
	}
	for {
		fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), flags|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// changedUnder reports whether err, from opening a path beneath a tree,
// means the tree changed under the reader: the path is gone, or one of its
// directories was swapped for a symlink or a file.
func changedUnder(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV)
}

// relTo is path's slash-separated path below root, or an error if path is
// not below it.
func relTo(root, path string) (string, error) {
	r, err := filepath.Rel(root, path)
	if err != nil || r == ".." || strings.HasPrefix(r, "../") {
		return "", errors.New(path + " is not below " + root)
	}
	if r == "." {
		return "", nil
	}
	return filepath.ToSlash(r), nil
}

// statInfo is an fs.FileInfo from an lstat made relative to a directory
// descriptor (os.DirEntry.Info would lstat the whole path again).
type statInfo struct {
	name string
	st   syscall.Stat_t
}

func lstatAt(dirfd int, name string) (*statInfo, error) {
	fi := &statInfo{name: name}
	// unix.Stat_t and syscall.Stat_t are both the kernel's struct stat.
	if err := unix.Fstatat(dirfd, name, (*unix.Stat_t)(unsafe.Pointer(&fi.st)), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: name, Err: err}
	}
	return fi, nil
}

func (s *statInfo) Name() string       { return s.name }
func (s *statInfo) Size() int64        { return s.st.Size }
func (s *statInfo) ModTime() time.Time { return time.Unix(s.st.Mtim.Unix()) }
func (s *statInfo) IsDir() bool        { return s.st.Mode&syscall.S_IFMT == syscall.S_IFDIR }
func (s *statInfo) Sys() any           { return &s.st }
func (s *statInfo) Mode() fs.FileMode {
	m := fs.FileMode(s.st.Mode & 0o777)
	switch s.st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		m |= fs.ModeDir
	case syscall.S_IFLNK:
		m |= fs.ModeSymlink
	case syscall.S_IFIFO:
		m |= fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		m |= fs.ModeSocket
	case syscall.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		m |= fs.ModeDevice
	}
	return m
}

// readlinkAt reads the symlink name in dirfd.
func readlinkAt(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", &os.PathError{Op: "readlink", Path: name, Err: err}
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
