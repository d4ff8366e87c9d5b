// Package posix holds the POSIX rules that every provider applies alike,
// whatever holds its files.
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
