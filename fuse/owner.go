package fuse

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// ownerOptions are libfuse's uid=, gid= and umask= mount options: every
// file shows the given owner, group, and permission bits less umask. The
// files themselves keep theirs. The kernel never sees these options.
type ownerOptions struct {
	uid, gid *uint32
	umask    uint32
}

func (o ownerOptions) set() bool { return o.uid != nil || o.gid != nil || o.umask != 0 }

// parse takes opt if it is one of the owner options.
func (o *ownerOptions) parse(opt string) (bool, error) {
	k, v, ok := strings.Cut(opt, "=")
	if !ok || (k != "uid" && k != "gid" && k != "umask") {
		return false, nil
	}
	base := 10
	if k == "umask" {
		base = 8
	}
	n, err := strconv.ParseUint(v, base, 32)
	if err != nil || (k == "umask" && n > 0o7777) {
		return true, fmt.Errorf("bad mount option %q", opt)
	}
	u := uint32(n)
	switch k {
	case "uid":
		o.uid = &u
	case "gid":
		o.gid = &u
	default:
		o.umask = u
	}
	return true, nil
}

func (o ownerOptions) attr(a *fuse.Attr) {
	if o.uid != nil {
		a.Uid = *o.uid
	}
	if o.gid != nil {
		a.Gid = *o.gid
	}
	a.Mode &^= o.umask
}

// owned applies ownerOptions to every attribute the daemon replies with.
// READDIRPLUS is turned off with it (its replies are packed entries), so
// the kernel looks each entry up instead.
type owned struct {
	fuse.RawFileSystem
	o ownerOptions
}

func (w *owned) entry(out *fuse.EntryOut, st fuse.Status) fuse.Status {
	if st == fuse.OK {
		w.o.attr(&out.Attr)
	}
	return st
}

func (w *owned) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	return w.entry(out, w.RawFileSystem.Lookup(cancel, header, name, out))
}

func (w *owned) GetAttr(cancel <-chan struct{}, input *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := w.RawFileSystem.GetAttr(cancel, input, out)
	if st == fuse.OK {
		w.o.attr(&out.Attr)
	}
	return st
}

func (w *owned) SetAttr(cancel <-chan struct{}, input *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := w.RawFileSystem.SetAttr(cancel, input, out)
	if st == fuse.OK {
		w.o.attr(&out.Attr)
	}
	return st
}

func (w *owned) Mknod(cancel <-chan struct{}, input *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	return w.entry(out, w.RawFileSystem.Mknod(cancel, input, name, out))
}

func (w *owned) Mkdir(cancel <-chan struct{}, input *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	return w.entry(out, w.RawFileSystem.Mkdir(cancel, input, name, out))
}

func (w *owned) Link(cancel <-chan struct{}, input *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	return w.entry(out, w.RawFileSystem.Link(cancel, input, name, out))
}

func (w *owned) Symlink(cancel <-chan struct{}, header *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	return w.entry(out, w.RawFileSystem.Symlink(cancel, header, target, name, out))
}

func (w *owned) Create(cancel <-chan struct{}, input *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	return w.entry(&out.EntryOut, w.RawFileSystem.Create(cancel, input, name, out))
}

func (w *owned) Tmpfile(cancel <-chan struct{}, input *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	return w.entry(&out.EntryOut, w.RawFileSystem.Tmpfile(cancel, input, out))
}

func (w *owned) Statx(cancel <-chan struct{}, input *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	st := w.RawFileSystem.Statx(cancel, input, out)
	if st == fuse.OK {
		if w.o.uid != nil {
			out.Uid = *w.o.uid
		}
		if w.o.gid != nil {
			out.Gid = *w.o.gid
		}
		out.Mode &^= uint16(w.o.umask)
	}
	return st
}

// CheckOwnerOptions validates the uid=, gid= and umask= options among
// opts, so that a bad one is refused before anything is locked or
// restored.
func CheckOwnerOptions(opts []string) error {
	var o ownerOptions
	for _, opt := range opts {
		if _, err := o.parse(opt); err != nil {
			return err
		}
	}
	return nil
}
