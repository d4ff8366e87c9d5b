// Package atomicfile replaces small files durably: readers see the old
// bytes or the new, never a mix, and a crash after Write returns keeps the
// new ones.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with data and mode perm. The bytes go to a temporary
// file named .tmp-<name>-* in tmpDir ("" for path's own directory; it must
// be on the same filesystem), which is synced, renamed over path, and then
// path's directory is synced. On failure the temporary file is removed.
func Write(path, tmpDir string, data []byte, perm os.FileMode) error {
	if tmpDir == "" {
		tmpDir = filepath.Dir(path)
	}
	tmp, err := os.CreateTemp(tmpDir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; cleans up a failure
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the entries of dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
