package integration

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// gateFS is a loopback FUSE mount, served by the test, that can hold one
// operation on a name until released: the file-store counterpart of the
// fault proxy's stall. A daemon whose store lives on it can be held at
// any step of a save, then killed there.
type gateFS struct {
	dir string // the mountpoint

	mu      sync.Mutex
	arm     func(op, name string) bool // GUARDED_BY(mu); nil: pass everything
	held    chan string
	release chan struct{}
}

func mountGateFS(t *testing.T) *gateFS {
	t.Helper()
	back, mp := t.TempDir(), filepath.Join(t.TempDir(), "store")
	os.Mkdir(mp, 0o755)
	g := &gateFS{dir: mp, held: make(chan string, 1), release: make(chan struct{})}
	root, err := gofs.NewLoopbackRoot(back)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gofs.Mount(mp, &gateNode{LoopbackNode: root.(*gofs.LoopbackNode), g: g}, &gofs.Options{
		MountOptions: fuse.MountOptions{DirectMount: true, FsName: "gatefs"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.set(nil)
		if err := srv.Unmount(); err != nil {
			syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	})
	return g
}

// set arms the gate: the first operation arm accepts is held. It releases
// an operation held before.
func (g *gateFS) set(arm func(op, name string) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.arm = arm
	close(g.release)
	g.release = make(chan struct{})
}

func (g *gateFS) pass(op, name string) {
	g.mu.Lock()
	arm, release := g.arm, g.release
	if arm == nil || !arm(op, name) {
		g.mu.Unlock()
		return
	}
	g.arm = nil // hold one operation only
	g.mu.Unlock()
	g.held <- op + " " + name
	<-release
}

// waitHeld waits for the gate to hold an operation.
func (g *gateFS) waitHeld(t *testing.T) string {
	t.Helper()
	select {
	case op := <-g.held:
		return op
	case <-time.After(60 * time.Second):
		t.Fatal("no operation was held")
		return ""
	}
}

type gateNode struct {
	*gofs.LoopbackNode
	g *gateFS
}

var _ = (gofs.NodeWrapChilder)((*gateNode)(nil))

func (n *gateNode) WrapChild(ctx context.Context, ops gofs.InodeEmbedder) gofs.InodeEmbedder {
	return &gateNode{LoopbackNode: ops.(*gofs.LoopbackNode), g: n.g}
}

func (n *gateNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	n.g.pass("create", name)
	return n.LoopbackNode.Create(ctx, name, flags, mode, out)
}

func (n *gateNode) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	n.g.pass("link", name)
	if t, ok := target.(*gateNode); ok {
		target = t.LoopbackNode
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

func (n *gateNode) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	n.g.pass("rename", newName)
	if p, ok := newParent.(*gateNode); ok {
		newParent = p.LoopbackNode
	}
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

func (n *gateNode) Unlink(ctx context.Context, name string) syscall.Errno {
	n.g.pass("unlink", name)
	return n.LoopbackNode.Unlink(ctx, name)
}
