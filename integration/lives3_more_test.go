package integration

import (
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

// Stopping the S3 server gives EIO on its mount only; the workspace and a
// host mount keep working, status shows the failure, and reads recover
// when the server is back.
func TestS3LiveProviderDies(t *testing.T) {
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "dies")
	l.put("f.txt", []byte("before"), nil)
	l.put("g.txt", []byte("never read"), nil)
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "h"), []byte("host"), 0o644)
	// Unreachable at start: the mount comes up, the S3 paths give EIO.
	srv.stop()
	mp := l.mount("dies", append(l.s3Args(), "--mount", "/s=s3://"+s3Bucket+"/dies", "--mount", "/h=file://"+host)...)
	if _, err := os.ReadDir(filepath.Join(mp, "s")); !errors.Is(err, syscall.EIO) {
		t.Errorf("listing with the server down at start: %v, want EIO", err)
	}
	sh(t, mp, "cat h/h >/dev/null && echo a > a.txt")
	srv.start(t)
	waitFor(t, func() bool {
		b, err := os.ReadFile(filepath.Join(mp, "s/f.txt"))
		return err == nil && string(b) == "before"
	})
	// Unreachable later.
	srv.stop()
	start := time.Now()
	_, err := os.ReadFile(filepath.Join(mp, "s/g.txt"))
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("read of an uncached object with the server down: %v, want EIO", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("EIO took %v", d)
	}
	sh(t, mp, "echo ws > w.txt && cat w.txt h/h >/dev/null")
	st := l.amlfs("status", mp, "--json")
	if !strings.Contains(st.stdout, "connect") {
		t.Errorf("status does not show the S3 mount's failure: %s", st.stdout)
	}
	srv.start(t)
	waitFor(t, func() bool {
		b, err := os.ReadFile(filepath.Join(mp, "s/g.txt"))
		return err == nil && string(b) == "never read"
	})
	if r := l.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// Keys are at most 1,024 bytes: a name that would make a longer one is
// ENAMETOOLONG, as a name over NAME_MAX is on ext4, for create, mkdir,
// symlink, lookup and rename (of a directory, by its deepest known key);
// exactly 1,024 bytes works. Names amlfs makes are at most 255 bytes
// (NAME_MAX). (Longer ones other clients made are shown; versitygw's posix
// backend cannot hold one, so that is not tested here.)
func TestS3LiveKeyLength(t *testing.T) {
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "keys")
	mp := l.mountNone("keys")
	root := filepath.Join(mp, "s")
	if err := os.WriteFile(filepath.Join(root, strings.Repeat("m", 256)), nil, 0o644); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Errorf("create of a 256-byte name: %v, want ENAMETOOLONG (NAME_MAX)", err)
	}
	if _, err := os.Stat(filepath.Join(root, strings.Repeat("m", 256))); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Errorf("lookup of a missing 256-byte name: %v, want ENAMETOOLONG", err)
	}
	must(t, os.WriteFile(filepath.Join(root, strings.Repeat("m", 255)), nil, 0o644))
	// The mount's prefix is "keys/": 5 bytes of every key.
	const limit = 1024 - len("keys/")
	seg := strings.Repeat("d", 200)
	deep := filepath.Join(root, seg, seg, seg, seg) // 4*200 + 4 slashes
	must(t, os.MkdirAll(deep, 0o755))
	room := limit - 4*201 // bytes left for a file name in deep
	exact := filepath.Join(deep, strings.Repeat("f", room))
	must(t, os.WriteFile(exact, []byte("at the limit"), 0o644))
	over := filepath.Join(deep, strings.Repeat("f", room+1))
	for _, tc := range []struct {
		op string
		fn func() error
	}{
		{"create", func() error { return os.WriteFile(over, nil, 0o644) }},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(deep, strings.Repeat("m", room)), 0o755) }}, // its marker ends in "/"
		{"symlink", func() error { return os.Symlink("x", over) }},
		{"lookup", func() error { _, err := os.Lstat(over); return err }},
		{"rename", func() error { return os.Rename(exact, over) }},
		{"rename dir", func() error {
			return os.Rename(filepath.Join(root, seg), filepath.Join(root, seg+"x"))
		}},
	} {
		if err := tc.fn(); !errors.Is(err, syscall.ENAMETOOLONG) {
			t.Errorf("%s over the key limit: %v, want ENAMETOOLONG", tc.op, err)
		}
	}
	l.drained(mp, "/s")
	key := seg + "/" + seg + "/" + seg + "/" + seg + "/" + strings.Repeat("f", room)
	if b, err := l.get(key); err != nil || string(b) != "at the limit" {
		t.Errorf("the 1,024-byte key: %q %v", b, err)
	}
	if r := l.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// An unprivileged write, append or truncate clears setuid, and setgid on
// a group-executable file, on an S3 live mount as on ext4; the cleared
// mode is what is uploaded. Root's write keeps them.
func TestS3LiveKillSuid(t *testing.T) {
	needTools(t, "util-linux", "setpriv")
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "suid")
	l.traversable()
	mp := l.mountNone("suid")
	var st syscall.Stat_t
	must(t, syscall.Stat(mp, &st))
	if st.Mode&0o777 != 0o755 {
		t.Errorf("the root of a --store none mount is %o, want 755", st.Mode&0o777)
	}
	must(t, os.Chmod(filepath.Join(mp, "s"), 0o777))
	p := filepath.Join(mp, "s", "tool")
	must(t, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755))
	asNobody := func(args ...string) {
		t.Helper()
		out, err := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v as nobody: %v %s", args, err, out)
		}
	}
	for _, tc := range []struct {
		name string
		as   func()
	}{
		{"append", func() { asNobody("sh", "-c", "echo more >> "+p) }},
		{"truncate", func() { asNobody("truncate", "-s", "3", p) }},
		{"write in place", func() { asNobody("dd", "of="+p, "conv=notrunc", "bs=1", "count=1", "if=/dev/zero", "status=none") }},
	} {
		must(t, syscall.Chmod(p, 0o6777))
		tc.as()
		must(t, syscall.Stat(p, &st))
		if st.Mode&07777 != 0o777 {
			t.Errorf("%s as nobody: mode %o, want 777 (setuid and setgid cleared)", tc.name, st.Mode&07777)
		}
	}
	l.drained(mp, "/s")
	h, err := l.head("tool")
	must(t, err)
	if h.Metadata["mode"] != fmt.Sprint(syscall.S_IFREG|0o777) {
		t.Errorf("uploaded mode %s, want %d", h.Metadata["mode"], syscall.S_IFREG|0o777)
	}
	must(t, syscall.Chmod(p, 0o6777))
	must(t, os.WriteFile(p, []byte("root"), 0o644))
	must(t, syscall.Stat(p, &st))
	if st.Mode&07777 != 0o6777 {
		t.Errorf("root's write changed the mode to %o", st.Mode&07777)
	}
	if r := l.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// TestS3LiveRenameBack: a rename leaves a delete of its source queued; a
// copy to that key before the delete runs (a rename back, or over a file
// just removed) must survive it. Before, the delete landed after the
// copy: the bucket lost the file the mount still showed, and a chmod of
// it then failed forever, hanging every later rename of it.
func TestS3LiveRenameBack(t *testing.T) {
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "back")
	mp := l.mountNone("back")
	s := filepath.Join(mp, "s")
	must(t, os.WriteFile(filepath.Join(s, "a.txt"), []byte("one"), 0o644))
	must(t, os.WriteFile(filepath.Join(s, "x.txt"), []byte("x"), 0o644))
	must(t, os.WriteFile(filepath.Join(s, "y.txt"), []byte("y"), 0o644))
	must(t, os.MkdirAll(filepath.Join(s, "d"), 0o755))
	must(t, os.WriteFile(filepath.Join(s, "d", "f.txt"), []byte("deep"), 0o644))
	l.drained(mp, "/s")

	must(t, os.Rename(filepath.Join(s, "a.txt"), filepath.Join(s, "b.txt")))
	must(t, os.Rename(filepath.Join(s, "b.txt"), filepath.Join(s, "a.txt")))
	must(t, os.Remove(filepath.Join(s, "x.txt")))
	must(t, os.Rename(filepath.Join(s, "y.txt"), filepath.Join(s, "x.txt")))
	must(t, os.Rename(filepath.Join(s, "d"), filepath.Join(s, "e")))
	must(t, os.Rename(filepath.Join(s, "e"), filepath.Join(s, "d")))
	l.drained(mp, "/s")
	for key, want := range map[string]string{"a.txt": "one", "x.txt": "y", "d/f.txt": "deep"} {
		if b, err := l.get(key); err != nil || string(b) != want {
			t.Errorf("bucket %s: %q %v, want %q", key, b, err, want)
		}
	}
	for _, key := range []string{"b.txt", "y.txt", "e/f.txt"} {
		if _, err := l.get(key); err == nil {
			t.Errorf("bucket %s still there", key)
		}
	}
	// Its metadata goes up, and a rename after it does not hang.
	must(t, os.Chmod(filepath.Join(s, "a.txt"), 0o600))
	l.drained(mp, "/s")
	done := make(chan error, 1)
	go func() { done <- os.Rename(filepath.Join(s, "a.txt"), filepath.Join(s, "c.txt")) }()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("rename hangs")
	}
	l.drained(mp, "/s")
	h, err := l.head("c.txt")
	must(t, err)
	if h.Metadata["mode"] != fmt.Sprint(syscall.S_IFREG|0o600) {
		t.Errorf("uploaded mode %s, want %d", h.Metadata["mode"], syscall.S_IFREG|0o600)
	}
	if r := l.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}
