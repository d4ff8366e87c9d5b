package fuse

import (
	"log/slog"
	"syscall"

	"github.com/amlfs/amlfs/amlerr"
)

// ToErrno maps an error to the errno the kernel sees, by amlfs's one
// error table (amlerr.Errno): a wrapped errno is itself, a cancelled
// context EINTR, a coded error its code's errno. Anything unknown is EIO,
// logged with the original error.
func ToErrno(log *slog.Logger, op, path string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if _, known := amlerr.Classify(err); !known && log != nil {
		log.Error("I/O error", "op", op, "path", path, "err", err)
	}
	return amlerr.Errno(err)
}
