package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestS3ArchiveCheckpoint: on S3 (versitygw), an archive workspace's
// commit after a one-file change is a handful of requests whatever the
// tree's size: the unchanged runs of the previous archive are copied by
// the server (UploadPartCopy with a range), the new members go up as one
// part, and nothing is uploaded per file. The result restores lazily on a
// fresh cache dir, each file with one ranged GET, byte for byte.
func TestS3ArchiveCheckpoint(t *testing.T) {
	start := time.Now()
	srv := startS3(t, false)
	e := newS3Env(t, srv)
	mp := e.mount("ckpt", "--format", "archive", "--load", "none")
	rng := rand.New(rand.NewPCG(7, 8))
	want := map[string][]byte{}
	for i := range 1200 {
		b := make([]byte, 16<<10)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		want[fmt.Sprintf("d%02d/f%04d", i%12, i)] = b
	}
	for p, b := range want {
		must(t, os.MkdirAll(filepath.Join(mp, filepath.Dir(p)), 0o755))
		must(t, os.WriteFile(filepath.Join(mp, p), b, 0o644))
	}
	t.Logf("%v: written", time.Since(start))
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("first commit: %s", r)
	}
	t.Logf("%v: committed", time.Since(start))
	_, at := srv.requests(t, 0)
	want["d06/f0606"] = []byte("one change") // mid-archive
	must(t, os.WriteFile(filepath.Join(mp, "d06/f0606"), want["d06/f0606"], 0o644))
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("second commit: %s", r)
	}
	ops, at := srv.requests(t, at)
	t.Logf("one-file commit of 1,200 files: %d requests %v", total(ops), ops)
	if ops["s3_UploadPartCopy"] < 2 || ops["s3_PutObject"] > 1 || total(ops) > 10 {
		t.Errorf("one-file commit made %d requests: %v", total(ops), ops)
	}
	// A fork's first save: one multipart upload (the base archive copied
	// as one part, the new index uploaded) and the create-if-absent
	// publication; no lease, no read of the new workspace's index.
	time.Sleep(500 * time.Millisecond) // the last save's prune, after it returned
	_, at = srv.requests(t, at)
	if r := e.amlfs("commit", "--fork", "ckpt-fork", mp); r.code != 0 {
		t.Fatalf("commit --fork: %s", r)
	}
	from := at
	ops, at = srv.requests(t, at)
	t.Logf("fork's first save of 1,200 files: %d requests %v", total(ops), ops)
	if ops["s3_UploadPartCopy"] != 1 || total(ops) > 5 {
		t.Errorf("fork's first save made %d requests: %v; reads: %q", total(ops), ops, srv.lines(t, from, "s3_GetObject"))
	}
	if r := e.amlfs("commit", "--fork", "ckpt-fork", mp); r.code == 0 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("a second fork of the same name: %s", r)
	}
	if r := e.unmount(mp, "--no-save"); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	// A fresh host: lazy, each file one ranged GET.
	h := e.host(t)
	mp = h.mount("ckpt", "--format", "archive", "--prefetch", "0")
	_, at = srv.requests(t, at)
	if got := readFile(t, filepath.Join(mp, "d07/f0007")); got != string(want["d07/f0007"]) {
		t.Fatalf("d07/f0007 differs")
	}
	ops, at = srv.requests(t, at)
	if ops["s3_GetObject"] != 1 || total(ops) != 1 {
		t.Errorf("one lazy read made %v", ops)
	}
	// In path order, as a checkout or a build reads a tree.
	paths := make([]string, 0, len(want))
	for p := range want {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if got := readFile(t, filepath.Join(mp, p)); got != string(want[p]) {
			t.Fatalf("%s differs after a lazy restore", p)
		}
	}
	// Neighbours in a member are fetched with it: far fewer reads than
	// files (1,200 files of 16 KiB, in members of about 256 KiB).
	if ops, _ = srv.requests(t, at); ops["s3_GetObject"] > 200 {
		t.Errorf("reading every file made %v", ops)
	}
	t.Logf("%v: read back", time.Since(start))
	if r := h.unmount(mp, "--no-save"); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}
