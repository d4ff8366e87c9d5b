package integration

import (
	"strings"
	"testing"
)

// TestCommitOptions: a commit can say, for itself, what to save and how
// many revisions to keep (AML's per-save include, exclude, gitignore and
// retention), over the mount's flags; a tree unchanged since a save made
// with another selection is saved again, not skipped.
func TestCommitOptions(t *testing.T) { forEachStore(t, testCommitOptions) }

func testCommitOptions(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("opts", "--retention", "5")
	sh(t, mp, `mkdir src && echo a > src/a.go && echo b > build.log && echo c > c.tmp && echo 'c.tmp' > .gitignore`)
	entries := func(rev string) string {
		t.Helper()
		r := e.amlfs(append([]string{"revisions", "show", rev}, e.storeFlags("opts")...)...)
		if r.code != 0 {
			t.Fatalf("revisions show %s: %s", rev, r)
		}
		return r.stdout
	}
	commit := func(args ...string) string {
		t.Helper()
		r := e.amlfs(append(append([]string{"commit"}, args...), mp)...)
		if r.code != 0 {
			t.Fatalf("commit %v: %s", args, r)
		}
		return strings.TrimSpace(r.stdout)
	}
	rev1 := commit("--exclude", "*.log")
	if s := entries(rev1); strings.Contains(s, "build.log") || strings.Contains(s, "c.tmp") || !strings.Contains(s, "src/a.go") {
		t.Errorf("commit --exclude '*.log' saved:\n%s", s)
	}
	// Nothing changed, but the mount's own selection takes build.log.
	rev2 := commit()
	if rev2 == rev1 || !strings.Contains(entries(rev2), "build.log") {
		t.Errorf("a commit with the mount's selection after one with another: %s (was %s)\n%s", rev2, rev1, entries(rev2))
	}
	if again := commit(); again != rev2 {
		t.Errorf("an unchanged tree with the same selection was saved again: %s, then %s", rev2, again)
	}
	rev3 := commit("--gitignore=false", "--include", "c.tmp", "--include", "src/**")
	if s := entries(rev3); !strings.Contains(s, "c.tmp") || !strings.Contains(s, "src/a.go") || strings.Contains(s, "build.log") {
		t.Errorf("commit --gitignore=false --include c.tmp --include 'src/**' saved:\n%s", s)
	}
	sh(t, mp, `echo more > src/b.go`)
	rev4 := commit("--retention", "1")
	if idx := readIndex(t, e, "opts"); idx.Current != rev4 || len(idx.Revisions) != 1 {
		t.Errorf("commit --retention 1 kept %d revisions (current %s, want %s)", len(idx.Revisions), idx.Current, rev4)
	}
	for _, bad := range [][]string{{"--retention", "0"}, {"--exclude", "["}, {"--fork", "other", "--exclude", "x"}} {
		if r := e.amlfs(append(append([]string{"commit"}, bad...), mp)...); r.code != 2 {
			t.Errorf("commit %v: want exit 2 (INVALID_CONFIG): %s", bad, r)
		}
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}
