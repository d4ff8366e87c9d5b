package revision

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/amlfs/amlfs/revision/format"

	"golang.org/x/sys/unix"
)

// materializer writes tree entries under root. Directory modes are applied
// at the end, deepest first, so a read-only directory does not block the
// files beneath it.
type materializer struct {
	root string
	dirs []format.TreeEntry
}

func (m *materializer) target(p string) string {
	return filepath.Join(m.root, filepath.FromSlash(p))
}

// add creates e; for a file, content supplies exactly e.Size bytes.
// Directories must be added before what they hold (manifest order), and
// one at a time; files may be added concurrently.
func (m *materializer) add(e format.TreeEntry, content io.Reader) error {
	dst := m.target(e.Path)
	if e.Type == format.TypeDir {
		err := os.Mkdir(dst, 0o755)
		if os.IsNotExist(err) {
			err = os.MkdirAll(dst, 0o755)
		}
		if err != nil && !os.IsExist(err) {
			return err
		}
		if err := chownSavedAt(dst, e); err != nil {
			return err
		}
		m.dirs = append(m.dirs, e)
		return nil
	}
	if e.Type == format.TypeSymlink {
		err := os.Symlink(e.Target, dst)
		if os.IsNotExist(err) {
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			err = os.Symlink(e.Target, dst)
		}
		if err != nil {
			return err
		}
		if err := chownSavedAt(dst, e); err != nil {
			return err
		}
		return setMtime(dst, e.Mtime)
	}
	f, err := m.create(dst)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(content, e.Size))
	if err == nil && n != e.Size {
		err = fmt.Errorf("%s: got %d bytes, manifest says %d", e.Path, n, e.Size)
	}
	if err == nil {
		err = chownSaved(int(f.Fd()), e)
	}
	if err == nil {
		err = f.Chmod(os.FileMode(e.Mode))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = setMtime(dst, e.Mtime)
	}
	return err
}

// setMtime gives the entry at p (never followed) its saved mtime, and the
// same atime; a zero mtime (AML wrote the revision) leaves both alone.
func setMtime(p string, mt format.Mtime) error {
	if mt == 0 {
		return nil
	}
	ts := unix.NsecToTimespec(int64(mt))
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: p, Err: err}
	}
	return nil
}

// create makes a new file at dst, creating missing parents (a manifest
// need not list every directory).
func (m *materializer) create(dst string) (*os.File, error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if os.IsNotExist(err) {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, err
		}
		f, err = os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	return f, err
}

func (m *materializer) finish() error {
	sort.Slice(m.dirs, func(i, j int) bool { return format.Depth(m.dirs[i].Path) > format.Depth(m.dirs[j].Path) })
	for _, d := range m.dirs {
		if err := os.Chmod(m.target(d.Path), os.FileMode(d.Mode)); err != nil {
			return err
		}
		// Deepest first, after everything inside is made.
		if err := setMtime(m.target(d.Path), d.Mtime); err != nil {
			return err
		}
	}
	return nil
}
