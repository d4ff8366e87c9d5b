package mount

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// EnsureRuntimeDir makes the runtime dir if missing and returns it, only if
// it can be trusted: a real directory (not a symlink), owned by this user,
// and open to no one else. In a shared $TMPDIR another user could have made
// /tmp/amlfs-UID first and planted a symlinked log or a forged last-stop
// record in it. A directory of ours that others may enter is narrowed to
// 0700.
func EnsureRuntimeDir() (string, error) {
	dir := RuntimeDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, trustDir(dir)
}

func trustDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFDIR:
		return invalid(dir, "the runtime dir is not a directory (a symlink?); refusing to use it: remove it, or set AMLFS_RUNTIME_DIR")
	case int(st.Uid) != os.Geteuid():
		return invalid(dir, "the runtime dir belongs to uid %d, not to this user (uid %d); refusing to use it, since its owner could plant files in it: remove it, or set AMLFS_RUNTIME_DIR", st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		if err := unix.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("narrow the runtime dir %s to 0700: %w", dir, err)
		}
	}
	return nil
}

// runtimeDirTrusted reports whether the runtime dir exists and can be
// trusted, without making it.
func runtimeDirTrusted() bool {
	if _, err := os.Lstat(RuntimeDir()); err != nil {
		return false
	}
	return trustDir(RuntimeDir()) == nil
}
