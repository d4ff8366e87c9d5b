package integration

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestWarmWalkAsksNothing: through FUSE, a second walk of a tree as git
// status makes it (list every directory, stat every entry, look for a
// .gitignore in each) sends the daemon nothing: the kernel keeps
// listings across opens (no OPENDIR, READDIRPLUS or RELEASEDIR) and keeps
// misses (no LOOKUP). The old daemon made three requests per directory
// and one LOOKUP per missing name at every walk. What the kernel keeps
// must still follow every change the daemon makes behind it: each tool
// call that adds, removes or renames an entry shows in the next listing
// at once.
func TestWarmWalkAsksNothing(t *testing.T) {
	e := newEnv(t)
	addr := freePort(t)
	mp := e.mount("warm", "--serve", "fuse", "--metrics-addr", addr)
	for d := range 20 {
		dir := filepath.Join(mp, fmt.Sprint("d", d))
		must(t, os.Mkdir(dir, 0o755))
		for f := range 30 {
			must(t, os.WriteFile(filepath.Join(dir, fmt.Sprint("f", f)), []byte("x"), 0o644))
		}
	}
	walk := func() int {
		n := 0
		must(t, filepath.WalkDir(mp, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if _, err := os.Lstat(filepath.Join(p, ".gitignore")); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("%s/.gitignore: %v", p, err)
				}
				return nil
			}
			if _, err := d.Info(); err != nil {
				return err
			}
			n++
			return nil
		}))
		return n
	}
	url := "http://" + addr + "/metrics"
	walk() // fills the kernel's caches
	walk() // the directories' attributes, which the fill marks stale
	time.Sleep(200 * time.Millisecond)
	before := scrape(t, url)
	if n := walk(); n != 600 {
		t.Fatalf("walked %d files, want 600", n)
	}
	after := scrape(t, url)
	for _, op := range []string{"opendir", "readdirplus", "readdir", "releasedir", "lookup", "getattr"} {
		k := `amlfs_fuse_request_duration_seconds_count{op="` + op + `"}`
		if n := after[k] - before[k]; n > 0 {
			t.Errorf("a warm walk of 21 directories sent %v %s requests, want none", n, op)
		}
	}

	// Changes made behind the kernel, by the daemon's file tools, show at
	// once in the listings it keeps.
	cl := toolClient(t, e, mp)
	names := func(rel string) []string {
		t.Helper()
		des, err := os.ReadDir(filepath.Join(mp, rel))
		must(t, err)
		var out []string
		for _, de := range des {
			out = append(out, de.Name())
		}
		return out
	}
	tool(t, cl, "write_file", map[string]any{"path": "d3/new.txt", "content": "new\n"})
	if got := names("d3"); !slices.Contains(got, "new.txt") || len(got) != 31 {
		t.Errorf("after a tool wrote d3/new.txt, ls d3 shows %d entries, with new.txt %v", len(got), slices.Contains(got, "new.txt"))
	}
	if _, err := os.Lstat(filepath.Join(mp, "d3", ".gitignore")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("d3/.gitignore: %v", err)
	}
	tool(t, cl, "write_file", map[string]any{"path": "d3/.gitignore", "content": "*.o\n"})
	if b, err := os.ReadFile(filepath.Join(mp, "d3", ".gitignore")); err != nil || string(b) != "*.o\n" {
		t.Errorf("a name the kernel had as missing, then written by a tool: %q, %v", b, err)
	}
	tool(t, cl, "delete", map[string]any{"path": "d4/f7"})
	if got := names("d4"); slices.Contains(got, "f7") || len(got) != 29 {
		t.Errorf("after a tool deleted d4/f7, ls d4 shows %d entries, f7 among them: %v", len(got), slices.Contains(got, "f7"))
	}
	tool(t, cl, "mkdir", map[string]any{"path": "d5/sub"})
	if got := names("d5"); !slices.Contains(got, "sub") {
		t.Errorf("after a tool made d5/sub, ls d5 lacks it")
	}
	tool(t, cl, "delete", map[string]any{"path": "d6", "recursive": true})
	if got := names(""); slices.Contains(got, "d6") {
		t.Errorf("after a tool deleted d6, ls / still shows it")
	}
	// Changes through the mount, as ever.
	must(t, os.Rename(filepath.Join(mp, "d7", "f1"), filepath.Join(mp, "d8", "moved")))
	if got := names("d7"); slices.Contains(got, "f1") {
		t.Errorf("after mv d7/f1 d8/moved, ls d7 still shows f1")
	}
	if got := names("d8"); !slices.Contains(got, "moved") {
		t.Errorf("after mv d7/f1 d8/moved, ls d8 lacks moved")
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}
