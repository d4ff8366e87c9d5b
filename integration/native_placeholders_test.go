package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Served natively, a checkpoint cannot hold writes back: a save reads the
// tree again while it changes under it, and one that kept changing through
// every reading is published with a warning saying the tree is not one
// instant. A quiet tree is read once. A reading after the first copies
// only what changed since, so it is quick, and may find the writer
// between two writes (then the save is the tree at that instant, with no
// warning): the first reading, of 20 MB, cannot.
func TestNativeCheckpointWhileWriting(t *testing.T) {
	e := newEnv(t)
	needNative(t, e)
	mp := e.mount("settle", "--serve", "native")
	// Enough to read that a save takes longer than the writer's pause.
	sh(t, mp, "mkdir -p d && for i in $(seq 0 199); do head -c 100000 /dev/urandom > d/f$i; done")
	// A process of its own, writing without pause.
	w := exec.Command("sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > busy.txt; done")
	w.Dir = mp
	must(t, w.Start())
	busy := e.amlfs("commit", mp)
	w.Process.Kill()
	w.Wait()
	st := e.amlfs("status", mp, "--json").stdout
	n := jsonInt(t, st, "attempts")
	warned := strings.Contains(busy.stderr, "not one instant")
	if busy.code != 0 || n < 2 || warned && n != 3 {
		t.Errorf("a commit while a writer never stops: %d attempts, want the tree read again; warned %v (only after 3): %s", n, warned, busy)
	}
	sh(t, mp, "echo last > busy.txt")
	quiet := e.amlfs("commit", mp)
	if quiet.code != 0 || strings.Contains(quiet.stderr, "instant") {
		t.Errorf("a commit of a quiet tree: %s", quiet)
	}
	st = e.amlfs("status", mp, "--json").stdout
	if n := jsonInt(t, st, "attempts"); n != 1 {
		t.Errorf("%d attempts for a quiet tree, want 1: %s", n, st)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// TestNativeDetachedNoZeros: root detaches the native mount (umount -l)
// while a process holds its files (O_PATH, which reads nothing). The
// daemon takes that for an external unmount, but each placeholder opened
// afterwards through what the process holds gives its bytes or EIO,
// never zeros (issue 26, row 5).
func TestNativeDetachedNoZeros(t *testing.T) {
	want, h, mp2 := lazyNative(t, newEnv(t))
	held := map[string]int{}
	for name := range want {
		fd, err := unix.Open(filepath.Join(mp2, name), unix.O_PATH|unix.O_CLOEXEC, 0)
		must(t, err)
		held[name] = fd
		defer unix.Close(fd)
	}
	pid := jsonInt(t, h.amlfs("status", mp2, "--json").stdout, "pid")
	must(t, syscall.Unmount(mp2, syscall.MNT_DETACH))
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Fatal("the daemon did not stop after the external unmount")
	}
	read := 0
	for name, data := range want {
		got, err := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", held[name]))
		if errorsIs(err, syscall.EIO) {
			continue
		}
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s through the detached mount: %d bytes, equal %v, %v", name, len(got), bytes.Equal(got, data), err)
		}
		read++
	}
	t.Logf("%d of %d files read whole through the detached mount, the rest EIO", read, len(want))
}

// TestNativePrefetchEmptyFiles: the background prefetch of a lazily
// restored tree with empty files finishes, and nothing waits on it. An
// empty placeholder was filled by path, whose open waited on the very
// FAN_OPEN_PERM event it raised: the prefetch, and every later open of
// the file, hung.
func TestNativePrefetchEmptyFiles(t *testing.T) {
	e := newEnv(t)
	needNative(t, e)
	mp := e.mount("empties", "--serve", "native")
	for i := 0; i < 8; i++ {
		must(t, os.WriteFile(filepath.Join(mp, fmt.Sprintf("empty%d", i)), nil, 0o644))
	}
	must(t, os.WriteFile(filepath.Join(mp, "full"), []byte("bytes"), 0o644))
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	h := e.host(t)
	mp2 := h.mount("empties", "--serve", "native")
	deadline := time.Now().Add(20 * time.Second)
	for jsonInt(t, h.amlfs("status", mp2, "--json").stdout, "pendingFiles") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the prefetch did not finish: %s", h.amlfs("status", mp2).stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	done := make(chan error, 1)
	go func() {
		_, err := os.ReadFile(filepath.Join(mp2, "empty3"))
		done <- err
	}()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("an open of an empty restored file hangs")
	}
	if r := h.unmount(mp2); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// TestNativeSaveKeepsPlaceholders: a checkpoint of a lazily restored tree
// fetches none of the files it has not changed: their objects are reused.
// (A save's open of a placeholder would fill it, now that opens do.)
func TestNativeSaveKeepsPlaceholders(t *testing.T) {
	want, h, mp2 := lazyNative(t, newEnv(t))
	pending := jsonInt(t, h.amlfs("status", mp2, "--json").stdout, "pendingFiles")
	must(t, os.WriteFile(filepath.Join(mp2, "new.txt"), []byte("new"), 0o644))
	if r := h.amlfs("commit", mp2); r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	if n := jsonInt(t, h.amlfs("status", mp2, "--json").stdout, "pendingFiles"); n != pending {
		t.Errorf("the commit fetched %d of %d files it did not change", pending-n, pending)
	}
	if r := h.unmount(mp2); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	want["new.txt"] = []byte("new")
	h3 := h.host(t)
	checkTree(t, h3.mount("native", "--serve", "fuse", "--restore", "full"), want)
}
