package mount

import (
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/fuse"
)

// treeDirect lets tool calls run on the working tree the FUSE mount
// serves (tools.Direct), instead of through the kernel and back into this
// daemon. The tree serves a path as the mount does once nothing is left
// to fetch or populate (until then only the mount makes files and
// directories on first use), and wherever no live mount is grafted.
type treeDirect struct {
	d  *Daemon
	fs *fuse.FS
}

// Root opens the working tree's root, while nothing is lazy any more.
func (t treeDirect) Root() (*os.File, bool) {
	d := t.d
	if d.ws == nil || d.ws.Placeholders().Active() {
		return nil, false
	}
	fd, err := unix.Open(d.workDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	return os.NewFile(uintptr(fd), d.workDir), true
}

// Serves is false at or beneath a live mount's prefix, and with subtree
// above one too.
func (t treeDirect) Serves(rel string, subtree bool) bool {
	for _, m := range t.d.cfg.Live {
		p := m.Rel()
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return false
		}
		if subtree && (rel == "." || strings.HasPrefix(p, rel+"/")) {
			return false
		}
	}
	return true
}

func (t treeDirect) Hold() func() { return t.fs.Hold() }

func (t treeDirect) Changed(rel string) { t.fs.Changed(path.Clean(rel)) }

func (t treeDirect) Writing(fd int) bool { return t.fs.Writing(fd) }
