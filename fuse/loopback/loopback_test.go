package loopback

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// rig drives a loopback tree through go-fuse's bridge, as the kernel would
// through a mount, but with no mount: every call is a FUSE request made
// in the test, so the unit lane covers the loopback with no /dev/fuse.
type rig struct {
	t    *testing.T
	raw  fuse.RawFileSystem
	dir  string
	tree *Root
}

func newRig(t *testing.T, opts Options) *rig {
	return newRigWith(t, opts, &gofs.Options{})
}

// newRigWith is newRig with go-fuse's options (the mount's timeouts).
func newRigWith(t *testing.T, opts Options, gopts *gofs.Options) *rig {
	t.Helper()
	dir := t.TempDir()
	root, err := New(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	raw := gofs.NewNodeFS(root, gopts)
	return &rig{t: t, raw: raw, dir: dir, tree: root.Tree()}
}

func (r *rig) hdr(node uint64) fuse.InHeader {
	return fuse.InHeader{NodeId: node, Caller: fuse.Caller{Owner: fuse.Owner{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())}, Pid: uint32(os.Getpid())}}
}

func (r *rig) lookup(parent uint64, name string) (fuse.EntryOut, syscall.Errno) {
	var out fuse.EntryOut
	st := r.raw.Lookup(nil, &fuse.InHeader{NodeId: parent, Caller: r.hdr(parent).Caller}, name, &out)
	return out, syscall.Errno(st)
}

func (r *rig) mustLookup(parent uint64, name string) fuse.EntryOut {
	r.t.Helper()
	out, en := r.lookup(parent, name)
	if en != 0 {
		r.t.Fatalf("lookup %s: %v", name, en)
	}
	return out
}

func (r *rig) create(parent uint64, name string, mode uint32) (node, fh uint64, en syscall.Errno) {
	var out fuse.CreateOut
	st := r.raw.Create(nil, &fuse.CreateIn{InHeader: r.hdr(parent), Flags: syscall.O_RDWR | syscall.O_CREAT | syscall.O_EXCL, Mode: mode}, name, &out)
	return out.NodeId, out.Fh, syscall.Errno(st)
}

func (r *rig) open(node uint64, flags uint32) (uint64, syscall.Errno) {
	var out fuse.OpenOut
	st := r.raw.Open(nil, &fuse.OpenIn{InHeader: r.hdr(node), Flags: flags}, &out)
	return out.Fh, syscall.Errno(st)
}

func (r *rig) write(node, fh uint64, off uint64, data string) syscall.Errno {
	_, st := r.raw.Write(nil, &fuse.WriteIn{InHeader: r.hdr(node), Fh: fh, Offset: off, Size: uint32(len(data))}, []byte(data))
	return syscall.Errno(st)
}

func (r *rig) read(node, fh uint64, size int) (string, syscall.Errno) {
	buf := make([]byte, size)
	res, st := r.raw.Read(nil, &fuse.ReadIn{InHeader: r.hdr(node), Fh: fh, Size: uint32(size)}, buf)
	if st != fuse.OK {
		return "", syscall.Errno(st)
	}
	b, _ := res.Bytes(buf)
	return string(b), 0
}

func (r *rig) release(node, fh uint64) {
	r.raw.Release(nil, &fuse.ReleaseIn{InHeader: r.hdr(node), Fh: fh})
}

func (r *rig) mkdir(parent uint64, name string) (uint64, syscall.Errno) {
	var out fuse.EntryOut
	st := r.raw.Mkdir(nil, &fuse.MkdirIn{InHeader: r.hdr(parent), Mode: 0o755}, name, &out)
	return out.NodeId, syscall.Errno(st)
}

func (r *rig) getattr(node uint64) (fuse.AttrOut, syscall.Errno) {
	var out fuse.AttrOut
	st := r.raw.GetAttr(nil, &fuse.GetAttrIn{InHeader: r.hdr(node)}, &out)
	return out, syscall.Errno(st)
}

func (r *rig) readdir(node uint64) []string {
	r.t.Helper()
	fh, _ := r.opendir(node)
	defer r.raw.ReleaseDir(&fuse.ReleaseIn{InHeader: r.hdr(node), Fh: fh})
	return r.readdirFh(node, fh)
}

func (r *rig) opendir(node uint64) (fh uint64, flags uint32) {
	r.t.Helper()
	var oo fuse.OpenOut
	if st := r.raw.OpenDir(nil, &fuse.OpenIn{InHeader: r.hdr(node)}, &oo); st != fuse.OK {
		r.t.Fatalf("opendir: %v", st)
	}
	return oo.Fh, oo.OpenFlags
}

// readdirFh lists the directory open as fh, "." and ".." left out.
func (r *rig) readdirFh(node, fh uint64) []string {
	r.t.Helper()
	oo := fuse.OpenOut{Fh: fh}
	var names []string
	off := uint64(0)
	for {
		buf := make([]byte, 4096)
		list := fuse.NewDirEntryList(buf, off)
		if st := r.raw.ReadDir(nil, &fuse.ReadIn{InHeader: r.hdr(node), Fh: oo.Fh, Offset: off, Size: uint32(len(buf))}, list); st != fuse.OK {
			r.t.Fatalf("readdir: %v", st)
		}
		data := list.Bytes()
		if len(data) == 0 {
			break
		}
		for len(data) > 0 {
			// struct fuse_dirent: ino, off, namelen, type, name (8-aligned).
			nameLen := int(uint32(data[16]) | uint32(data[17])<<8 | uint32(data[18])<<16 | uint32(data[19])<<24)
			name := string(data[24 : 24+nameLen])
			off = uint64(data[8]) | uint64(data[9])<<8 | uint64(data[10])<<16 | uint64(data[11])<<24 | uint64(data[12])<<32 | uint64(data[13])<<40 | uint64(data[14])<<48 | uint64(data[15])<<56
			if name != "." && name != ".." {
				names = append(names, name)
			}
			data = data[(24+nameLen+7)&^7:]
		}
	}
	slices.Sort(names)
	return names
}

// TestOps: the everyday calls act on the backing tree as a local file
// system would.
func TestOps(t *testing.T) {
	r := newRig(t, Options{})
	node, fh, en := r.create(1, "a.txt", 0o640)
	if en != 0 {
		t.Fatal(en)
	}
	if en := r.write(node, fh, 0, "hello, loopback"); en != 0 {
		t.Fatal(en)
	}
	if got, en := r.read(node, fh, 100); en != 0 || got != "hello, loopback" {
		t.Fatalf("read %q %v", got, en)
	}
	r.release(node, fh)
	if b, err := os.ReadFile(filepath.Join(r.dir, "a.txt")); err != nil || string(b) != "hello, loopback" {
		t.Fatalf("backing file %q %v", b, err)
	}
	a, en := r.getattr(node)
	if en != 0 || a.Size != 15 || a.Mode&0o777 != 0o640 || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		t.Fatalf("getattr %+v %v", a.Attr, en)
	}
	d, en := r.mkdir(1, "d")
	if en != 0 {
		t.Fatal(en)
	}
	if st := r.raw.Rename(nil, &fuse.RenameIn{InHeader: r.hdr(1), Newdir: d}, "a.txt", "b.txt"); st != fuse.OK {
		t.Fatalf("rename: %v", st)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "d", "b.txt")); err != nil {
		t.Fatal(err)
	}
	var so fuse.EntryOut
	if st := r.raw.Symlink(nil, r.ptr(1), "d/b.txt", "link", &so); st != fuse.OK {
		t.Fatalf("symlink: %v", st)
	}
	target, st := r.raw.Readlink(nil, r.ptr(so.NodeId))
	if st != fuse.OK || string(target) != "d/b.txt" {
		t.Fatalf("readlink %q %v", target, st)
	}
	var lo fuse.EntryOut
	if st := r.raw.Link(nil, &fuse.LinkIn{InHeader: r.hdr(d), Oldnodeid: node}, "hard", &lo); st != fuse.OK {
		t.Fatalf("link: %v", st)
	}
	if a, _ := r.getattr(node); a.Nlink != 2 {
		t.Errorf("nlink after link: %d", a.Nlink)
	}
	if got := r.readdir(1); !slices.Equal(got, []string{"d", "link"}) {
		t.Errorf("readdir / = %v", got)
	}
	if got := r.readdir(d); !slices.Equal(got, []string{"b.txt", "hard"}) {
		t.Errorf("readdir /d = %v", got)
	}
	if st := r.raw.Unlink(nil, r.ptr(d), "hard"); st != fuse.OK {
		t.Fatalf("unlink: %v", st)
	}
	if st := r.raw.Rmdir(nil, r.ptr(1), "d"); syscall.Errno(st) != syscall.ENOTEMPTY {
		t.Errorf("rmdir of a full directory: %v", st)
	}
	if _, en := r.lookup(1, "missing"); en != syscall.ENOENT {
		t.Errorf("lookup of a missing name: %v", en)
	}
	if _, _, en := r.create(1, "link", 0o644); en != syscall.EEXIST {
		t.Errorf("exclusive create over a symlink: %v", en)
	}
}

func (r *rig) ptr(node uint64) *fuse.InHeader {
	h := r.hdr(node)
	return &h
}

// TestNoFollow: a node holds its backing inode, not a path. A directory
// swapped for a symlink to elsewhere after its lookup is still the
// directory it was; a fresh lookup finds the symlink, which nothing is
// made through; nothing lands outside the tree.
func TestNoFollow(t *testing.T) {
	r := newRig(t, Options{})
	outside := t.TempDir()
	if err := os.Mkdir(filepath.Join(r.dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := r.mustLookup(1, "d").NodeId
	// The swap: d moves away and a symlink to outside takes its name.
	if err := os.Rename(filepath.Join(r.dir, "d"), filepath.Join(r.dir, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(r.dir, "d")); err != nil {
		t.Fatal(err)
	}
	if x, fh, en := r.create(d, "x", 0o644); en != 0 {
		t.Fatalf("create under the held directory: %v", en)
	} else {
		r.release(x, fh)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "moved", "x")); err != nil {
		t.Errorf("the create did not land in the directory the node holds: %v", err)
	}
	link := r.mustLookup(1, "d")
	if link.Attr.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		t.Fatalf("lookup of the swapped name: mode %o", link.Attr.Mode)
	}
	if _, _, en := r.create(link.NodeId, "y", 0o644); en == 0 {
		t.Error("a file was made through a symlink node")
	}
	if _, en := r.mkdir(link.NodeId, "z"); en == 0 {
		t.Error("a directory was made through a symlink node")
	}
	if _, en := r.open(link.NodeId, syscall.O_RDONLY); en == 0 {
		t.Error("a symlink node was opened (followed)")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("written outside the tree: %v", ents)
	}
}

// TestReadOnly: a read-only tree refuses every change with EROFS and
// still reads.
func TestReadOnly(t *testing.T) {
	r := newRig(t, Options{ReadOnly: true})
	os.WriteFile(filepath.Join(r.dir, "f"), []byte("data"), 0o644)
	f := r.mustLookup(1, "f").NodeId
	if _, _, en := r.create(1, "new", 0o644); en != syscall.EROFS {
		t.Errorf("create: %v", en)
	}
	if _, en := r.mkdir(1, "d"); en != syscall.EROFS {
		t.Errorf("mkdir: %v", en)
	}
	if st := r.raw.Unlink(nil, r.ptr(1), "f"); syscall.Errno(st) != syscall.EROFS {
		t.Errorf("unlink: %v", st)
	}
	if _, en := r.open(f, syscall.O_WRONLY); en != syscall.EROFS {
		t.Errorf("open for writing: %v", en)
	}
	var out fuse.AttrOut
	if st := r.raw.SetAttr(nil, &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: r.hdr(f), Valid: fuse.FATTR_SIZE, Size: 0}}, &out); syscall.Errno(st) != syscall.EROFS {
		t.Errorf("truncate: %v", st)
	}
	fh, en := r.open(f, syscall.O_RDONLY)
	if en != 0 {
		t.Fatal(en)
	}
	if got, _ := r.read(f, fh, 10); got != "data" {
		t.Errorf("read %q", got)
	}
	r.release(f, fh)
	if b, _ := os.ReadFile(filepath.Join(r.dir, "f")); string(b) != "data" {
		t.Errorf("backing file changed: %q", b)
	}
}

// TestTag: a tree's inode numbers carry its tag in bits 48-63, and the
// backing number below.
func TestTag(t *testing.T) {
	r := newRig(t, Options{Tag: 7})
	os.WriteFile(filepath.Join(r.dir, "f"), nil, 0o644)
	e := r.mustLookup(1, "f")
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(r.dir, "f"), &st); err != nil {
		t.Fatal(err)
	}
	if e.Attr.Ino>>48 != 7 || e.Attr.Ino&(1<<48-1) != st.Ino&(1<<48-1) {
		t.Errorf("ino %#x for backing %#x with tag 7", e.Attr.Ino, st.Ino)
	}
}

type shownFake struct{ add uint64 }

func (s shownFake) Show(ino, gen uint64, ctime unix.StatxTimestamp) (uint64, unix.StatxTimestamp) {
	return ino + s.add, unix.StatxTimestamp{Sec: 42}
}
func (s shownFake) DirIno(ino uint64) uint64 { return ino + s.add }

// TestShown: the stat data a Shown gives replaces the backing inode's
// number and ctime.
func TestShown(t *testing.T) {
	r := newRig(t, Options{Shown: shownFake{add: 1000}})
	os.WriteFile(filepath.Join(r.dir, "f"), nil, 0o644)
	e := r.mustLookup(1, "f")
	var st unix.Stat_t
	unix.Stat(filepath.Join(r.dir, "f"), &st)
	a, en := r.getattr(e.NodeId)
	if en != 0 || a.Ino != st.Ino+1000 || a.Ctime != 42 {
		t.Errorf("getattr ino %d ctime %d; backing ino %d", a.Ino, a.Ctime, st.Ino)
	}
}

// TestShared: in a tree others change too, a node whose file the host
// removed opens as ENOENT, as a lookup by name would.
func TestShared(t *testing.T) {
	r := newRig(t, Options{Shared: true})
	p := filepath.Join(r.dir, "f")
	os.WriteFile(p, []byte("x"), 0o644)
	f := r.mustLookup(1, "f").NodeId
	os.Remove(p)
	if _, en := r.open(f, syscall.O_RDONLY); en != syscall.ENOENT {
		t.Errorf("open of a removed file: %v", en)
	}
}

type wrapped struct{ *Node }

// TestWrap: every node below the root is made through Options.Wrap, so a
// user of the tree adds to its nodes with no type assertion.
func TestWrap(t *testing.T) {
	var made []*Node
	r := newRig(t, Options{Wrap: func(n *Node) gofs.InodeEmbedder { made = append(made, n); return &wrapped{n} }})
	os.Mkdir(filepath.Join(r.dir, "d"), 0o755)
	d := r.mustLookup(1, "d").NodeId
	if _, fh, en := r.create(d, "f", 0o644); en != 0 {
		t.Fatal(en)
	} else {
		_ = fh
	}
	if len(made) != 2 {
		t.Fatalf("Wrap made %d nodes, want 2", len(made))
	}
}

// TestShedKeepsNodes: past its descriptor budget the tree closes the least
// recently used backing descriptors and keeps those inodes by file handle,
// so every node the kernel knows still answers (nothing is evicted), a file
// open through the mount keeps its descriptor, and a node whose file was
// removed behind the tree answers ENOENT.
func TestShedKeepsNodes(t *testing.T) {
	r := newRig(t, Options{})
	if !r.tree.handles {
		t.Skip("file handles open again only with CAP_DAC_READ_SEARCH")
	}
	const budget, n = 64, 400
	r.tree.budget = budget
	nodes := make([]uint64, n)
	for i := range n {
		name := fmt.Sprint("f", i)
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		nodes[i] = r.mustLookup(1, name).NodeId
	}
	fh, en := r.open(nodes[0], syscall.O_RDONLY)
	if en != 0 {
		t.Fatal(en)
	}
	settled := func() {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); r.tree.Inodes() > budget; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d backing descriptors open, budget %d", r.tree.Inodes(), budget)
			}
		}
	}
	settled()
	if k := r.tree.Known(); k != n+1 {
		t.Fatalf("%d inodes known, want %d: nodes were dropped", k, n+1)
	}
	for i, node := range nodes {
		if _, en := r.getattr(node); en != 0 {
			t.Fatalf("getattr f%d: %v", i, en)
		}
		h, en := r.open(node, syscall.O_RDONLY)
		if en != 0 {
			t.Fatalf("open f%d: %v", i, en)
		}
		if got, en := r.read(node, h, 64); en != 0 || got != fmt.Sprint("f", i) {
			t.Fatalf("read f%d: %q %v", i, got, en)
		}
		r.release(node, h)
	}
	settled()
	// A file open through the mount is never shed.
	if got, en := r.read(nodes[0], fh, 64); en != 0 || got != "f0" {
		t.Fatalf("read the open f0: %q %v", got, en)
	}
	r.tree.shed(n)
	if r.tree.Inodes() < 2 {
		t.Fatalf("%d descriptors open: the root's and the open file's are kept", r.tree.Inodes())
	}
	r.release(nodes[0], fh)
	// Removed behind the tree while shed: ENOENT, as a lookup says.
	if err := os.Remove(filepath.Join(r.dir, "f7")); err != nil {
		t.Fatal(err)
	}
	if _, en := r.getattr(nodes[7]); en != syscall.ENOENT {
		t.Fatalf("getattr of a removed, shed file: %v, want ENOENT", en)
	}
}

// TestListingsKept: with CacheListings the kernel is told to keep a
// directory's listing across opens; a shared tree's are not kept. An open
// directory opens its backing directory only when first read (a kept
// listing is never read); one removed in between fails to list with
// ENOENT, as ext4's getdents of an open directory removed since does.
func TestListingsKept(t *testing.T) {
	const keep = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
	if _, fl := newRig(t, Options{CacheListings: true, Shared: false}).opendir(1); fl&keep != keep {
		t.Errorf("opendir flags %#x, want CACHE_DIR and KEEP_CACHE", fl)
	}
	if _, fl := newRig(t, Options{Shared: true}).opendir(1); fl&keep != 0 {
		t.Errorf("a shared tree's opendir flags %#x, want neither CACHE_DIR nor KEEP_CACHE", fl)
	}

	r := newRig(t, Options{CacheListings: true})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(r.dir, "d"), 0o755))
	for i := range 3 {
		must(os.WriteFile(filepath.Join(r.dir, "d", fmt.Sprint("f", i)), nil, 0o644))
	}
	d := r.mustLookup(1, "d").NodeId
	before := r.tree.Inodes()
	fh, _ := r.opendir(d)
	if n := r.tree.Inodes(); n != before {
		t.Errorf("opendir opened %d descriptors, want none until the first read", n-before)
	}
	if got := r.readdirFh(d, fh); !slices.Equal(got, []string{"f0", "f1", "f2"}) {
		t.Errorf("listing %v", got)
	}
	r.raw.ReleaseDir(&fuse.ReleaseIn{InHeader: r.hdr(d), Fh: fh})
	if n := r.tree.Inodes(); n != before {
		t.Errorf("%d descriptors left open by a released directory", n-before)
	}

	fh, _ = r.opendir(d)
	if r.tree.handles {
		r.tree.shed(1 << 20) // and the directory's descriptor shed
	}
	must(os.RemoveAll(filepath.Join(r.dir, "d")))
	list := fuse.NewDirEntryList(make([]byte, 4096), 0)
	if st := r.raw.ReadDir(nil, &fuse.ReadIn{InHeader: r.hdr(d), Fh: fh, Size: 4096}, list); st != fuse.Status(syscall.ENOENT) {
		t.Errorf("reading a directory removed while open: %v, want ENOENT", st)
	}
	r.raw.ReleaseDir(&fuse.ReleaseIn{InHeader: r.hdr(d), Fh: fh})
}

// TestMissKept: a name looked up and not found is kept by the kernel for
// the mount's negative timeout (a reply with no node), except in a shared
// tree, where others may make it at any moment (ENOENT, which the kernel
// does not keep).
func TestMissKept(t *testing.T) {
	hour := time.Hour
	for _, shared := range []bool{false, true} {
		r := newRigWith(t, Options{EntryTimeout: hour, AttrTimeout: hour, Shared: shared}, &gofs.Options{NegativeTimeout: &hour, EntryTimeout: &hour, AttrTimeout: &hour})
		out, en := r.lookup(1, ".gitignore")
		switch {
		case shared && en != syscall.ENOENT:
			t.Errorf("shared: a miss answers %v, want ENOENT", en)
		case !shared && (en != 0 || out.NodeId != 0 || out.EntryValid != 3600):
			t.Errorf("a miss answers %v, node %d, valid for %d s; want no error, no node, an hour", en, out.NodeId, out.EntryValid)
		}
	}
}
