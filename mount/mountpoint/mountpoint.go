// Package mountpoint resolves a mountpoint once, as a descriptor, and
// knows the mount made on it by descriptor and mount id from then on.
//
// A root daemon must never be redirected by a path another user can
// change. So the mountpoint is walked one component at a time, from /,
// with no symlink followed (openat2 RESOLVE_NO_SYMLINKS), and each parent
// is checked: one that another user could rename or replace is refused
// unless the caller allows it. The mount is made on the descriptor
// (fsmount or open_tree, then move_mount), never on the path, and is
// then held by a descriptor of its root and known by its mount id: the
// daemon's tools, its unmount and its check for an external unmount all
// go through these, so renaming or swapping a parent of the mountpoint
// afterwards changes nothing the daemon does.
package mountpoint

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Policy says what a mountpoint may be.
type Policy struct {
	// AllowUserOwnedParents accepts parents that another user could
	// rename or replace (the mount is still made on the descriptor, and
	// no symlink is followed).
	AllowUserOwnedParents bool
	// Create makes the mountpoint, and any parent of it that is
	// missing (0755, each in the directory held open above it, so no
	// symlink is followed on the way).
	Create bool
}

// Error is a mountpoint refused by the policy or by its shape (a
// symlink, not a directory). Callers map it to INVALID_CONFIG.
type Error struct {
	Path string // the component at fault
	Msg  string
}

func (e *Error) Error() string { return e.Path + ": " + e.Msg }

// Dir is a mountpoint resolved once: the directory and its parent, held
// by O_PATH descriptors.
type Dir struct {
	path   string
	parent *os.File // the parent directory
	name   string   // the mountpoint's name in parent
	dir    *os.File // the directory itself, as it was before any mount
}

// Open resolves path (absolute) under policy p.
func Open(path string, p Policy) (*Dir, error) {
	if !filepath.IsAbs(path) {
		return nil, &Error{Path: path, Msg: "the mountpoint must be an absolute path"}
	}
	path = filepath.Clean(path)
	if path == "/" {
		return nil, &Error{Path: path, Msg: "cannot mount over /"}
	}
	euid := os.Geteuid()
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: "/", Err: err}
	}
	cur := os.NewFile(uintptr(fd), "/")
	comps := strings.Split(strings.TrimPrefix(path, "/"), "/")
	at := "/"
	for i, c := range comps {
		last := i == len(comps)-1
		next := filepath.Join(at, c)
		cfd, err := openComponent(int(cur.Fd()), c)
		if errors.Is(err, unix.ENOENT) && p.Create {
			if err := unix.Mkdirat(int(cur.Fd()), c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				cur.Close()
				return nil, &os.PathError{Op: "mkdir", Path: next, Err: err}
			}
			cfd, err = openComponent(int(cur.Fd()), c)
		}
		if err != nil {
			cur.Close()
			switch {
			case errors.Is(err, unix.ELOOP):
				return nil, &Error{Path: next, Msg: "is a symbolic link; amlfs follows none in a mountpoint, since whoever may change the link could point the mount elsewhere: give the real path"}
			case errors.Is(err, unix.ENOTDIR):
				return nil, &Error{Path: next, Msg: "is not a directory"}
			}
			return nil, &os.PathError{Op: "open", Path: next, Err: err}
		}
		child := os.NewFile(uintptr(cfd), next)
		if !p.AllowUserOwnedParents {
			if err := checkParent(cur, at, child, euid); err != nil {
				cur.Close()
				child.Close()
				return nil, err
			}
		}
		if last {
			return &Dir{path: path, parent: cur, name: c, dir: child}, nil
		}
		cur.Close()
		cur, at = child, next
	}
	panic("unreachable")
}

func openComponent(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_BENEATH})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// checkParent refuses a parent (at, open as parent) in which a user other
// than root or euid could rename or replace the entry child: one it
// belongs to, or one that others may write, unless it is sticky and
// child is root's or euid's (as under /tmp).
func checkParent(parent *os.File, at string, child *os.File, euid int) error {
	var pst, cst unix.Stat_t
	if err := unix.Fstat(int(parent.Fd()), &pst); err != nil {
		return &os.PathError{Op: "stat", Path: at, Err: err}
	}
	var cx unix.Statx_t
	if err := unix.Statx(int(child.Fd()), "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_UID, &cx); err == nil {
		cst.Uid = cx.Uid
	} else {
		cst.Uid = ^uint32(0) // unknown (a dead mount's root): not trusted
	}
	trusted := func(uid uint32) bool { return uid == 0 || int(uid) == euid }
	const hint = "; choose a mountpoint whose parents only root (or this user) can change, or pass --allow-user-owned-parents if that user is trusted"
	if !trusted(pst.Uid) {
		return &Error{Path: at, Msg: fmt.Sprintf("a parent of the mountpoint belongs to uid %d, who could rename or replace what is in it%s", pst.Uid, hint)}
	}
	if pst.Mode&0o022 != 0 && !(pst.Mode&unix.S_ISVTX != 0 && trusted(cst.Uid)) {
		return &Error{Path: at, Msg: fmt.Sprintf("a parent of the mountpoint is writable by other users (mode %04o), who could rename or replace what is in it%s", pst.Mode&0o7777, hint)}
	}
	return nil
}

// Path is the mountpoint's path, as resolved.
func (d *Dir) Path() string { return d.path }

// Target is the path through which mount(2) and other path-taking calls
// reach the resolved directory itself (a magic link to its descriptor),
// for as long as d is open.
func (d *Dir) Target() string { return fdPath(d.dir) }

// Close closes the descriptors.
func (d *Dir) Close() {
	d.parent.Close()
	d.dir.Close()
}

func fdPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }

// Top opens what is at the mountpoint now: the root of the topmost mount
// on it, or the directory itself. A symlink put there is refused.
func (d *Dir) Top() (*os.File, error) {
	fd, err := openComponent(int(d.parent.Fd()), d.name)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: d.path, Err: err}
	}
	return os.NewFile(uintptr(fd), d.path), nil
}

// IsMounted reports whether something is mounted on the directory.
func (d *Dir) IsMounted() (bool, error) {
	top, err := d.Top()
	if err != nil {
		return false, err
	}
	defer top.Close()
	return isMountRoot(top)
}

// Detach lazily detaches the topmost mount on the directory (a dead mount
// a crashed daemon left).
func (d *Dir) Detach() error {
	top, err := d.Top()
	if err != nil {
		return err
	}
	defer top.Close()
	if ok, err := isMountRoot(top); err != nil || !ok {
		return err
	}
	return umount(fdPath(top), unix.MNT_DETACH, d.path)
}

// isMountRoot reports whether f is the root of a mount.
func isMountRoot(f *os.File) (bool, error) {
	_, _, ok, err := mountAt(int(f.Fd()), "")
	if err != nil {
		return false, &os.PathError{Op: "statx", Path: f.Name(), Err: err}
	}
	return ok, nil
}

// mountAt says which mount name in dirfd ("" for dirfd itself) belongs
// to, by id and device (major:minor), and whether it is that mount's
// root. It follows no symlink and asks no file system to sync.
func mountAt(dirfd int, name string) (id uint64, dev string, root bool, err error) {
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_STATX_DONT_SYNC
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	var st unix.Statx_t
	if err := unix.Statx(dirfd, name, flags, unix.STATX_MNT_ID, &st); err != nil {
		return 0, "", false, err
	}
	root = st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	return st.Mnt_id, fmt.Sprintf("%d:%d", st.Dev_major, st.Dev_minor), root, nil
}

// isMount reports whether name in dirfd ("" for dirfd itself) is the
// root of the mount with id.
func isMount(dirfd int, name string, id uint64) bool {
	got, _, root, err := mountAt(dirfd, name)
	return err == nil && root && got == id
}

// RootID is the id of the mount whose root is open as f, or 0 if f is no
// mount's root.
func RootID(f *os.File) uint64 {
	id, _, root, err := mountAt(int(f.Fd()), "")
	if err != nil || !root {
		return 0
	}
	return id
}

// Empty returns a name in the directory if it holds any (as it is, under
// no mount), or "".
func (d *Dir) Empty() (string, error) {
	fd, err := unix.Openat(int(d.dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", &os.PathError{Op: "open", Path: d.path, Err: err}
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	names, _ := f.Readdirnames(1)
	if len(names) > 0 {
		return names[0], nil
	}
	return "", nil
}

// Beneath resolves rel below the mount m with no symlink followed and no
// ".." leaving it: a mountpoint inside another mount (a live mount inside
// a natively served workspace).
func (m *Mount) Beneath(rel string) (*Dir, error) {
	rel = filepath.Clean(rel)
	dir, name := filepath.Split(rel)
	root, err := m.Root()
	if err != nil {
		return nil, err
	}
	defer root.Close()
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_BENEATH}
	pfd, err := unix.Openat2(int(root.Fd()), "./"+dir, how)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(m.at.path, dir), Err: err}
	}
	p := filepath.Join(m.at.path, rel)
	cfd, err := unix.Openat2(pfd, name, how)
	if err != nil {
		unix.Close(pfd)
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return &Dir{path: p, parent: os.NewFile(uintptr(pfd), filepath.Dir(p)), name: name, dir: os.NewFile(uintptr(cfd), p)}, nil
}

// Mount is a mount attached on a Dir, known by its id. It holds no
// descriptor of the mount itself, which would keep the mount busy (an
// external umount without -l would fail): it holds the mountpoint's
// parent, and opens the root through it, checked by id, when asked.
type Mount struct {
	at  *Dir
	id  uint64
	dev string // major:minor, as mountinfo shows it
}

// Attach moves the detached mount open as mfd (from fsmount or
// open_tree) onto d, and closes mfd.
func (d *Dir) Attach(mfd int) (*Mount, error) {
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", int(d.dir.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return nil, &os.PathError{Op: "move_mount", Path: d.path, Err: err}
	}
	id, dev, _, err := mountAt(mfd, "")
	if err != nil {
		umount("/proc/self/fd/"+strconv.Itoa(mfd), unix.MNT_DETACH, d.path)
		return nil, &os.PathError{Op: "statx", Path: d.path, Err: err}
	}
	return &Mount{at: d, id: id, dev: dev}, nil
}

// Found is the mount on d made by someone else (fusermount3, for a daemon
// that is not root).
func (d *Dir) Found() (*Mount, error) {
	top, err := d.Top()
	if err != nil {
		return nil, err
	}
	defer top.Close()
	id, dev, root, err := mountAt(int(top.Fd()), "")
	if err != nil {
		return nil, err
	}
	if !root {
		return nil, &Error{Path: d.path, Msg: "nothing is mounted there"}
	}
	return &Mount{at: d, id: id, dev: dev}, nil
}

// ID is the mount's id (mountinfo's first field, statx's stx_mnt_id).
func (m *Mount) ID() uint64 { return m.id }

// Where is where the mount is now, as the kernel names its root ("" if
// it is not at its mountpoint any more).
func (m *Mount) Where() string {
	root, err := m.Root()
	if err != nil {
		return ""
	}
	defer root.Close()
	p, err := os.Readlink(fdPath(root))
	if err != nil {
		return ""
	}
	return p
}

// Path is the mountpoint's path when it was resolved.
func (m *Mount) Path() string { return m.at.path }

// Root opens the mount's root (O_PATH), for the caller to close: through
// the mountpoint's parent, held since it was resolved, and only if the
// mount found there is this one. A parent renamed since changes nothing;
// a mount moved away or unmounted is refused.
func (m *Mount) Root() (*os.File, error) {
	top, err := m.at.Top()
	if err != nil {
		return nil, err
	}
	if !isMount(int(top.Fd()), "", m.id) {
		top.Close()
		return nil, &Error{Path: m.at.path, Msg: "the mount is no longer there"}
	}
	return top, nil
}

// AtItsPlace reports whether the mount is the topmost one on its
// mountpoint directory (it may have been moved, or detached).
func (m *Mount) AtItsPlace() bool {
	return isMount(int(m.at.parent.Fd()), m.at.name, m.id)
}

// Attached reports whether the mount is still in this mount namespace
// (wherever it is): not detached by an umount, lazy or not.
func (m *Mount) Attached() bool {
	ok, err := inMountinfo(m.id, m.dev)
	return err != nil || ok // unknown: take it as attached
}

// inMountinfo looks for a mount of id and dev in /proc/self/mountinfo.
// A detached mount's id may be given to a new mount: the device must
// match too.
func inMountinfo(id uint64, dev string) (bool, error) {
	m, ok, err := findMount(id)
	return ok && m.dev == dev, err
}

// mountinfo is what one line of /proc/self/mountinfo says of a mount.
type mountinfo struct {
	dev    string // major:minor
	path   string // where it is mounted, unescaped
	fstype string
}

// findMount reads the line of the mount with id from /proc/self/mountinfo.
func findMount(id uint64) (mountinfo, bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return mountinfo{}, false, err
	}
	defer f.Close()
	want := strconv.FormatUint(id, 10)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[0] != want {
			continue
		}
		m := mountinfo{dev: fields[2], path: unescapeMountinfo(fields[4])}
		for k, f := range fields {
			if f == "-" && k+1 < len(fields) {
				m.fstype = fields[k+1]
				break
			}
		}
		return m, true, nil
	}
	return mountinfo{}, false, sc.Err()
}

// Type is the file system type of the mount with id ("fuse.amlfs",
// "ext4"), from /proc/self/mountinfo.
func Type(id uint64) (string, error) {
	m, ok, err := findMount(id)
	if err == nil && !ok {
		err = &Error{Path: strconv.FormatUint(id, 10), Msg: "no such mount"}
	}
	return m.fstype, err
}

// ErrBusy is an unmount refused because files of the mount are in use.
var ErrBusy = syscall.EBUSY

// Unmount unmounts, if the mount is still the topmost one on its
// mountpoint. Without lazy, a busy mount is refused (ErrBusy); with lazy
// it is detached (MNT_DETACH): it leaves the namespace at once, and what
// holds files of it open keeps them until closed. Nothing is done by a
// path anyone could change: the parent is held, and the mount is checked
// by its id before the call. A mount moved elsewhere is not reached.
func (m *Mount) Unmount(lazy bool) error {
	if !m.Attached() {
		return nil
	}
	if !m.AtItsPlace() {
		if !lazy {
			return &os.PathError{Op: "umount", Path: m.at.path, Err: ErrBusy}
		}
		return m.detachMoved()
	}
	flags := unix.UMOUNT_NOFOLLOW
	if lazy {
		flags |= unix.MNT_DETACH
	}
	return umount(fdPath(m.at.parent)+"/"+m.at.name, flags, m.at.path)
}

// detachMoved detaches the mount where it is now, after a move (mount
// --move) took it away from its mountpoint: found through mountinfo, opened
// with no symlink followed, and detached only if the root opened is this
// mount's.
func (m *Mount) detachMoved() error {
	where, err := mountPath(m.id, m.dev)
	if err != nil {
		return err
	}
	d, err := Open(where, Policy{AllowUserOwnedParents: true})
	if err != nil {
		return err
	}
	defer d.Close()
	top, err := d.Top()
	if err != nil {
		return err
	}
	defer top.Close()
	if !isMount(int(top.Fd()), "", m.id) {
		return &Error{Path: where, Msg: "the mount moved again while it was being detached"}
	}
	return umount(fdPath(top), unix.MNT_DETACH, where)
}

// mountPath is where mountinfo says the mount of id and dev is.
func mountPath(id uint64, dev string) (string, error) {
	m, ok, err := findMount(id)
	if err != nil {
		return "", err
	}
	if !ok || m.dev != dev {
		return "", &Error{Path: strconv.FormatUint(id, 10), Msg: "no such mount"}
	}
	return m.path, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// UnmountWithin unmounts, retrying for up to wait while the mount is busy;
// then, with lazy, it detaches it. It reports whether it had to detach.
// A mount already gone is not an error.
func (m *Mount) UnmountWithin(wait time.Duration, lazy bool) (detached bool, err error) {
	deadline := time.Now().Add(wait)
	for {
		err := m.Unmount(false)
		switch {
		case err == nil:
			return false, nil
		case !errors.Is(err, ErrBusy):
			if !m.Attached() {
				return false, nil
			}
			return false, err
		case time.Now().After(deadline):
			if !lazy {
				return false, err
			}
			return true, m.Unmount(true)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Parent returns a new descriptor of the mountpoint's parent, and the
// mountpoint's name in it: what another process (the native keeper)
// needs to detach the mount with DetachAt without holding the mount busy.
func (m *Mount) Parent() (*os.File, string, error) {
	fd, err := unix.Openat(int(m.at.parent.Fd()), ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", &os.PathError{Op: "open", Path: filepath.Dir(m.at.path), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Dir(m.at.path)), m.at.name, nil
}

// DetachAt lazily detaches the mount with id if it is the topmost one on
// name in the directory open as parent. It does nothing otherwise.
func DetachAt(parent *os.File, name string, id uint64) error {
	if !isMount(int(parent.Fd()), name, id) {
		return nil
	}
	return umount(fdPath(parent)+"/"+name, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW, name)
}

// FusermountDetach detaches the FUSE mount at mp lazily through the
// setuid fusermount3 (or fusermount): what a process without
// CAP_SYS_ADMIN must do. It takes a path, and its own checks make it
// only the calling user's mount.
func FusermountDetach(mp string) error {
	for _, bin := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(bin); err == nil {
			if out, err := exec.Command(p, "-u", "-z", mp).CombinedOutput(); err != nil {
				return fmt.Errorf("%s -uz %s: %v: %s", bin, mp, err, strings.TrimSpace(string(out)))
			}
			return nil
		}
	}
	return fmt.Errorf("unmount %s: no fusermount3 to do it without CAP_SYS_ADMIN", mp)
}

// Close lets go of the mountpoint (the mount stays mounted).
func (m *Mount) Close() { m.at.Close() }

func umount(target string, flags int, shown string) error {
	if err := unix.Unmount(target, flags); err != nil {
		return &os.PathError{Op: "umount", Path: shown, Err: err}
	}
	return nil
}

// BindTree makes a detached bind mount of dir (open_tree), nosuid and
// nodev as a FUSE mount is, private so that mounts made inside it never
// propagate back to dir, and read-only if ro. It returns the mount's
// descriptor, for Attach.
func BindTree(dir string, ro bool) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, &os.PathError{Op: "open_tree", Path: dir, Err: err}
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if ro {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		unix.Close(fd)
		return -1, &os.PathError{Op: "mount_setattr", Path: dir, Err: err}
	}
	return fd, nil
}
