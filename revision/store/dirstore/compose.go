package dirstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/revision/store"
)

// ReadRange reads a range of an object (store.Store).
func (s *Store) ReadRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, int64, error) {
	f, err := s.openObject(key)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	size := fi.Size()
	if off < 0 {
		off = max(0, size-n)
	}
	n = max(0, min(n, size-off))
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, off, n), f}, size, nil
}

// Compose writes the archive from its pieces (store.Stager): ranges of
// existing objects with copy_file_range, which shares the disk's blocks
// where the file system can (XFS, Btrfs) and copies in the kernel
// elsewhere.
func (st *fsStager) Compose(ctx context.Context, pieces []store.Piece) error {
	if err := store.CheckPieces(pieces); err != nil {
		return err
	}
	p, err := st.target("")
	if err != nil {
		return err
	}
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	var at int64
	for _, pc := range pieces {
		if err := ctx.Err(); err != nil {
			break
		}
		if pc.Key == "" {
			var n int64
			if n, err = io.Copy(io.NewOffsetWriter(out, at), io.NewSectionReader(pc.Data, pc.Off, pc.N)); err == nil && n != pc.N {
				err = fmt.Errorf("a piece of %d bytes gave %d", pc.N, n)
			}
		} else {
			err = st.copyRange(out, at, pc)
		}
		if err != nil {
			break
		}
		at += pc.N
	}
	if err == nil {
		err = ctx.Err()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		st.landed("", at)
	}
	return err
}

// copyRange copies pc's range of its object into out at at.
func (st *fsStager) copyRange(out *os.File, at int64, pc store.Piece) error {
	in, err := st.s.openObject(pc.Key)
	if errors.Is(err, store.ErrNotExist) {
		return fmt.Errorf("compose from %s: %w", pc.Key, err)
	}
	if err != nil {
		return err
	}
	defer in.Close()
	off, dst, left := pc.Off, at, pc.N
	for left > 0 {
		n, err := unix.CopyFileRange(int(in.Fd()), &off, int(out.Fd()), &dst, int(min(left, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
				// Not between these files: copy through memory.
				k, err := io.Copy(io.NewOffsetWriter(out, dst), io.NewSectionReader(in, off, left))
				if err == nil && k != left {
					err = fmt.Errorf("compose from %s: %d bytes at %d: the object is shorter", pc.Key, pc.N, pc.Off)
				}
				return err
			}
			return &os.PathError{Op: "copy_file_range", Path: pc.Key, Err: err}
		}
		if n == 0 {
			return fmt.Errorf("compose from %s: %d bytes at %d: the object is shorter", pc.Key, pc.N, pc.Off)
		}
		left -= int64(n)
	}
	return nil
}
