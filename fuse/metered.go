package fuse

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// OpObserver is told of every FUSE request served: its name (lookup,
// getattr, write, ...), when it started, and its status.
type OpObserver interface {
	Observe(op string, start time.Time, status fuse.Status)
}

// metered times every FUSE request the daemon serves and reports it to
// obs. Reads and writes that the kernel passes straight to a backing file
// (passthrough) never reach the daemon, and are not counted. It overrides
// every method of go-fuse's fuse.RawFileSystem; one that go-fuse adds later
// passes through the embedded interface, untimed, until it is added here.
type metered struct {
	fuse.RawFileSystem
	obs OpObserver
}

func (m *metered) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("lookup", start, r0) }()
	return m.RawFileSystem.Lookup(cancel, header, name, out)
}

func (m *metered) Forget(nodeid uint64, nlookup uint64) {
	defer m.obs.Observe("forget", time.Now(), fuse.OK)
	m.RawFileSystem.Forget(nodeid, nlookup)
}

func (m *metered) GetAttr(cancel <-chan struct{}, input *fuse.GetAttrIn, out *fuse.AttrOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("getattr", start, r0) }()
	return m.RawFileSystem.GetAttr(cancel, input, out)
}

func (m *metered) SetAttr(cancel <-chan struct{}, input *fuse.SetAttrIn, out *fuse.AttrOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("setattr", start, r0) }()
	return m.RawFileSystem.SetAttr(cancel, input, out)
}

func (m *metered) Mknod(cancel <-chan struct{}, input *fuse.MknodIn, name string, out *fuse.EntryOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("mknod", start, r0) }()
	return m.RawFileSystem.Mknod(cancel, input, name, out)
}

func (m *metered) Mkdir(cancel <-chan struct{}, input *fuse.MkdirIn, name string, out *fuse.EntryOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("mkdir", start, r0) }()
	return m.RawFileSystem.Mkdir(cancel, input, name, out)
}

func (m *metered) Unlink(cancel <-chan struct{}, header *fuse.InHeader, name string) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("unlink", start, r0) }()
	return m.RawFileSystem.Unlink(cancel, header, name)
}

func (m *metered) Rmdir(cancel <-chan struct{}, header *fuse.InHeader, name string) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("rmdir", start, r0) }()
	return m.RawFileSystem.Rmdir(cancel, header, name)
}

func (m *metered) Rename(cancel <-chan struct{}, input *fuse.RenameIn, oldName string, newName string) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("rename", start, r0) }()
	return m.RawFileSystem.Rename(cancel, input, oldName, newName)
}

func (m *metered) Link(cancel <-chan struct{}, input *fuse.LinkIn, filename string, out *fuse.EntryOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("link", start, r0) }()
	return m.RawFileSystem.Link(cancel, input, filename, out)
}

func (m *metered) Symlink(cancel <-chan struct{}, header *fuse.InHeader, pointedTo string, linkName string, out *fuse.EntryOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("symlink", start, r0) }()
	return m.RawFileSystem.Symlink(cancel, header, pointedTo, linkName, out)
}

func (m *metered) Readlink(cancel <-chan struct{}, header *fuse.InHeader) (r0 []byte, r1 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("readlink", start, r1) }()
	return m.RawFileSystem.Readlink(cancel, header)
}

func (m *metered) Access(cancel <-chan struct{}, input *fuse.AccessIn) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("access", start, r0) }()
	return m.RawFileSystem.Access(cancel, input)
}

func (m *metered) GetXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string, dest []byte) (r0 uint32, r1 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("getxattr", start, r1) }()
	return m.RawFileSystem.GetXAttr(cancel, header, attr, dest)
}

func (m *metered) ListXAttr(cancel <-chan struct{}, header *fuse.InHeader, dest []byte) (r0 uint32, r1 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("listxattr", start, r1) }()
	return m.RawFileSystem.ListXAttr(cancel, header, dest)
}

func (m *metered) SetXAttr(cancel <-chan struct{}, input *fuse.SetXAttrIn, attr string, data []byte) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("setxattr", start, r0) }()
	return m.RawFileSystem.SetXAttr(cancel, input, attr, data)
}

func (m *metered) RemoveXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("removexattr", start, r0) }()
	return m.RawFileSystem.RemoveXAttr(cancel, header, attr)
}

func (m *metered) Create(cancel <-chan struct{}, input *fuse.CreateIn, name string, out *fuse.CreateOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("create", start, r0) }()
	return m.RawFileSystem.Create(cancel, input, name, out)
}

func (m *metered) Tmpfile(cancel <-chan struct{}, input *fuse.CreateIn, out *fuse.CreateOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("tmpfile", start, r0) }()
	return m.RawFileSystem.Tmpfile(cancel, input, out)
}

func (m *metered) Open(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("open", start, r0) }()
	return m.RawFileSystem.Open(cancel, input, out)
}

func (m *metered) Read(cancel <-chan struct{}, input *fuse.ReadIn, buf []byte) (r0 fuse.ReadResult, r1 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("read", start, r1) }()
	return m.RawFileSystem.Read(cancel, input, buf)
}

func (m *metered) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("lseek", start, r0) }()
	return m.RawFileSystem.Lseek(cancel, in, out)
}

func (m *metered) GetLk(cancel <-chan struct{}, input *fuse.LkIn, out *fuse.LkOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("getlk", start, r0) }()
	return m.RawFileSystem.GetLk(cancel, input, out)
}

func (m *metered) SetLk(cancel <-chan struct{}, input *fuse.LkIn) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("setlk", start, r0) }()
	return m.RawFileSystem.SetLk(cancel, input)
}

func (m *metered) SetLkw(cancel <-chan struct{}, input *fuse.LkIn) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("setlkw", start, r0) }()
	return m.RawFileSystem.SetLkw(cancel, input)
}

func (m *metered) Release(cancel <-chan struct{}, input *fuse.ReleaseIn) {
	defer m.obs.Observe("release", time.Now(), fuse.OK)
	m.RawFileSystem.Release(cancel, input)
}

func (m *metered) Write(cancel <-chan struct{}, input *fuse.WriteIn, data []byte) (r0 uint32, r1 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("write", start, r1) }()
	return m.RawFileSystem.Write(cancel, input, data)
}

func (m *metered) Writev(cancel <-chan struct{}, input *fuse.WriteIn, data [][]byte) (r0 uint32, r1 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("writev", start, r1) }()
	return m.RawFileSystem.Writev(cancel, input, data)
}

func (m *metered) CopyFileRange(cancel <-chan struct{}, input *fuse.CopyFileRangeIn) (r0 uint32, r1 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("copyfilerange", start, r1) }()
	return m.RawFileSystem.CopyFileRange(cancel, input)
}

func (m *metered) Ioctl(cancel <-chan struct{}, input *fuse.IoctlIn, inbuf []byte, output *fuse.IoctlOut, outbuf []byte) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("ioctl", start, r0) }()
	return m.RawFileSystem.Ioctl(cancel, input, inbuf, output, outbuf)
}

func (m *metered) Flush(cancel <-chan struct{}, input *fuse.FlushIn) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("flush", start, r0) }()
	return m.RawFileSystem.Flush(cancel, input)
}

func (m *metered) Fsync(cancel <-chan struct{}, input *fuse.FsyncIn) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("fsync", start, r0) }()
	return m.RawFileSystem.Fsync(cancel, input)
}

func (m *metered) Fallocate(cancel <-chan struct{}, input *fuse.FallocateIn) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("fallocate", start, r0) }()
	return m.RawFileSystem.Fallocate(cancel, input)
}

func (m *metered) OpenDir(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("opendir", start, r0) }()
	return m.RawFileSystem.OpenDir(cancel, input, out)
}

func (m *metered) ReadDir(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("readdir", start, r0) }()
	return m.RawFileSystem.ReadDir(cancel, input, out)
}

func (m *metered) ReadDirPlus(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("readdirplus", start, r0) }()
	return m.RawFileSystem.ReadDirPlus(cancel, input, out)
}

func (m *metered) ReleaseDir(input *fuse.ReleaseIn) {
	defer m.obs.Observe("releasedir", time.Now(), fuse.OK)
	m.RawFileSystem.ReleaseDir(input)
}

func (m *metered) FsyncDir(cancel <-chan struct{}, input *fuse.FsyncIn) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("fsyncdir", start, r0) }()
	return m.RawFileSystem.FsyncDir(cancel, input)
}

func (m *metered) StatFs(cancel <-chan struct{}, input *fuse.InHeader, out *fuse.StatfsOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("statfs", start, r0) }()
	return m.RawFileSystem.StatFs(cancel, input, out)
}

func (m *metered) Statx(cancel <-chan struct{}, input *fuse.StatxIn, out *fuse.StatxOut) (r0 fuse.Status) {
	start := time.Now()
	defer func() { m.obs.Observe("statx", start, r0) }()
	return m.RawFileSystem.Statx(cancel, input, out)
}
