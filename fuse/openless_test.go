package fuse

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/amlfs/amlfs/fuse/loopback"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestOpenless: OPENDIR answers ENOSYS (the kernel then sends none, and
// keeps listings), and what the kernel sends on a directory after that,
// with file handle 0, is served whole: a listing read in small pieces at
// the offsets the kernel gives (each piece a fresh handle), with and
// without attributes, and an fsync.
func TestOpenless(t *testing.T) {
	dir := t.TempDir()
	var want []string
	for i := range 300 {
		name := fmt.Sprintf("%s-%03d", strings.Repeat("n", 40), i)
		want = append(want, name)
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root, err := loopback.New(dir, loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	raw := &openless{RawFileSystem: gofs.NewNodeFS(root, &gofs.Options{})}
	hdr := fuse.InHeader{NodeId: 1, Caller: fuse.Caller{Owner: fuse.Owner{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())}}}

	var oo fuse.OpenOut
	if st := raw.OpenDir(nil, &fuse.OpenIn{InHeader: hdr}, &oo); st != fuse.ENOSYS {
		t.Fatalf("opendir: %v, want ENOSYS", st)
	}
	fds := func() int { des, _ := os.ReadDir("/proc/self/fd"); return len(des) }
	before := fds()
	for _, plus := range []bool{false, true} {
		var got []string
		off := uint64(0)
		for {
			buf := make([]byte, 1024)
			list := fuse.NewDirEntryList(buf, off)
			in := &fuse.ReadIn{InHeader: hdr, Fh: 0, Offset: off, Size: uint32(len(buf))}
			var st fuse.Status
			if plus {
				st = raw.ReadDirPlus(nil, in, list)
			} else {
				st = raw.ReadDir(nil, in, list)
			}
			if st != fuse.OK {
				t.Fatalf("readdir (plus %v) at %d: %v", plus, off, st)
			}
			data := list.Bytes()
			if len(data) == 0 {
				break
			}
			for len(data) > 0 {
				// fuse_direntplus: a fuse_entry_out (128 bytes), then the
				// fuse_dirent: ino, off, namelen, type, name (8-aligned).
				if plus {
					data = data[128:]
				}
				n := int(uint32(data[16]) | uint32(data[17])<<8 | uint32(data[18])<<16 | uint32(data[19])<<24)
				name := string(data[24 : 24+n])
				off = 0
				for i := 7; i >= 0; i-- {
					off = off<<8 | uint64(data[8+i])
				}
				if name != "." && name != ".." {
					got = append(got, name)
				}
				data = data[(24+n+7)&^7:]
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("plus %v: listed %d names, want %d, each once", plus, len(got), len(want))
		}
		if n := fds(); !plus && n != before {
			t.Errorf("%d descriptors left open: the handles openless opened were not all released", n-before)
		}
	}
	if st := raw.FsyncDir(nil, &fuse.FsyncIn{InHeader: hdr}); st != fuse.OK {
		t.Errorf("fsyncdir with no handle: %v", st)
	}
}
