package posix

import (
	"syscall"
	"testing"
)

func TestKillSuidgid(t *testing.T) {
	for _, tc := range []struct{ in, want uint32 }{
		{syscall.S_IFREG | 0o6755, syscall.S_IFREG | 0o755},
		{syscall.S_IFREG | 0o6745, syscall.S_IFREG | 0o2745}, // no group execute: setgid stays
		{syscall.S_IFREG | 0o4700, syscall.S_IFREG | 0o700},
		{syscall.S_IFREG | 0o1777, syscall.S_IFREG | 0o1777},
		{syscall.S_IFDIR | 0o2775, syscall.S_IFDIR | 0o2775},
		{syscall.S_IFREG | 0o644, syscall.S_IFREG | 0o644},
	} {
		if got := KillSuidgid(tc.in); got != tc.want {
			t.Errorf("KillSuidgid(%o) = %o, want %o", tc.in, got, tc.want)
		}
	}
}
