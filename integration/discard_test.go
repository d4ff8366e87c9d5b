package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A stop does not wait while the file system frees the working tree: the
// tree is renamed aside at once and removed by a process of its own, and a
// discarded tree a killed remover left is removed by the next mount.
// Through FUSE: natively a clean stop keeps the tree for the next mount
// (TestKeptTreeAdopted).
func TestStopDiscardsTreeAside(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("discard", "--serve", "fuse")
	for i := range 400 {
		p := filepath.Join(mp, fmt.Sprintf("d%d/f%d", i%20, i))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte("bytes"), 0o644))
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	slots, _ := filepath.Glob(filepath.Join(e.cache, "workspaces", "*", "*"))
	if len(slots) == 0 {
		t.Fatal("the test shows nothing: no slot in the cache dir")
	}
	left := func(pattern string) []string {
		var out []string
		for _, s := range slots {
			m, _ := filepath.Glob(filepath.Join(s, pattern))
			out = append(out, m...)
		}
		return out
	}
	if w := left("work"); len(w) != 0 {
		t.Fatalf("the working tree is still in place after a saved unmount: %v", w)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(left("trash-*")) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if tr := left("trash-*"); len(tr) != 0 {
		t.Fatalf("the discarded tree was never removed: %v", tr)
	}
	// A remover killed before it finished: the next mount sweeps it.
	planted := filepath.Join(slots[0], "trash-1-1")
	must(t, os.MkdirAll(filepath.Join(planted, "a", "b"), 0o755))
	must(t, os.WriteFile(filepath.Join(planted, "a", "b", "f"), []byte("x"), 0o644))
	mp = e.mount("discard", "--serve", "fuse")
	deadline = time.Now().Add(30 * time.Second)
	for fileExists(planted) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if fileExists(planted) {
		t.Error("a discarded tree left in the slot was not swept by the next mount")
	}
	if got, err := os.ReadFile(filepath.Join(mp, "d3/f3")); err != nil || string(got) != "bytes" {
		t.Fatalf("the saved tree after the sweep: %q %v", got, err)
	}
}
