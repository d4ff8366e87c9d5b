package integration

import (
	"os"
	"os/exec"
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
func TestUnmountTwice(t *testing.T) { forEachStore(t, testUnmountTwice) }

func testUnmountTwice(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("twice")
	// A retried mount of the same workspace at the same place exits 0.
	if r := e.mountAt(mp, "twice"); r.code != 0 || !strings.Contains(r.stderr, "already serves") {
		t.Errorf("retried mount: %s", r)
	}
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

// commit --revision ID is idempotent on ID: concurrent retries, some of
// them killed mid-way, converge on one revision; reusing ID for other
// content exits 5 and changes nothing.
func TestCommitRevisionIdempotent(t *testing.T) { forEachStore(t, testCommitRevisionIdempotent) }

func testCommitRevisionIdempotent(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("idem", "--retention", "3")
	sh(t, mp, "for i in $(seq 1 200); do echo $i > f$i; done")
	var cmds []*exec.Cmd
	for i := range 20 {
		cmd := exec.Command(amlfsBin, "commit", mp, "--revision", "run-42")
		cmd.Env = append(os.Environ(), "AMLFS_RUNTIME_DIR="+e.runtime)
		must(t, cmd.Start())
		if i%4 == 0 {
			cmd.Process.Kill() // killed mid-way; retried below
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		cmd.Wait()
	}
	for range 3 {
		if r := e.amlfs("commit", mp, "--revision", "run-42"); r.code != 0 || strings.TrimSpace(r.stdout) != "run-42" {
			t.Fatalf("retried commit: %s", r)
		}
	}
	idx := readIndex(t, e, "idem")
	n := 0
	for _, rev := range idx.Revisions {
		if rev.ID == "run-42" {
			n++
		}
	}
	if idx.Current != "run-42" || n != 1 {
		t.Fatalf("index: current %s, %d revisions named run-42", idx.Current, n)
	}
	before, _ := os.ReadFile(filepath.Join(e.storeD, "idem", "workspace.json"))
	sh(t, mp, "echo changed > f1")
	if r := e.amlfs("commit", mp, "--revision", "run-42"); r.code != 5 || !strings.Contains(r.stderr, "REVISION_ID_CONFLICT") {
		t.Errorf("reused id for other content: %s", r)
	}
	if after, _ := os.ReadFile(filepath.Join(e.storeD, "idem", "workspace.json")); string(after) != string(before) {
		t.Error("a conflicting commit changed the index")
	}
	if r := e.unmount(mp, "--revision", "run-43"); r.code != 0 || strings.TrimSpace(r.stdout) != "run-43" {
		t.Fatalf("unmount --revision: %s", r)
	}
	// The content of run-42 is the 200 files as committed.
	mp = e.mount("idem", "--load", "run-42")
	sh(t, mp, `for i in $(seq 1 200); do test "$(cat f$i)" = "$i"; done; test "$(ls | wc -l)" = 200`)
	e.unmount(mp, "--no-save")
}
