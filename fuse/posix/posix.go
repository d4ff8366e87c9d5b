// Package posix holds what every provider of the FUSE tree does alike,
// whatever holds its files: the POSIX rules for modes, and dropping what
// the kernel caches of a subtree whose files changed behind it.
package posix

import "syscall"

// KillSuidgid is the mode a write, truncate or chown by an unprivileged
// caller leaves on a file: setuid cleared, and setgid cleared on a
// group-executable file (a setgid file without group execute is marked
// for mandatory locking and keeps it). Anything but a regular file keeps
// its mode.
func KillSuidgid(mode uint32) uint32 {
	if mode&syscall.S_IFMT != syscall.S_IFREG {
		return mode
	}
	kill := uint32(syscall.S_ISUID)
	if mode&syscall.S_IXGRP != 0 {
		kill |= syscall.S_ISGID
	}
	return mode &^ kill
}
