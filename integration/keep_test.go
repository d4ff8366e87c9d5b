package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestKeptTreeAdopted: natively, a clean stop keeps the working tree, and
// the next mount of its revision in the same cache dir serves that very
// tree (same inodes, files fetched before still there, no placeholder
// made again), but only while it is the revision's tree exactly: a file
// changed behind the daemon's back (same size and mtime: only its ctime
// tells), another writer's publication, or a busy unmount's detached
// mount make the next mount restore afresh. Entries the save left out
// (ignored) are gone, as after any restore. On both stores.
func TestKeptTreeAdopted(t *testing.T) { forEachStore(t, testKeptTreeAdopted) }

func testKeptTreeAdopted(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	needNative(t, e)
	files := map[string]string{"a.txt": "alpha", "d/b.txt": "bravo", "d/c.txt": "charlie", ".gitignore": "build/\n"}
	mp := e.mount("kept", "--serve", "native")
	for p, s := range files {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(mp, p)), 0o755))
		must(t, os.WriteFile(filepath.Join(mp, p), []byte(s), 0o644))
	}
	must(t, os.Symlink("a.txt", filepath.Join(mp, "link")))
	must(t, os.MkdirAll(filepath.Join(mp, "build"), 0o755))
	must(t, os.WriteFile(filepath.Join(mp, "build/out.o"), []byte("object"), 0o644))
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	works, _ := filepath.Glob(filepath.Join(e.cache, "workspaces", "*", "*", "work"))
	if len(works) != 1 || !fileExists(filepath.Join(filepath.Dir(works[0]), "kept.json")) {
		t.Fatalf("no kept tree after a clean unmount: %v", works)
	}
	work := works[0]
	// A file is known by its handle (inode number and generation): a
	// tree restored afresh may give a.txt the number the kept one had.
	ino := func(p string) string {
		t.Helper()
		h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, p, 0)
		must(t, err)
		return fmt.Sprintf("%d:%x", h.Type(), h.Bytes())
	}
	kept := ino(filepath.Join(work, "a.txt"))
	read := func(mp, p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(mp, p))
		must(t, err)
		return string(b)
	}
	mountKept := func() string {
		t.Helper()
		mp := e.mount("kept", "--serve", "native")
		if s := serveOf(t, e, mp); s != "native" {
			t.Fatalf("serving %s, want native", s)
		}
		return mp
	}

	// Adopted: the same inodes, and nothing to fetch (a restore makes
	// every file a placeholder).
	mp = mountKept()
	if n := jsonInt(t, e.amlfs("status", mp, "--json").stdout, "pendingFiles"); n != 0 {
		t.Errorf("%d files to fetch in the adopted tree, want 0: restored afresh?", n)
	}
	if ino(filepath.Join(mp, "a.txt")) != kept {
		t.Fatal("the next mount did not serve the kept tree (a.txt is another inode)")
	}
	for p, s := range files {
		if got := read(mp, p); got != s {
			t.Errorf("%s: %q, want %q", p, got, s)
		}
	}
	if tgt, err := os.Readlink(filepath.Join(mp, "link")); err != nil || tgt != "a.txt" {
		t.Errorf("link: %q %v", tgt, err)
	}
	if fileExists(filepath.Join(mp, "build")) {
		t.Error("an ignored directory the save left out is in the adopted tree")
	}
	// A change saved: the tree kept is the new revision.
	must(t, os.WriteFile(filepath.Join(mp, "d/b.txt"), []byte("BRAVO"), 0o644))
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	mp = mountKept()
	if got := read(mp, "d/b.txt"); got != "BRAVO" || ino(filepath.Join(mp, "a.txt")) != kept {
		t.Fatalf("after a saved change: d/b.txt %q, a.txt kept %v", got, ino(filepath.Join(mp, "a.txt")) == kept)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}

	// Changed behind the daemon's back, size and mtime put back.
	c := filepath.Join(work, "d/c.txt")
	fi, err := os.Stat(c)
	must(t, err)
	must(t, os.WriteFile(c, []byte("CHARLIE"), 0o644))
	must(t, os.Chtimes(c, fi.ModTime(), fi.ModTime()))
	mp = mountKept()
	if got := read(mp, "d/c.txt"); got != "charlie" {
		t.Fatalf("a kept tree changed after its stop was served: d/c.txt %q", got)
	}
	if ino(filepath.Join(mp, "a.txt")) == kept {
		t.Fatal("a kept tree changed after its stop was adopted")
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}

	// Another writer publishes: the kept tree is not the current revision.
	kept = ino(filepath.Join(work, "a.txt"))
	h := e.host(t)
	mp2 := h.mount("kept", "--serve", "native")
	must(t, os.WriteFile(filepath.Join(mp2, "a.txt"), []byte("ALPHA"), 0o644))
	if r := h.unmount(mp2); r.code != 0 {
		t.Fatalf("unmount the other writer: %s", r)
	}
	mp = mountKept()
	if got := read(mp, "a.txt"); got != "ALPHA" {
		t.Fatalf("after another writer published: a.txt %q, want its ALPHA", got)
	}

	// A busy unmount detaches the mount: a process in it could still
	// change the tree, which is not kept.
	f, err := os.Open(filepath.Join(mp, "d/b.txt"))
	must(t, err)
	defer f.Close()
	start := time.Now()
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if time.Since(start) < 2*time.Second {
		t.Log("the unmount was not busy: the test shows less than it should")
	}
	if fileExists(filepath.Join(filepath.Dir(work), "kept.json")) {
		t.Fatal("a tree still open through a detached mount was kept")
	}
	f.Close()
	mp = mountKept()
	if got := read(mp, "d/b.txt"); got != "BRAVO" {
		t.Fatalf("after a busy unmount: d/b.txt %q", got)
	}
	if strings.Contains(read(mp, "a.txt"), "alpha") {
		t.Fatal("an old revision came back")
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}

	// --no-keep: the tree goes at every stop. (With --json, the mount
	// prints its status once ready, as status --json does.)
	r := e.mountAt(mp, "kept", "--serve", "native", "--no-keep", "--json")
	var st struct {
		ID, Serve, Socket string
		PendingFiles      *int
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.ID != "kept" || st.Serve != "native" || st.Socket == "" || st.PendingFiles == nil {
		t.Fatalf("mount --daemon --json: %s", r)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if fileExists(filepath.Join(filepath.Dir(work), "kept.json")) || fileExists(work) {
		t.Fatal("--no-keep kept the tree")
	}
}
