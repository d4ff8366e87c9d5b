package integration

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A host directory mounted live beside the workspace: both paths see the
// same bytes, host edits show up within a second, ro rejects every write,
// renames and links across providers give EXDEV, and workspace saves leave
// the live mount out.
func TestLiveLocalMount(t *testing.T) {
	e := newEnv(t)
	host, refDir := t.TempDir(), t.TempDir()
	writeHost := func(dir, name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeHost(host, "a.txt", "from the host\n")
	os.Mkdir(filepath.Join(host, "sub"), 0o755)
	writeHost(refDir, "ref.txt", "reference\n")
	mp := e.mount("live", "--mount", "/shared=file://"+host, "--mount", "/mnt/ref=file://"+refDir+",ro")

	// Two paths, one view.
	if got := readFile(t, filepath.Join(mp, "shared/a.txt")); got != "from the host\n" {
		t.Fatalf("shared/a.txt = %q", got)
	}
	sh(t, mp, "echo through the mount > shared/sub/new.txt && echo ws > w.txt && mkdir -p shared/d/e")
	if got, _ := os.ReadFile(filepath.Join(host, "sub/new.txt")); string(got) != "through the mount\n" {
		t.Fatalf("host sees %q", got)
	}
	if ls := sh(t, mp, "ls"); !strings.Contains(ls, "shared") || !strings.Contains(ls, "mnt") {
		t.Errorf("ls / = %q", ls)
	}
	st := e.amlfs("status", mp, "--json")
	for _, want := range []string{`"prefix": "/shared"`, `"prefix": "/mnt/ref"`, `"ro": true`, `"health": "ok"`} {
		if !strings.Contains(st.stdout, want) {
			t.Errorf("status lacks %s:\n%s", want, st.stdout)
		}
	}

	// Host edits show up within a second, with the kernel caches warm.
	sh(t, mp, "cat shared/a.txt shared/sub/new.txt >/dev/null; ls shared shared/sub >/dev/null; stat shared/gone.txt 2>/dev/null || true")
	writeHost(host, "a.txt", "edited on the host, longer than before\n")
	writeHost(host, "gone.txt", "appeared\n")
	os.Remove(filepath.Join(host, "sub/new.txt"))
	deadline := time.Now().Add(time.Second)
	for {
		a, _ := os.ReadFile(filepath.Join(mp, "shared/a.txt"))
		g, _ := os.ReadFile(filepath.Join(mp, "shared/gone.txt"))
		_, nerr := os.Stat(filepath.Join(mp, "shared/sub/new.txt"))
		if string(a) == "edited on the host, longer than before\n" && string(g) == "appeared\n" && errors.Is(nerr, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("host edits not seen within 1s: a=%q gone=%q new.txt err=%v", a, g, nerr)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Read-only rejects every kind of write.
	ref := filepath.Join(mp, "mnt/ref")
	if got := readFile(t, filepath.Join(ref, "ref.txt")); got != "reference\n" {
		t.Fatalf("ro read: %q", got)
	}
	for name, op := range map[string]func() error{
		"create":   func() error { return os.WriteFile(filepath.Join(ref, "x"), nil, 0o644) },
		"write":    func() error { return os.WriteFile(filepath.Join(ref, "ref.txt"), []byte("no"), 0o644) },
		"truncate": func() error { return os.Truncate(filepath.Join(ref, "ref.txt"), 0) },
		"unlink":   func() error { return os.Remove(filepath.Join(ref, "ref.txt")) },
		"mkdir":    func() error { return os.Mkdir(filepath.Join(ref, "d"), 0o755) },
		"chmod":    func() error { return os.Chmod(filepath.Join(ref, "ref.txt"), 0o600) },
		"rename":   func() error { return os.Rename(filepath.Join(ref, "ref.txt"), filepath.Join(ref, "r2")) },
		"symlink":  func() error { return os.Symlink("x", filepath.Join(ref, "l")) },
		"setxattr": func() error { return syscall.Setxattr(filepath.Join(ref, "ref.txt"), "user.x", []byte("1"), 0) },
	} {
		if err := op(); !errors.Is(err, syscall.EROFS) {
			t.Errorf("ro %s: %v, want EROFS", name, err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(refDir, "ref.txt")); string(got) != "reference\n" {
		t.Errorf("ro host file changed: %q", got)
	}

	// Across providers: EXDEV; the live mount's own directory: EBUSY.
	for name, err := range map[string]error{
		"rename ws->live": syscall.Rename(filepath.Join(mp, "w.txt"), filepath.Join(mp, "shared/w.txt")),
		"rename live->ws": syscall.Rename(filepath.Join(mp, "shared/a.txt"), filepath.Join(mp, "a.txt")),
		"link live->ws":   syscall.Link(filepath.Join(mp, "shared/a.txt"), filepath.Join(mp, "a.txt")),
		"link ws->live":   syscall.Link(filepath.Join(mp, "w.txt"), filepath.Join(mp, "shared/w.txt")),
	} {
		if !errors.Is(err, syscall.EXDEV) {
			t.Errorf("%s: %v, want EXDEV", name, err)
		}
	}
	if err := syscall.Rename(filepath.Join(mp, "shared"), filepath.Join(mp, "moved")); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("rename of the live mount: %v, want EBUSY", err)
	}
	if err := syscall.Rmdir(filepath.Join(mp, "mnt/ref")); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("rmdir of the live mount: %v, want EBUSY", err)
	}
	// refresh: one path, a path given inside the mountpoint, all of them;
	// a workspace path is refused.
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"shared/sub"}, 0, "/shared\n"},
		{[]string{filepath.Join(mp, "mnt/ref/ref.txt")}, 0, "/mnt/ref\n"},
		{nil, 0, "/mnt/ref\n/shared\n"},
		{[]string{"w.txt"}, 2, ""},
	} {
		r := e.amlfs(append([]string{"refresh", mp}, tc.args...)...)
		if r.code != tc.code || r.stdout != tc.out {
			t.Errorf("refresh %v: %s; want exit %d and %q", tc.args, r, tc.code, tc.out)
		}
	}
	// mv falls back to copy and delete across providers, as across devices.
	sh(t, mp, "mv w.txt shared/w.txt && cp shared/w.txt w.txt")
	if got, _ := os.ReadFile(filepath.Join(host, "w.txt")); string(got) != "ws\n" {
		t.Errorf("mv across providers: host has %q", got)
	}

	// The save leaves the live mounts out, however the workspace paths
	// beneath them looked.
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	r := e.amlfs(append([]string{"revisions", "show", "current"}, e.storeFlags("live")...)...)
	if r.code != 0 {
		t.Fatalf("show: %s", r)
	}
	if strings.Contains(r.stdout, "shared") || strings.Contains(r.stdout, "ref") || !strings.Contains(r.stdout, "w.txt") {
		t.Errorf("saved revision holds live mount paths or lacks w.txt:\n%s", r.stdout)
	}
	if _, err := os.Stat(filepath.Join(host, "a.txt")); err != nil {
		t.Errorf("host dir after unmount: %v", err)
	}
}

// Bad live mount specs exit 2 with INVALID_CONFIG, before anything mounts.
func TestLiveMountSpecsRejected(t *testing.T) {
	e := newEnv(t)
	host := t.TempDir()
	for name, specs := range map[string][]string{
		"nested":        {"/a=file://" + host, "/a/b=file://" + host},
		"repeated":      {"/a=file://" + host, "/a=file://" + host + ",ro"},
		"relative":      {"data=file://" + host},
		"not normal":    {"/data/../x=file://" + host},
		"root":          {"/=file://" + host},
		"bad option":    {"/data=file://" + host + ",rw,bogus"},
		"missing dir":   {"/data=file://" + filepath.Join(host, "nope")},
		"relative host": {"/data=file://rel/dir"},
	} {
		args := []string{}
		for _, s := range specs {
			args = append(args, "--mount", s)
		}
		mp := filepath.Join(e.root, "bad")
		r := e.mountAt(mp, "bad", args...)
		if r.code != 2 || !strings.Contains(r.stderr, "INVALID_CONFIG") {
			t.Errorf("%s: %s", name, r)
		}
		if isMounted(mp) {
			t.Errorf("%s: mounted anyway", name)
		}
	}
}

// With --store none there is no workspace: / lists the live mounts as
// read-only directories, the mounts work, commit is refused, and unmount
// saves nothing.
func TestStoreNone(t *testing.T) {
	e := newEnv(t)
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "h.txt"), []byte("host\n"), 0o644)
	mp := filepath.Join(e.root, "mnt-none")
	r := e.amlfs("mount", "--daemon", mp, "--store", "none", "--cache-dir", e.cache, "--mount", "/data=file://"+host, "--mount", "/x/y=file://"+host+",ro")
	if r.code != 0 {
		t.Fatalf("mount: %s", r)
	}
	t.Cleanup(func() { e.forceUnmount(mp) })
	if ls := strings.Fields(sh(t, mp, "ls -A")); strings.Join(ls, " ") != "data x" {
		t.Errorf("ls / = %q, want data x", ls)
	}
	if got := readFile(t, filepath.Join(mp, "data/h.txt")); got != "host\n" {
		t.Errorf("data/h.txt = %q", got)
	}
	sh(t, mp, "echo new > data/new.txt")
	if got, _ := os.ReadFile(filepath.Join(host, "new.txt")); string(got) != "new\n" {
		t.Errorf("host new.txt = %q", got)
	}
	for name, err := range map[string]error{
		"create at /":  os.WriteFile(filepath.Join(mp, "f"), nil, 0o644),
		"mkdir at /":   os.Mkdir(filepath.Join(mp, "d"), 0o755),
		"mkdir in /x":  os.Mkdir(filepath.Join(mp, "x/z"), 0o755),
		"chmod /x":     os.Chmod(filepath.Join(mp, "x"), 0o700),
		"write in ro":  os.WriteFile(filepath.Join(mp, "x/y/f"), nil, 0o644),
		"rmdir /data":  syscall.Rmdir(filepath.Join(mp, "data")),
		"rename /data": syscall.Rename(filepath.Join(mp, "data"), filepath.Join(mp, "d2")),
	} {
		if !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EBUSY) {
			t.Errorf("%s: %v, want EROFS or EBUSY", name, err)
		}
	}
	if r := e.amlfs("commit", mp); r.code != 2 || !strings.Contains(r.stderr, "--store none") {
		t.Errorf("commit: %s", r)
	}
	st := e.amlfs("status", mp, "--json")
	if !strings.Contains(st.stdout, `"store": "none"`) || !strings.Contains(st.stdout, `"prefix": "/data"`) {
		t.Errorf("status: %s", st.stdout)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if isMounted(mp) {
		t.Fatal("still mounted")
	}
	if ents, _ := os.ReadDir(e.cache); len(ents) != 0 {
		t.Errorf("cache dir keeps %d entries after a --store none unmount", len(ents))
	}
}

// --config FILE mirrors the flags in YAML; the command line wins.
func TestConfigFile(t *testing.T) {
	e := newEnv(t)
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "h.txt"), []byte("host\n"), 0o644)
	cfg := filepath.Join(e.root, "amlfs.yaml")
	yaml := "store: " + e.store + "\nid: fromfile\ncache-dir: " + e.cache + "\nretention: 2\nmount:\n  - /data=file://" + host + ",ro\nsave: never\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	mp := filepath.Join(e.root, "mnt-cfg")
	r := e.amlfs("mount", "--daemon", mp, "--config", cfg, "--save", "on-success")
	if r.code != 0 {
		t.Fatalf("mount: %s", r)
	}
	t.Cleanup(func() { e.forceUnmount(mp) })
	if got := readFile(t, filepath.Join(mp, "data/h.txt")); got != "host\n" {
		t.Errorf("data/h.txt = %q", got)
	}
	if err := os.WriteFile(filepath.Join(mp, "data/x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("ro from the file: %v", err)
	}
	st := e.amlfs("status", mp, "--json")
	for _, want := range []string{`"id": "fromfile"`, `"savePolicy": "on-success"`} {
		if !strings.Contains(st.stdout, want) {
			t.Errorf("status lacks %s: %s", want, st.stdout)
		}
	}
	sh(t, mp, "echo saved > w.txt")
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	// --save on-success from the command line beat save: never in the file.
	r = e.amlfs(append([]string{"revisions", "show", "current"}, e.storeFlags("fromfile")...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "w.txt") {
		t.Errorf("revision after unmount: %s", r)
	}
	bad := filepath.Join(e.root, "bad.yaml")
	os.WriteFile(bad, []byte("retention: [not a number\n"), 0o644)
	if r := e.amlfs("mount", "--daemon", filepath.Join(e.root, "mnt-bad"), "--config", bad); r.code != 2 {
		t.Errorf("bad config file: %s", r)
	}
}

// A live mount whose host directory goes away fails on its own paths only:
// the workspace and the other mounts keep working, status reports it, and
// it recovers when the directory is back.
func TestLiveMountFailsAlone(t *testing.T) {
	e := newEnv(t)
	parent := t.TempDir()
	host, other := filepath.Join(parent, "gone"), t.TempDir()
	os.Mkdir(host, 0o755)
	os.WriteFile(filepath.Join(host, "f"), []byte("1"), 0o644)
	os.WriteFile(filepath.Join(other, "g"), []byte("2"), 0o644)
	mp := e.mount("fails", "--mount", "/a=file://"+host, "--mount", "/b=file://"+other)
	sh(t, mp, "cat a/f b/g >/dev/null")
	os.RemoveAll(host)
	if _, err := os.ReadFile(filepath.Join(mp, "a/f")); err == nil {
		t.Error("read from a removed host directory succeeded")
	}
	sh(t, mp, "echo ws > w.txt && cat b/g w.txt >/dev/null")
	st := e.amlfs("status", mp, "--json")
	if !strings.Contains(st.stdout, "no such file or directory") {
		t.Errorf("status does not show the failed mount: %s", st.stdout)
	}
	os.Mkdir(host, 0o755)
	os.WriteFile(filepath.Join(host, "f"), []byte("back"), 0o644)
	deadline := time.Now().Add(2 * time.Second)
	for {
		if got, _ := os.ReadFile(filepath.Join(mp, "a/f")); string(got) == "back" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("live mount did not recover when its directory came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// A shell that enters a directory it just made on a host mount keeps a
// working directory: the host's fsnotify events for changes made through
// the mount drop attributes, never the entry, which would unhash the
// directory and make getcwd fail (prove and File::Find could not start).
func TestLiveHostGetcwd(t *testing.T) {
	e := newEnv(t)
	host := filepath.Join(e.root, "host")
	must(t, os.Mkdir(host, 0o755))
	mp := e.mount("cwd", "--mount", "/shared=file://"+host)
	for i := range 100 {
		d := filepath.Join(mp, "shared", fmt.Sprint("d", i))
		must(t, os.Mkdir(d, 0o755))
		cmd := exec.Command("sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do /bin/pwd || exit 1; sleep 0.01; done")
		cmd.Dir = d
		out, err := cmd.CombinedOutput()
		if err != nil || strings.Count(string(out), d+"\n") != 10 {
			t.Fatalf("pwd in a new directory %s: %v %q", d, err, out)
		}
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// TestLiveDirentIno lists directories that hold live mounts: each entry's
// d_ino is the inode number lstat gives for the name (find, du, git and
// os.scandir trust the two to agree), for a mount at the root and one
// deeper down, before and after either was looked up. Served natively,
// the live mounts are kernel mount points, and their entries are as on
// any Linux mount point.
func TestLiveDirentIno(t *testing.T) {
	e := newEnv(t)
	host := filepath.Join(e.root, "host")
	deep := filepath.Join(e.root, "deep")
	must(t, os.Mkdir(host, 0o755))
	must(t, os.Mkdir(deep, 0o755))
	mp := e.mount("dino", "--mount", "/shared=file://"+host, "--mount", "/a/b/deep=file://"+deep)
	sh(t, mp, "echo x > file && mkdir -p dir a/b/c && echo y > a/b/f")
	for _, dir := range []string{"", "a/b", "", "a/b"} { // the second round after the lookups
		ents := direntInos(t, filepath.Join(mp, dir))
		var dst syscall.Stat_t
		must(t, syscall.Stat(filepath.Join(mp, dir), &dst))
		for name, ino := range ents {
			var st syscall.Stat_t
			must(t, syscall.Lstat(filepath.Join(mp, dir, name), &st))
			if st.Dev != dst.Dev && !isFUSE(mp) {
				// Served natively, a live mount is a kernel mount
				// point, whose entry shows the number of the
				// directory it covers, as every Linux mount point
				// does (README: Serving); st_dev tells it apart.
				continue
			}
			if st.Ino != ino {
				t.Errorf("%s: d_ino %d, lstat st_ino %d", filepath.Join(dir, name), ino, st.Ino)
			}
		}
		for _, want := range map[string][]string{"": {"shared", "file", "dir", "a"}, "a/b": {"deep", "c", "f"}}[dir] {
			if _, ok := ents[want]; !ok {
				t.Errorf("%s lists no %s: %v", dir, want, ents)
			}
		}
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// direntInos reads dir with getdents64 and returns each name's d_ino.
func direntInos(t *testing.T, dir string) map[string]uint64 {
	t.Helper()
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	must(t, err)
	defer syscall.Close(fd)
	out := map[string]uint64{}
	buf := make([]byte, 64<<10)
	for {
		n, err := syscall.Getdents(fd, buf)
		must(t, err)
		if n == 0 {
			return out
		}
		for b := buf[:n]; len(b) > 0; {
			// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
			ino := binary.NativeEndian.Uint64(b[0:8])
			reclen := binary.NativeEndian.Uint16(b[16:18])
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if s := string(name); s != "." && s != ".." {
				out[s] = ino
			}
			b = b[reclen:]
		}
	}
}
