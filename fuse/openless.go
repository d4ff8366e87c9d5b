package fuse

import (
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// openless answers OPENDIR with ENOSYS. The kernel then sends no OPENDIR
// or RELEASEDIR for the rest of the mount, and keeps every listing it
// reads in the directory's page cache across opens, as if each open had
// said FOPEN_CACHE_DIR and FOPEN_KEEP_CACHE: a warm walk (git status at
// every agent step) asks the daemon nothing, where it made two round trips
// per directory. The kernel drops a listing when a change through the
// mount touches the directory, or when the daemon invalidates it (FS.
// Changed); only a tree that no one else changes may be served so.
//
// Requests on a directory then carry file handle 0, which go-fuse's node
// layer reserves. openless serves each with a handle of its own, opened
// and released around it: READDIR and READDIRPLUS (only to fill a cache,
// at offset 0, or past its end) and FSYNCDIR.
type openless struct {
	fuse.RawFileSystem
}

func (o *openless) OpenDir(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return fuse.ENOSYS
}

// withDir runs fn with a handle of the directory in h, opened for it.
func (o *openless) withDir(cancel <-chan struct{}, h *fuse.InHeader, fn func(fh uint64) fuse.Status) fuse.Status {
	in := fuse.OpenIn{InHeader: *h, Flags: syscall.O_RDONLY | syscall.O_DIRECTORY}
	var out fuse.OpenOut
	if st := o.RawFileSystem.OpenDir(cancel, &in, &out); !st.Ok() {
		return st
	}
	defer o.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: *h, Fh: out.Fh})
	return fn(out.Fh)
}

func (o *openless) ReadDir(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return o.read(cancel, input, out, o.RawFileSystem.ReadDir)
}

func (o *openless) ReadDirPlus(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return o.read(cancel, input, out, o.RawFileSystem.ReadDirPlus)
}

// read serves a READDIR or READDIRPLUS: on handle 0, with a handle of its
// own.
func (o *openless) read(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList,
	read func(<-chan struct{}, *fuse.ReadIn, *fuse.DirEntryList) fuse.Status) fuse.Status {
	if input.Fh != 0 {
		return read(cancel, input, out)
	}
	return o.withDir(cancel, &input.InHeader, func(fh uint64) fuse.Status {
		in := *input
		in.Fh = fh
		return read(cancel, &in, out)
	})
}

func (o *openless) FsyncDir(cancel <-chan struct{}, input *fuse.FsyncIn) fuse.Status {
	if input.Fh != 0 {
		return o.RawFileSystem.FsyncDir(cancel, input)
	}
	return o.withDir(cancel, &input.InHeader, func(fh uint64) fuse.Status {
		in := *input
		in.Fh = fh
		return o.RawFileSystem.FsyncDir(cancel, &in)
	})
}

// ReleaseDir never comes (no directory is opened through the kernel); one
// for handle 0 would name go-fuse's reserved handle.
func (o *openless) ReleaseDir(input *fuse.ReleaseIn) {
	if input.Fh != 0 {
		o.RawFileSystem.ReleaseDir(input)
	}
}
