package revision

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

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

// are not fetched yet.
func isPlaceholder(f *os.File) bool {
	_, err := unix.Fgetxattr(int(f.Fd()), PendingXattr(), nil)
	return err == nil
}
