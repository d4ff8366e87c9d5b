package integration

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLimits: AML's limits are defaults, not walls. A 2 GiB tree fails to
// save under the default --max-bytes, naming the flag, and keeps the tree;
// raised, it saves; a load under the default refuses it, naming the flag,
// and a load with the raised limit restores it whole. --max-entries and
// --max-archive-bytes work the same way.
func TestLimits(t *testing.T) { forEachStore(t, testLimits) }

func testLimits(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("big")
	heads := map[string][]byte{}
	for _, name := range []string{"weights-1.bin", "weights-2.bin"} {
		head := make([]byte, 1<<20)
		rand.Read(head)
		heads[name] = head
		f, err := os.Create(filepath.Join(mp, name))
		must(t, err)
		_, err = f.Write(head)
		must(t, err)
		must(t, f.Truncate(1<<30)) // 1 GiB: random first MiB, then a hole
		_, err = f.WriteAt([]byte("tail"), 1<<30-4)
		must(t, err)
		must(t, f.Close())
	}
	r := e.unmount(mp)
	if r.code != 4 || !strings.Contains(r.stderr, "LIMIT_EXCEEDED") || !strings.Contains(r.stderr, "--max-bytes") {
		t.Fatalf("save of 2 GiB under the default limit: %s", r)
	}
	// The tree is kept; raised, the limit lets it save.
	mp = e.mount("big", "--max-bytes", "3GiB")
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save of 2 GiB with --max-bytes 3GiB: %s", r)
	}
	h := e.host(t)
	r = h.mountAt(filepath.Join(h.root, "mnt-big"), "big")
	if r.code == 0 || !strings.Contains(r.stderr, "LIMIT_EXCEEDED") || !strings.Contains(r.stderr, "--max-bytes") {
		t.Fatalf("load of 2 GiB under the default limit: %s", r)
	}
	mp = h.mount("big", "--max-bytes", "3GiB")
	for name, head := range heads {
		f, err := os.Open(filepath.Join(mp, name))
		must(t, err)
		got := make([]byte, len(head))
		_, err = f.ReadAt(got, 0)
		must(t, err)
		tail := make([]byte, 4)
		_, err = f.ReadAt(tail, 1<<30-4)
		must(t, err)
		fi, err := f.Stat()
		must(t, err)
		f.Close()
		if !bytes.Equal(got, head) || string(tail) != "tail" || fi.Size() != 1<<30 {
			t.Errorf("%s after restore: size %d, head equal %v, tail %q", name, fi.Size(), bytes.Equal(got, head), tail)
		}
	}
	if r := h.unmount(mp, "--no-save"); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}

	// Entries.
	mp = e.mount("many", "--max-entries", "20")
	for i := range 30 {
		must(t, os.WriteFile(filepath.Join(mp, fmt.Sprint("f", i)), nil, 0o644))
	}
	if r := e.amlfs("commit", mp); r.code != 4 || !strings.Contains(r.stderr, "LIMIT_EXCEEDED") || !strings.Contains(r.stderr, "--max-entries") {
		t.Errorf("commit of 30 entries under --max-entries 20: %s", r)
	}
	if r := e.unmount(mp, "--no-save"); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	mp = e.mount("many", "--max-entries", "40")
	for i := range 30 {
		must(t, os.WriteFile(filepath.Join(mp, fmt.Sprint("f", i)), nil, 0o644))
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save of 30 entries under --max-entries 40: %s", r)
	}
	r = h.mountAt(filepath.Join(h.root, "mnt-many"), "many", "--max-entries", "20")
	if r.code == 0 || !strings.Contains(r.stderr, "--max-entries") {
		t.Errorf("load of 30 entries under --max-entries 20: %s", r)
	}

	// Archive bytes: 2 MiB that do not compress, under a 1 MiB bound.
	mp = e.mount("arch", "--format", "archive", "--max-archive-bytes", "1MiB")
	noise := make([]byte, 2<<20)
	rand.Read(noise)
	must(t, os.WriteFile(filepath.Join(mp, "noise"), noise, 0o644))
	if r := e.amlfs("commit", mp); r.code != 4 || !strings.Contains(r.stderr, "LIMIT_EXCEEDED") || !strings.Contains(r.stderr, "--max-archive-bytes") {
		t.Errorf("commit of a 2 MiB archive under --max-archive-bytes 1MiB: %s", r)
	}
	if r := e.unmount(mp, "--no-save"); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// TestManyInodes: the serving layer holds a descriptor per inode the
// kernel knows, so a daemon started under a low descriptor limit (here
// 2,048, as a container runtime may set) still serves a tree of more
// files than that: it raises its own limit.
func TestManyInodes(t *testing.T) {
	needTools(t, "util-linux", "prlimit")
	e := newEnv(t)
	e.bin = filepath.Join(t.TempDir(), "amlfs-lowlimit")
	must(t, os.WriteFile(e.bin, []byte("#!/bin/sh\nexec prlimit --nofile=2048:2048 "+amlfsBin+" \"$@\"\n"), 0o755))
	mp := e.mount("many-inodes")
	for d := range 10 {
		dir := filepath.Join(mp, fmt.Sprint("d", d))
		must(t, os.Mkdir(dir, 0o755))
		for f := range 600 {
			must(t, os.WriteFile(filepath.Join(dir, fmt.Sprint("f", f)), []byte("x"), 0o644))
		}
	}
	n := 0
	must(t, filepath.Walk(mp, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n++
		}
		return err
	}))
	if n != 6000 {
		t.Errorf("walked %d files, want 6000", n)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// TestKernelCachePastBudget: through FUSE, a daemon under a low descriptor
// limit (2,048: a budget of 1,024 held open) keeps the kernel's caches of
// a tree of 6,000 files: inodes past the budget are held by file handle,
// not evicted, so a second walk of the tree makes no LOOKUP and the
// kernel is sent no FORGET, and the daemon's descriptors stay within its
// limit. Every file still reads back through its node.
func TestKernelCachePastBudget(t *testing.T) {
	needTools(t, "util-linux", "prlimit")
	if os.Geteuid() != 0 {
		t.Skip("file handles open again only with CAP_DAC_READ_SEARCH")
	}
	e := newEnv(t)
	e.bin = filepath.Join(t.TempDir(), "amlfs-lowlimit")
	must(t, os.WriteFile(e.bin, []byte("#!/bin/sh\nexec prlimit --nofile=2048:2048 "+amlfsBin+" \"$@\"\n"), 0o755))
	addr := freePort(t)
	mp := e.mount("budget", "--serve", "fuse", "--metrics-addr", addr)
	for d := range 10 {
		dir := filepath.Join(mp, fmt.Sprint("d", d))
		must(t, os.Mkdir(dir, 0o755))
		for f := range 600 {
			must(t, os.WriteFile(filepath.Join(dir, fmt.Sprint("f", f)), []byte(fmt.Sprint(d, "/", f)), 0o644))
		}
	}
	walk := func() int {
		n := 0
		must(t, filepath.Walk(mp, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				n++
			}
			return err
		}))
		return n
	}
	url := "http://" + addr + "/metrics"
	walk()
	time.Sleep(time.Second) // any shedding, or forgetting, under way ends
	before := scrape(t, url)
	if n := walk(); n != 6000 {
		t.Errorf("walked %d files, want 6000", n)
	}
	after := scrape(t, url)
	lookups := after[`amlfs_fuse_request_duration_seconds_count{op="lookup"}`] - before[`amlfs_fuse_request_duration_seconds_count{op="lookup"}`]
	forgets := after[`amlfs_fuse_request_duration_seconds_count{op="forget"}`]
	if lookups > 10 || forgets > 0 {
		t.Errorf("a second walk of 6,000 files made %v LOOKUPs, and %v FORGETs were sent: the kernel's caches were evicted", lookups, forgets)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", e.pid(mp)))
	must(t, err)
	if len(fds) > 2048 {
		t.Errorf("the daemon holds %d descriptors, past its limit", len(fds))
	}
	for d := range 10 {
		for f := range 600 {
			got, err := os.ReadFile(filepath.Join(mp, fmt.Sprint("d", d), fmt.Sprint("f", f)))
			if err != nil || string(got) != fmt.Sprint(d, "/", f) {
				t.Fatalf("d%d/f%d: %q, %v", d, f, got, err)
			}
		}
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}
