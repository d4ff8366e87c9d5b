package fuse

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"
)

func TestToErrno(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{fmt.Errorf("wrapped: %w", fs.ErrNotExist), syscall.ENOENT},
		{&os.PathError{Op: "open", Path: "x", Err: syscall.EROFS}, syscall.EROFS},
		{fmt.Errorf("op: %w", context.Canceled), syscall.EINTR},
		{fmt.Errorf("x: %w", fs.ErrExist), syscall.EEXIST},
		{fmt.Errorf("x: %w", errors.ErrUnsupported), syscall.ENOTSUP},
		{errors.New("something odd"), syscall.EIO},
	} {
		if got := ToErrno(nil, "op", "p", tc.err); got != tc.want {
			t.Errorf("ToErrno(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
