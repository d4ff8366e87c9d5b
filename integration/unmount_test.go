package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// withoutFusermount makes the env run amlfs with a PATH where no
// fusermount3 or fusermount can be found, as on a machine without the
// fuse3 package (CI installs it, which once hid dead mounts).
func withoutFusermount(e *env) {
	e.extraEnv = append(e.extraEnv, "PATH="+e.t.TempDir())
}

// gone waits until process pid has exited (a SIGKILLed daemon's mount is
// dead from then on, whether or not a stat still answers from the cache).
func gone(t *testing.T, pid int) {
	t.Helper()
	waitFor(t, func() bool { return syscall.Kill(pid, 0) == syscall.ESRCH })
}

// TestDeadMountWithoutFusermount: after kill -9, with no fusermount
// anywhere, the next mount of the same workspace cleans the dead mount and
// resumes, every time; and `amlfs unmount` of a dead mount removes it
// rather than exiting 0 with the mount left behind.
func TestDeadMountWithoutFusermount(t *testing.T) {
	e := newEnv(t)
	withoutFusermount(e)
	// A dead FUSE mount (a native one has its keeper: TestNativeCrash).
	mp := e.mount("dead", "--serve", "fuse")
	for i := range 4 {
		sh(t, mp, fmt.Sprintf("echo %d > f%d", i, i))
		pid := e.pid(mp)
		syscall.Kill(pid, syscall.SIGKILL)
		gone(t, pid)
		if r := e.mountAt(mp, "dead", "--serve", "fuse"); r.code != 0 {
			t.Fatalf("mount %d after kill -9: %s", i, r)
		}
		for j := 0; j <= i; j++ {
			if got, err := os.ReadFile(filepath.Join(mp, fmt.Sprintf("f%d", j))); err != nil || string(got) != fmt.Sprintf("%d\n", j) {
				t.Fatalf("after remount %d, f%d: %q, %v", i, j, got, err)
			}
		}
	}
	pid := e.pid(mp)
	syscall.Kill(pid, syscall.SIGKILL)
	gone(t, pid)
	r := e.unmount(mp)
	if r.code != 0 || !strings.Contains(r.stderr, "dead mount") {
		t.Fatalf("unmount of a dead mount: %s", r)
	}
	if isMounted(mp) {
		t.Fatal("unmount of a dead mount left it mounted")
	}
	if _, err := os.Stat(mp); err != nil {
		t.Fatalf("mountpoint after unmount: %v", err)
	}
	// Nothing was lost: the next mount resumes and saves all of it.
	e.mount("dead")
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("final unmount: %s", r)
	}
	other := *e
	other.cache = filepath.Join(t.TempDir(), "cache")
	mp2 := other.mount("dead")
	sh(t, mp2, "test $(cat f0 f1 f2 f3 | tr -d '\\n') = 0123")
	other.unmount(mp2)
}

// TestBusyUnmountWithoutFusermount: a shell cd'd into the mount keeps it
// busy; with no fusermount anywhere, unmount still saves, detaches the
// mount lazily, exits 0 and leaves no "transport endpoint is not connected"
// behind, in well under 5 s after its retries.
func TestBusyUnmountWithoutFusermount(t *testing.T) {
	e := newEnv(t)
	withoutFusermount(e)
	mp := e.mount("busy", "--serve", "fuse") // a FUSE mount's lazy detach; TestNativeExternalUnmount natively
	sh(t, mp, "echo busy > f")
	hold := exec.Command("sleep", "60")
	hold.Dir = mp
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { hold.Process.Kill(); hold.Wait() }()
	start := time.Now()
	r := e.unmount(mp)
	took := time.Since(start)
	if r.code != 0 || strings.TrimSpace(r.stdout) == "" {
		t.Fatalf("busy unmount: %s", r)
	}
	if took > 10*time.Second {
		t.Errorf("busy unmount took %v", took)
	}
	if isMounted(mp) {
		t.Fatal("busy unmount left the mount in the namespace")
	}
	if _, err := os.Stat(mp); err != nil {
		t.Fatalf("mountpoint after a busy unmount: %v", err)
	}
	// The saved revision has the file.
	other := *e
	other.cache = filepath.Join(t.TempDir(), "cache")
	mp2 := other.mount("busy")
	sh(t, mp2, "test \"$(cat f)\" = busy")
	other.unmount(mp2)
}

// TestRuntimeDirTrust: a runtime dir another user owns (made first in a
// shared $TMPDIR) is never used: mount refuses it with INVALID_CONFIG, and
// a retried unmount does not believe a last-stop record planted in it.
func TestRuntimeDirTrust(t *testing.T) {
	e := newEnv(t)
	must(t, os.MkdirAll(e.runtime, 0o755))
	must(t, os.Chown(e.runtime, 4242, 4242))
	mp := filepath.Join(e.root, "mnt-trust")
	must(t, os.Mkdir(mp, 0o755))
	// A planted record for this mountpoint, of every key name amlfs could use.
	sum := sha256.Sum256([]byte(mp))
	key := hex.EncodeToString(sum[:8])
	must(t, os.WriteFile(filepath.Join(e.runtime, key+".last.json"), []byte(`{"id":"x","stoppedAt":"2026-01-01T00:00:00Z","saved":{"revision":"attacker-rev"}}`), 0o644))
	must(t, os.Symlink("/etc/passwd-amlfs-victim", filepath.Join(e.runtime, key+".log")))
	r := e.mountAt(mp, "trust")
	if r.code != 2 || !strings.Contains(r.stderr, "belongs to uid 4242") {
		t.Errorf("mount with a runtime dir of another user: %s", r)
	}
	if _, err := os.Lstat("/etc/passwd-amlfs-victim"); err == nil {
		t.Error("the planted log symlink was followed")
	}
	r = e.unmount(mp)
	if strings.Contains(r.stdout+r.stderr, "attacker-rev") {
		t.Errorf("unmount believed a planted record: %s", r)
	}
}
