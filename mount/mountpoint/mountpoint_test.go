package mountpoint

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown, mounts)")
	}
}

func TestOpenRefusesShapes(t *testing.T) {
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "real", "mp"), 0o755))
	must(t, os.Symlink(filepath.Join(dir, "real"), filepath.Join(dir, "link")))
	must(t, os.Symlink(filepath.Join(dir, "real", "mp"), filepath.Join(dir, "leaf")))
	must(t, os.WriteFile(filepath.Join(dir, "file"), nil, 0o644))
	for _, tc := range []struct {
		name, path string
		want       string // the component at fault; "" for no *Error
		create     bool
	}{
		{"real", filepath.Join(dir, "real", "mp"), "", false},
		{"symlink leaf", filepath.Join(dir, "leaf"), filepath.Join(dir, "leaf"), false},
		{"symlink parent", filepath.Join(dir, "link", "mp"), filepath.Join(dir, "link"), false},
		{"file", filepath.Join(dir, "file"), filepath.Join(dir, "file"), false},
		{"relative", "real/mp", "real/mp", false},
		{"root", "/", "/", false},
		{"made", filepath.Join(dir, "real", "new"), "", true},
		{"made with its parents", filepath.Join(dir, "real", "a", "b", "c"), "", true},
		{"dotdot through a symlink", filepath.Join(dir, "link", "..", "real", "mp"), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Open(tc.path, Policy{AllowUserOwnedParents: true, Create: tc.create})
			var me *Error
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				d.Close()
				return
			}
			if !errors.As(err, &me) || me.Path != tc.want {
				t.Fatalf("Open(%s) = %v, want a refusal at %s", tc.path, err, tc.want)
			}
		})
	}
}

func TestOpenMissing(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "x", "y"), Policy{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open of a missing path without Create: %v", err)
	}
}

// TestOpenParentPolicy: a parent another user could rename or replace
// things in is refused, unless allowed; /tmp's sticky bit keeps root's
// own children safe.
func TestOpenParentPolicy(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	mk := func(rel string, mode os.FileMode, uid int) string {
		p := filepath.Join(dir, rel)
		must(t, os.MkdirAll(p, 0o755))
		must(t, os.Chmod(p, mode))
		must(t, os.Chown(p, uid, uid))
		return p
	}
	mk("user", 0o755, 4242)
	mk("user/mp", 0o755, 0)
	mk("open", 0o777, 0)
	mk("open/mp", 0o755, 0)
	mk("sticky", 0o777|os.ModeSticky, 0)
	mk("sticky/mp", 0o755, 4242)
	mk("sticky/rootdir", 0o755, 0)
	mk("sticky/rootdir/mp", 0o755, 0)
	mk("sticky/userdir", 0o755, 4242)
	mk("sticky/userdir/mp", 0o755, 0)
	mk("group", 0o775, 0)
	mk("group/mp", 0o755, 0)
	for _, tc := range []struct {
		rel     string
		refused string // the parent at fault, "" if taken
	}{
		{"user/mp", "user"},
		{"open/mp", "open"},
		{"group/mp", "group"},
		{"sticky/mp", "sticky"},   // another user's directory under a sticky parent: they may rename it
		{"sticky/rootdir/mp", ""}, // root's dir under a sticky parent
		{"sticky/userdir/mp", "sticky"},
	} {
		t.Run(tc.rel, func(t *testing.T) {
			d, err := Open(filepath.Join(dir, tc.rel), Policy{})
			if tc.refused == "" {
				if err != nil {
					t.Fatal(err)
				}
				d.Close()
			} else {
				var me *Error
				if !errors.As(err, &me) || me.Path != filepath.Join(dir, tc.refused) {
					t.Fatalf("got %v, want a refusal at %s", err, tc.refused)
				}
			}
			d, err = Open(filepath.Join(dir, tc.rel), Policy{AllowUserOwnedParents: true})
			if err != nil {
				t.Fatalf("allowed: %v", err)
			}
			d.Close()
		})
	}
}

// TestMountByHandle: a bind mount made on the descriptor is known by its
// id; renaming its parent and putting a symlink to another mount in its
// place changes nothing the handle does, and the unmount unmounts it,
// never the other mount.
func TestMountByHandle(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	for _, p := range []string{"src", "p/mp", "decoy-src", "decoy"} {
		must(t, os.MkdirAll(filepath.Join(dir, p), 0o755))
	}
	must(t, os.WriteFile(filepath.Join(dir, "src", "mine"), []byte("mine"), 0o644))
	at, err := Open(filepath.Join(dir, "p", "mp"), Policy{})
	must(t, err)
	fd, err := BindTree(filepath.Join(dir, "src"), false)
	must(t, err)
	m, err := at.Attach(fd)
	must(t, err)
	t.Cleanup(func() { m.Unmount(true); m.Close() })
	if data, err := os.ReadFile(filepath.Join(dir, "p", "mp", "mine")); err != nil || string(data) != "mine" {
		t.Fatalf("read through the mount: %q %v", data, err)
	}
	var st unix.Statx_t
	must(t, unix.Statx(unix.AT_FDCWD, filepath.Join(dir, "p", "mp"), 0, unix.STATX_MNT_ID, &st))
	if st.Mnt_id != m.ID() || !m.Attached() || !m.AtItsPlace() {
		t.Fatalf("id %d, statx %d, attached %v, at its place %v", m.ID(), st.Mnt_id, m.Attached(), m.AtItsPlace())
	}
	// A decoy mount, and the parent swapped for a symlink to it.
	decoy := filepath.Join(dir, "decoy")
	must(t, unix.Mount(filepath.Join(dir, "decoy-src"), decoy, "", unix.MS_BIND, ""))
	t.Cleanup(func() { unix.Unmount(decoy, unix.MNT_DETACH) })
	must(t, os.Rename(filepath.Join(dir, "p"), filepath.Join(dir, "p.old")))
	must(t, os.MkdirAll(filepath.Join(dir, "evil"), 0o755))
	must(t, os.Symlink(decoy, filepath.Join(dir, "evil", "mp")))
	must(t, os.Symlink(filepath.Join(dir, "evil"), filepath.Join(dir, "p")))
	if !m.Attached() || !m.AtItsPlace() {
		t.Fatal("a renamed parent made the mount look gone")
	}
	root, err := m.Root()
	must(t, err)
	if fd, err := unix.Openat(int(root.Fd()), "mine", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		t.Fatalf("open beneath the held root: %v", err)
	} else {
		unix.Close(fd)
	}
	// Busy: a plain unmount refuses, a lazy one detaches.
	if err := m.Unmount(false); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("unmount while a descriptor of it is open: %v, want EBUSY", err)
	}
	root.Close()
	must(t, m.Unmount(false))
	if m.Attached() {
		t.Fatal("still attached after the unmount")
	}
	if ok, _ := inMountinfo(0, ""); ok {
		t.Fatal("inMountinfo found a mount 0")
	}
	var dst unix.Statx_t
	must(t, unix.Statx(unix.AT_FDCWD, decoy, 0, unix.STATX_MNT_ID, &dst))
	if dst.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		t.Fatal("the decoy mount was unmounted")
	}
}

// TestDetachMoved: a mount moved away from its mountpoint (an external
// move) is still the mount: a lazy unmount detaches it where it is.
func TestDetachMoved(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	for _, p := range []string{"src", "mp", "elsewhere"} {
		must(t, os.MkdirAll(filepath.Join(dir, p), 0o755))
	}
	at, err := Open(filepath.Join(dir, "mp"), Policy{})
	must(t, err)
	fd, err := BindTree(filepath.Join(dir, "src"), true)
	must(t, err)
	m, err := at.Attach(fd)
	must(t, err)
	t.Cleanup(func() { m.Unmount(true); m.Close() })
	if err := os.WriteFile(filepath.Join(dir, "mp", "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to a read-only bind: %v", err)
	}
	must(t, unix.Mount(filepath.Join(dir, "mp"), filepath.Join(dir, "elsewhere"), "", unix.MS_MOVE, ""))
	if m.AtItsPlace() || !m.Attached() {
		t.Fatalf("moved: at its place %v, attached %v", m.AtItsPlace(), m.Attached())
	}
	if _, err := m.Root(); err == nil {
		t.Fatal("Root of a moved mount")
	}
	// A plain unmount does not reach it; a lazy one detaches it where
	// it is now, and nothing else.
	if err := m.Unmount(false); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("a plain unmount of a moved mount: %v", err)
	}
	must(t, m.Unmount(true))
	if m.Attached() {
		t.Fatal("still attached")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{`/mnt/with\040space\011tab`: "/mnt/with space\ttab", `/plain`: "/plain", `/bad\9x`: `/bad\9x`} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestType(t *testing.T) {
	var st unix.Statx_t
	must(t, unix.Statx(unix.AT_FDCWD, "/proc", 0, unix.STATX_MNT_ID, &st))
	if typ, err := Type(st.Mnt_id); err != nil || typ != "proc" {
		t.Errorf("Type of /proc's mount: %q, %v", typ, err)
	}
	if _, err := Type(1 << 40); err == nil {
		t.Error("Type of no mount")
	}
}

// TestUnmountWithin: a busy mount is retried for the wait, then refused,
// or detached with lazy; a mount already gone is no error.
func TestUnmountWithin(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	for _, p := range []string{"src", "mp"} {
		must(t, os.MkdirAll(filepath.Join(dir, p), 0o755))
	}
	at, err := Open(filepath.Join(dir, "mp"), Policy{})
	must(t, err)
	fd, err := BindTree(filepath.Join(dir, "src"), false)
	must(t, err)
	m, err := at.Attach(fd)
	must(t, err)
	t.Cleanup(func() { m.Unmount(true); m.Close() })
	busy, err := m.Root()
	must(t, err)
	defer busy.Close()
	start := time.Now()
	if detached, err := m.UnmountWithin(300*time.Millisecond, false); detached || !errors.Is(err, syscall.EBUSY) || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("busy, not lazy: detached %v, %v after %v", detached, err, time.Since(start))
	}
	if detached, err := m.UnmountWithin(0, true); !detached || err != nil || m.Attached() {
		t.Fatalf("busy, lazy: detached %v, %v, attached %v", detached, err, m.Attached())
	}
	if detached, err := m.UnmountWithin(0, true); detached || err != nil {
		t.Fatalf("gone: detached %v, %v", detached, err)
	}
}
