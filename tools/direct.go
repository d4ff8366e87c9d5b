package tools

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// A Direct tree is the tree a FUSE mount serves, which the daemon may
// reach without the mount: a tool call then runs on it, with no round
// trip through the kernel and back into the same daemon, and gives the
// same results as through the mount.
type Direct interface {
	// Root opens the tree's root (O_PATH), or says the calls must go
	// through the mount for now (while files or directories are still
	// to be fetched, which only the mount makes on first use).
	Root() (root *os.File, ok bool)
	// Serves reports whether the tree holds rel (relative to its root,
	// clean) as the mount shows it: not when the mount shows something
	// else there (a live mount's prefix, or beneath one), nor, with
	// subtree, when it does anywhere beneath rel.
	Serves(rel string, subtree bool) bool
	// Hold holds a checkpoint back while a call changes the tree, and
	// counts the change; release ends the hold.
	Hold() (release func())
	// Changed says that the entry at rel changed behind the mount: what
	// the kernel caches of it is dropped.
	Changed(rel string)
	// Writing reports whether the file fd (of the tree) is open for
	// writing through the mount, whose page cache may hold bytes the
	// file does not have yet: such a file is read and written through
	// the mount.
	Writing(fd int) bool
}

// ServeDirect lets calls run on d when it serves them as the mount would.
func (t *FS) ServeDirect(d Direct) { t.direct = d }

// treeCall is one call running on a Direct tree.
type treeCall struct {
	t       *FS
	root    *os.File
	subtree bool     // the call walks beneath its path (list_files, grep, delete)
	changed []string // entries the call may have changed, for Changed
	write   bool     // the call changes the tree
}

// errViaMount says that a call resolved a path the tree may not serve as
// the mount does: the call runs again, through the mount. It is returned
// before the call has changed anything on that path.
var errViaMount = &Error{Code: "EAGAIN", Message: "through the mount"}

// onTree runs the call on the Direct tree, if it can; done is false when
// the call must run through the mount instead.
func (t *FS) onTree(ctx context.Context, name string, args json.RawMessage) (out any, err error, done bool) {
	root, ok := t.direct.Root()
	if !ok {
		return nil, nil, false
	}
	defer root.Close()
	c := *t
	c.call = &treeCall{t: t, root: root, write: Mutates(name)}
	switch name {
	case "list_files", "grep", "delete":
		c.call.subtree = true
	}
	release := func() {}
	if c.call.write {
		release = t.direct.Hold()
	}
	out, err = c.dispatch(ctx, name, args)
	release()
	// After the hold: dropping the kernel's caches may wait on a request
	// of the mount that itself waits for a checkpoint to end.
	for _, rel := range c.call.changed {
		t.direct.Changed(rel)
	}
	var e *Error
	if errors.As(err, &e) && e == errViaMount {
		return nil, nil, false
	}
	return out, err, true
}

// open resolves r on the tree, literally: beneath the root, with no
// symlink followed (one would be resolved through the mount, where it
// means what the sandbox's shell makes of it), and only where the tree
// serves r as the mount does.
func (c *treeCall) open(r string, flags int, mode uint32) (int, *Error) {
	rel := path.Clean(r)
	if strings.HasPrefix(rel, "../") || rel == ".." || !c.t.direct.Serves(rel, c.subtree) {
		return -1, errViaMount
	}
	fd, err := openat2(int(c.root.Fd()), rel, flags, mode, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_MAGICLINKS)
	switch {
	case err == unix.ELOOP || err == unix.EXDEV:
		return -1, errViaMount // a symlink on the way: the mount resolves it
	case err != nil:
		return -1, c.t.resolveErr(r, err)
	}
	if flags&(unix.O_PATH|unix.O_DIRECTORY) == 0 && c.t.direct.Writing(fd) {
		unix.Close(fd)
		return -1, errViaMount
	}
	if c.write && flags&(unix.O_WRONLY|unix.O_RDWR) != 0 {
		c.changed = append(c.changed, rel)
	}
	return fd, nil
}

// entry notes that the call resolves the entry name of the directory
// dir (relative, clean) to make, replace or remove it; false if the tree
// does not serve it as the mount does.
func (c *treeCall) entry(dir, name string) bool {
	rel := path.Join(dir, name)
	if !c.t.direct.Serves(rel, true) {
		return false
	}
	if c.write {
		c.changed = append(c.changed, rel)
	}
	return true
}
