package fuse

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"syscall"
)

// ToErrno maps an error to the errno the kernel sees. It is the one place
// amlfs does this: wrapped sentinels are matched with errors.Is and As, a
// cancelled context is EINTR, and anything unknown is EIO, logged once with
// the original error.
func ToErrno(log *slog.Logger, op, path string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
		return errno
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return syscall.EINTR
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, fs.ErrPermission):
		return syscall.EACCES
	case errors.Is(err, errors.ErrUnsupported):
		return syscall.ENOTSUP
	}
	if log != nil {
		log.Error("I/O error", "op", op, "path", path, "err", err)
	}
	return syscall.EIO
}
