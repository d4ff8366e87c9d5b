package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// destroy removes a workspace's durable state, refuses while a live lease
// is held (exit 3), and is safe to repeat; on both stores.
func TestDestroy(t *testing.T) { forEachStore(t, testDestroy) }

func testDestroy(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("gone")
	sh(t, mp, "echo data > a")
	destroy := func(extra ...string) result {
		return e.amlfs(append(append([]string{"destroy"}, e.storeFlags("gone")...), extra...)...)
	}
	if r := destroy("--yes"); r.code != 3 || !strings.Contains(r.stderr, "AML_WORKSPACE_CONFLICT") {
		t.Fatalf("destroy with a live lease: %s", r)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if !fileExists(filepath.Join(e.storeD, "gone", "workspace.json")) {
		t.Fatal("the test shows nothing: no index to destroy")
	}
	if r := destroy(); r.code != 2 {
		t.Errorf("destroy without --yes: %s", r)
	}
	if r := destroy("--yes", "--purge-cache", "--cache-dir", e.cache); r.code != 0 {
		t.Fatalf("destroy: %s", r)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.storeD, "gone")); len(ents) != 0 {
		t.Errorf("the store root for the id keeps %d entries", len(ents))
	}
	if fileExists(filepath.Join(e.storeD, "gone.lock")) {
		t.Error("the lock is still there")
	}
	if ents, _ := os.ReadDir(filepath.Join(e.cache, "workspaces")); len(ents) != 0 {
		t.Errorf("--purge-cache left %d working-tree dirs", len(ents))
	}
	if r := destroy("--yes"); r.code != 0 {
		t.Errorf("a second destroy: %s", r)
	}
	// The id starts afresh.
	mp = e.mount("gone")
	if fileExists(filepath.Join(mp, "a")) {
		t.Error("a destroyed workspace came back")
	}
	e.unmount(mp)
}

// A retried unmount reports the final state, exits 0, and saves nothing
// again.
func TestUnmountTwice(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("twice")
	sh(t, mp, "echo a > a")
	first := e.unmount(mp)
	if first.code != 0 || strings.TrimSpace(first.stdout) == "" {
		t.Fatalf("unmount: %s", first)
	}
	revs := len(readIndex(t, e, "twice").Revisions)
	second := e.unmount(mp)
	if second.code != 0 || second.stdout != first.stdout || !strings.Contains(second.stderr, "already unmounted") {
		t.Errorf("second unmount: %s (first printed %q)", second, first.stdout)
	}
	if n := len(readIndex(t, e, "twice").Revisions); n != revs {
		t.Errorf("the second unmount saved again: %d revisions, was %d", n, revs)
	}
	// Mount, unmount and remount with the same id converge.
	mp = e.mount("twice")
	if got := readFile(t, filepath.Join(mp, "a")); got != "a\n" {
		t.Errorf("after remount a = %q", got)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}
