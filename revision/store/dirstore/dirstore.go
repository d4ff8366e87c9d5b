package dirstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/atomicfile"
)

// Store is the filesystem store: ROOT is Base/seg(id).
type Store struct {
	Base string // the store directory (file:///Base)
	ID   string
	Seg  string
	// LockRefresh and LockStale follow AML's 5 and 20 minute policy.
	LockRefresh, LockStale time.Duration
}

// New returns the filesystem store of workspace id under base.
func New(base, id string) (*Store, error) {
	seg, err := format.Seg(id)
	if err != nil {
		return nil, err
	}
	return &Store{Base: base, ID: id, Seg: seg, LockRefresh: 5 * time.Minute, LockStale: 20 * time.Minute}, nil
}

func (s *Store) root() string { return filepath.Join(s.Base, s.Seg) }

// path is key's file; a foreign key's is in its workspace's root.
func (s *Store) path(key string) string {
	dir, rel := s.locate(key)
	return filepath.Join(dir, rel)
}

// locate splits key's file into the directory it must lie beneath and the
// path below it: the root, or for a foreign key the base.
func (s *Store) locate(key string) (dir, rel string) {
	if seg, rest, ok := store.SplitForeign(key); ok {
		return s.Base, filepath.Join(seg, filepath.FromSlash(rest))
	}
	return s.root(), filepath.FromSlash(key)
}

// Sibling returns the store of workspace id under the same base.
func (s *Store) Sibling(id string) (store.Store, error) {
	o, err := New(s.Base, id)
	if err != nil {
		return nil, err
	}
	o.LockRefresh, o.LockStale = s.LockRefresh, s.LockStale
	return o, nil
}

// Foreign returns key as the workspace's siblings name it.
func (s *Store) Foreign(key string) string { return store.ForeignKey(s.Seg, key) }
func (s *Store) String() string            { return "file://" + s.root() }

func version(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func notExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %v", store.ErrNotExist, err)
	}
	return err
}

func (s *Store) ReadIndex(ctx context.Context) ([]byte, string, error) {
	f, err := s.openObject(format.IndexKey)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, format.MaxIndexBytes+1))
	if err != nil {
		return nil, "", err
	}
	return data, version(data), nil
}

// PublishIndex compares and swaps workspace.json under an exclusive flock on
// ROOT, so that concurrent publishers on this host (locked or not) serialize.
func (s *Store) PublishIndex(ctx context.Context, data []byte, prev string) (string, error) {
	if err := os.MkdirAll(s.root(), 0o700); err != nil {
		return "", err
	}
	unlock, err := flockDir(s.root())
	if err != nil {
		return "", err
	}
	defer unlock()
	_, curVer, err := s.ReadIndex(ctx)
	switch {
	case errors.Is(err, store.ErrNotExist):
		if prev != "" {
			return "", fmt.Errorf("%w: %s disappeared", store.ErrPrecondition, format.IndexKey)
		}
	case err != nil:
		return "", err
	default:
		if curVer != prev {
			return "", fmt.Errorf("%w: %s was replaced by another writer", store.ErrPrecondition, format.IndexKey)
		}
	}
	// The temporary file goes in the staging directory, so that a crash
	// leaves it where the next save's cleanup looks.
	if err := os.MkdirAll(s.path(stagingDir), 0o700); err != nil {
		return "", err
	}
	if err := atomicfile.Write(s.path(format.IndexKey), s.path(stagingDir), data, 0o600); err != nil {
		return "", err
	}
	return version(data), nil
}

func flockDir(dir string) (func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "flock", Path: dir, Err: err}
	}
	return func() { unix.Flock(fd, unix.LOCK_UN); unix.Close(fd) }, nil
}

func (s *Store) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.openObject(key)
}

// openObject opens the regular file at key for reading, resolving it
// beneath the root without following any symlink (openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS): a symlink planted in the store
// (files/x pointing at a root-only file, or revisions/ at another
// directory) must not make a root daemon read outside it. A key that is
// not a regular file is INVALID_STORE; O_NONBLOCK keeps a fifo from
// hanging the open.
func (s *Store) openObject(key string) (*os.File, error) {
	dir, rel := s.locate(key)
	rfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, notExist(&os.PathError{Op: "open", Path: dir, Err: err})
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS,
	})
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return nil, amlerr.New(amlerr.InvalidStore, s.path(key), "a symlink in the store (or a path leaving it) where an object should be; refusing to follow it")
	}
	if err != nil {
		return nil, notExist(&os.PathError{Op: "open", Path: s.path(key), Err: err})
	}
	f := os.NewFile(uintptr(fd), s.path(key))
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, amlerr.New(amlerr.InvalidStore, s.path(key), "not a regular file")
	}
	// Reads block as usual: O_NONBLOCK only guarded the open.
	if err := unix.SetNonblock(fd, false); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// realDirs refuses a store whose revisions/ or staging directory is a
// symlink: listing orphans through one, or renaming an artifact out of it
// to delete it, would act on another directory.
func (s *Store) realDirs() error {
	for _, d := range []string{"revisions", stagingDir} {
		fi, err := os.Lstat(s.path(d))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return amlerr.New(amlerr.InvalidStore, s.path(d), "is not a directory (a symlink?); refusing to list or remove artifacts through it")
		}
	}
	return nil
}

// Remove first moves the artifact into the staging directory, so that it
// leaves revisions/ at once, whole; a crash while its files are deleted
// leaves the rest where the next save's cleanup looks.
func (s *Store) Remove(ctx context.Context, key string) error {
	if store.IsForeign(key) {
		return fmt.Errorf("remove %s: another workspace's object", key)
	}
	if err := s.realDirs(); err != nil {
		return err
	}
	p := s.path(strings.TrimSuffix(key, "/"))
	if !strings.HasPrefix(key, stagingDir+"/") {
		if err := os.MkdirAll(s.path(stagingDir), 0o700); err != nil {
			return err
		}
		trash := filepath.Join(s.path(stagingDir), "removed-"+uuid.NewString())
		err := os.Rename(p, trash)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		p = trash
	}
	return os.RemoveAll(p)
}

func (s *Store) Artifacts(ctx context.Context) ([]string, error) {
	if err := s.realDirs(); err != nil {
		return nil, err
	}
	var keys []string
	for _, dir := range []string{"revisions", stagingDir} {
		ents, err := os.ReadDir(s.path(dir))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			k := dir + "/" + e.Name()
			if e.IsDir() {
				k += "/"
			}
			keys = append(keys, k)
		}
	}
	return keys, nil
}

func (s *Store) Destroy(ctx context.Context) error {
	return os.RemoveAll(s.root())
}

const stagingDir = ".amlfs-staging"

func (s *Store) Stage(ctx context.Context, key string) (store.Stager, error) {
	if err := s.realDirs(); err != nil {
		return nil, err
	}
	dir := s.path(stagingDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.path("revisions"), 0o700); err != nil {
		return nil, err
	}
	tmp := filepath.Join(dir, uuid.NewString())
	folder := strings.HasSuffix(key, "/")
	if folder {
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return nil, err
		}
	}
	return &fsStager{s: s, key: key, tmp: tmp, folder: folder}, nil
}

type fsStager struct {
	s       *Store
	key     string
	tmp     string
	folder  bool
	written func(string, int64)
}

func (st *fsStager) OnWritten(fn func(string, int64)) { st.written = fn }

func (st *fsStager) landed(name string, n int64) {
	if st.written != nil {
		st.written(name, n)
	}
}

func (st *fsStager) target(name string) (string, error) {
	if !st.folder {
		if name != "" {
			return "", fmt.Errorf("archive artifact has a single object, not %q", name)
		}
		return st.tmp, nil
	}
	if err := format.ValidPath(name); err != nil {
		return "", err
	}
	p := filepath.Join(st.tmp, filepath.FromSlash(name))
	return p, os.MkdirAll(filepath.Dir(p), 0o700)
}

func (st *fsStager) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	p, err := st.target(name)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	var n int64
	if size < 0 {
		n, err = io.Copy(f, r)
		size = n
	} else {
		n, err = io.Copy(f, io.LimitReader(r, size+1))
	}
	if err == nil && n != size {
		err = fmt.Errorf("%s: wrote %d bytes, expected %d (did it change during the save?)", name, n, size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		st.landed(name, n)
	}
	return err
}

func (st *fsStager) PutFile(ctx context.Context, name string, f *os.File, done func(store.Stamp, error)) error {
	defer f.Close()
	p, err := st.target(name)
	if err != nil {
		return err
	}
	// The object is no more readable than the file: a 0600 secret stays
	// unreadable to other users in the store too.
	perm := os.FileMode(0o600)
	if fi, err := f.Stat(); err == nil {
		perm = fi.Mode().Perm()&0o700 | 0o600
	}
	stp, err := store.ReadStable(f, func(size int64, attempt int) error {
		flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
		if attempt > 0 {
			flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC // our own earlier try
		}
		out, err := os.OpenFile(p, flags, perm)
		if err != nil {
			return err
		}
		_, err = store.CopyExactly(out, f, size)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if errors.Is(err, store.ErrUnsettled) {
		os.Remove(p) // what the last try wrote
		done(store.Stamp{}, err)
		return nil
	}
	if err != nil {
		return err
	}
	st.landed(name, int64(stp.Size))
	done(stp, nil)
	return nil
}

func (st *fsStager) Flush(ctx context.Context) error { return nil }

func (st *fsStager) Reuse(ctx context.Context, name, fromKey string, local *os.File, done func(*store.Stamp, error)) error {
	p, err := st.target(name)
	if err != nil {
		store.CloseLocal(local)
		return err
	}
	if err := os.Link(st.s.path(fromKey), p); errors.Is(err, os.ErrNotExist) {
		// The base revision was pruned: write the bytes from the tree.
		if local == nil {
			return store.BaseGone(fromKey)
		}
		return st.PutFile(ctx, name, local, func(stp store.Stamp, err error) { done(&stp, err) })
	} else if err != nil {
		store.CloseLocal(local)
		return err
	}
	store.CloseLocal(local)
	st.landed(name, 0)
	done(nil, nil)
	return nil
}

func (st *fsStager) Commit(ctx context.Context) error {
	// One syncfs makes every staged byte durable before the artifact
	// appears; far cheaper than an fsync per file.
	fd, err := unix.Open(st.tmp, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = unix.Syncfs(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("syncfs: %w", err)
	}
	dst := st.s.path(strings.TrimSuffix(st.key, "/"))
	if err := unix.Renameat2(unix.AT_FDCWD, st.tmp, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			return fmt.Errorf("%w: %s", store.ErrExist, st.key)
		}
		return &os.PathError{Op: "rename", Path: dst, Err: err}
	}
	os.Remove(filepath.Dir(st.tmp)) // the staging dir, if no other save uses it
	return atomicfile.SyncDir(filepath.Dir(dst))
}

func (st *fsStager) Abort(ctx context.Context) error {
	return os.RemoveAll(st.tmp)
}

// SameObject reports whether keys a and b are one file (a revision reuses
// an unchanged file of the previous one as a hard link).
func (s *Store) SameObject(ctx context.Context, a, b string) bool {
	fa, err := os.Stat(s.path(a))
	if err != nil {
		return false
	}
	fb, err := os.Stat(s.path(b))
	return err == nil && os.SameFile(fa, fb)
}
