package tools

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeDirect is a tree beside a "mount" (another directory), so a test can
// tell which one answered a call.
type fakeDirect struct {
	dir     string
	lazy    bool
	hidden  string // a live mount's prefix
	writing string // a file the mount has open for writing

	mu      sync.Mutex
	holds   int
	changed []string
}

func (f *fakeDirect) Root() (*os.File, bool) {
	if f.lazy {
		return nil, false
	}
	fd, err := unix.Open(f.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	return os.NewFile(uintptr(fd), f.dir), true
}

func (f *fakeDirect) Serves(rel string, subtree bool) bool {
	if rel == f.hidden || strings.HasPrefix(rel, f.hidden+"/") {
		return false
	}
	return !subtree || (rel != "." && !strings.HasPrefix(f.hidden, rel+"/"))
}

func (f *fakeDirect) Hold() func() {
	f.mu.Lock()
	f.holds++
	f.mu.Unlock()
	return func() {}
}

func (f *fakeDirect) Changed(rel string) {
	f.mu.Lock()
	f.changed = append(f.changed, rel)
	f.mu.Unlock()
}

func (f *fakeDirect) Writing(fd int) bool {
	var a, b unix.Stat_t
	unix.Fstat(fd, &a)
	return f.writing != "" && unix.Stat(filepath.Join(f.dir, f.writing), &b) == nil && a.Ino == b.Ino
}

// TestDirect: a call runs on the tree where it serves the call's paths as
// the mount does, and through the mount otherwise: while the tree is
// lazy, under a live mount's prefix, through a symlink, and on a file
// the mount has open for writing. A change holds a checkpoint back and
// drops the kernel's caches of what it changed.
func TestDirect(t *testing.T) {
	mountDir, treeDir := filepath.Join(t.TempDir(), "mount"), filepath.Join(t.TempDir(), "tree")
	for dir, who := range map[string]string{mountDir: "mount", treeDir: "tree"} {
		os.MkdirAll(filepath.Join(dir, "live"), 0o755)
		os.MkdirAll(filepath.Join(dir, "d"), 0o755)
		os.WriteFile(filepath.Join(dir, "a.txt"), []byte(who), 0o644)
		os.WriteFile(filepath.Join(dir, "busy.txt"), []byte(who), 0o644)
		os.WriteFile(filepath.Join(dir, "live/x"), []byte(who), 0o644)
		os.WriteFile(filepath.Join(dir, "d/g.txt"), []byte("needle "+who), 0o644)
		os.Symlink("a.txt", filepath.Join(dir, "link"))
	}
	fd := &fakeDirect{dir: treeDir, hidden: "live", writing: "busy.txt"}
	fs := New(mountDir, "/ws")
	fs.ServeDirect(fd)
	read := func(p string) string {
		t.Helper()
		out, e := call(t, fs, "read_file", `{"path":"`+p+`"}`)
		if e != nil {
			t.Fatalf("read %s: %v", p, e)
		}
		return out["content"].(string)
	}
	for p, want := range map[string]string{"a.txt": "tree", "/ws/a.txt": "tree", "live/x": "mount", "link": "mount", "busy.txt": "mount", "d/../a.txt": "tree"} {
		if got := read(p); got != want {
			t.Errorf("read %s answered by the %s, want the %s", p, got, want)
		}
	}
	fd.lazy = true
	if got := read("a.txt"); got != "mount" {
		t.Errorf("a lazy tree answered")
	}
	fd.lazy = false

	// Errors are the mount's.
	if _, e := call(t, fs, "read_file", `{"path":"../x"}`); e == nil || e.Code != CodeEscape {
		t.Errorf("escape: %v", e)
	}
	if _, e := call(t, fs, "read_file", `{"path":"missing"}`); e == nil || e.Code != "ENOENT" {
		t.Errorf("missing: %v", e)
	}

	// A walk that would enter a live mount's prefix goes through the mount.
	out, e := call(t, fs, "grep", `{"pattern":"needle"}`)
	if e != nil || !strings.Contains(out["matches"].([]any)[0].(map[string]any)["text"].(string), "mount") {
		t.Errorf("grep of the root: %v %v", out, e)
	}
	out, e = call(t, fs, "grep", `{"pattern":"needle","path":"d"}`)
	if e != nil || !strings.Contains(out["matches"].([]any)[0].(map[string]any)["text"].(string), "tree") {
		t.Errorf("grep of d: %v %v", out, e)
	}

	// Changes: on the tree, held, and their entries invalidated.
	if _, e := call(t, fs, "write_file", `{"path":"new/deep.txt","content":"x"}`); e != nil {
		t.Fatal(e)
	}
	if _, err := os.Stat(filepath.Join(treeDir, "new/deep.txt")); err != nil {
		t.Errorf("write_file did not land on the tree: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mountDir, "new")); err == nil {
		t.Errorf("write_file went through the mount too")
	}
	if _, e := call(t, fs, "write_file", `{"path":"live/y","content":"x"}`); e != nil {
		t.Fatal(e)
	}
	if _, err := os.Stat(filepath.Join(mountDir, "live/y")); err != nil {
		t.Errorf("a write under a live mount's prefix did not go through the mount: %v", err)
	}
	fd.mu.Lock()
	defer fd.mu.Unlock()
	if fd.holds != 2 {
		t.Errorf("%d holds for 2 writes", fd.holds)
	}
	for _, want := range []string{"new", "new/deep.txt"} {
		if !slices.Contains(fd.changed, want) {
			t.Errorf("changed %v lacks %s", fd.changed, want)
		}
	}
}
