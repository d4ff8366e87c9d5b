package integration

import (
	"encoding/json"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGitStatusAfterRestore: a lazy restore on a fresh cache dir leaves
// git's indexes matching the restored files, so the first git status reads
// no working file: it fetches nothing outside .git, and takes about as
// long as the second. Through FUSE the mount shows each untouched file with
// the stat data git's index holds (inode number, ctime, mtime, size,
// owner); served natively, the restore refreshes the indexes instead: the
// repository's own, a linked worktree's and a submodule's. git diff-files,
// which compares stat data only, lists nothing in any of them. A change to
// a file then shows its real ctime, and git sees it.
func TestGitStatusAfterRestore(t *testing.T) {
	needTools(t, "git", "git")
	srv, proxy, e := proxiedS3Env(t)
	mp := e.mount("git")
	sh(t, mp, `git init -q -b main .
for d in $(seq 0 9); do mkdir -p src/d$d; for f in $(seq 0 49); do echo "package d$d // $f" > src/d$d/f$f.go; done; done
ln -s src/d0/f0.go link.go
git add -A && git commit -q -m init
git worktree add -q -b other wt2 && echo wt2 >> .git/info/exclude && echo subsrc >> .git/info/exclude
git init -q -b main subsrc && (cd subsrc && echo sub > s.txt && mkdir -p x && echo y > x/y.txt && git add -A && git commit -q -m sub)
git -c protocol.file.allow=always submodule add -q ./subsrc sub && git commit -q -m sub
sleep 1.1 # past git's racy-clean window
git status --porcelain >/dev/null && git -C wt2 status --porcelain >/dev/null && git -C sub status --porcelain >/dev/null`)
	// What git's index compares, as the mount shows it: inode, ctime,
	// mtime, size, uid, gid.
	stats := func(dir string) string {
		t.Helper()
		return sh(t, dir, `find src link.go -name 'f1*' -o -name link.go | sort | xargs stat -c '%n %i %.9Z %.9Y %s %u %g'`)
	}
	before := stats(mp)
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}

	// A fresh host, at the same path (a linked worktree records its
	// path).
	other := newS3EnvAt(t, srv, e.prefix)
	other.storeArgs = e.storeArgs
	mp2 := mp
	if r := other.mountAt(mp2, "git", "--prefetch", "0"); r.code != 0 {
		t.Fatalf("mount: %s", r)
	}
	proxy.reset()
	gitFiles := strings.Count(sh(t, mp2, "find .git -type f"), "\n") + 1
	pendingBefore := pendingFiles(t, other, mp2)
	// git diff-files compares stat data only: a file whose entry does not
	// match it is listed, whatever its bytes.
	for _, dir := range []string{".", "wt2", "sub"} {
		if out := sh(t, filepath.Join(mp2, dir), "git diff-files --name-only"); out != "" {
			t.Errorf("after the restore (%s), git's index in %s does not match: %s", serveOf(t, other, mp2), dir, firstLines(out, 3))
		}
	}
	if serveOf(t, other, mp2) == "fuse" && stats(mp2) != before {
		after := stats(mp2)
		b, a := strings.Split(before, "\n"), strings.Split(after, "\n")
		for i := range min(len(a), len(b)) {
			if a[i] != b[i] {
				t.Fatalf("restored stat data differ (of %d lines):\nbefore %s\nafter  %s", len(b), b[i], a[i])
			}
		}
		t.Fatalf("restored stat data differ: %d lines, then %d", len(b), len(a))
	}
	timeIt := func() time.Duration {
		start := time.Now()
		if out := sh(t, mp2, "git status --porcelain"); out != "" {
			t.Fatalf("git status after restore: %q", out)
		}
		return time.Since(start)
	}
	first := timeIt()
	if fetched := pendingBefore - pendingFiles(t, other, mp2); fetched > gitFiles {
		t.Errorf("the first git status fetched %d files; .git has only %d", fetched, gitFiles)
	}
	proxy.mu.Lock()
	var worktree []string
	for _, k := range proxy.getKeys {
		if k, err := url.PathUnescape(k); err == nil && !strings.Contains(k, "/files/.git/") {
			worktree = append(worktree, k)
		}
	}
	proxy.mu.Unlock()
	if len(worktree) > 0 {
		t.Errorf("the first git status fetched %d working files, e.g. %s", len(worktree), worktree[0])
	}
	second := timeIt()
	t.Logf("git status after a lazy restore: first %v, second %v", first, second)
	if first > 2*second+500*time.Millisecond {
		t.Errorf("first git status %v, over twice the second %v", first, second)
	}

	// New files never show a restored file's number.
	sh(t, mp2, `mkdir new && for f in $(seq 0 299); do echo $f > new/$f; done`)
	if dup := sh(t, mp2, `find . -path ./.git -prune -o -printf '%i\n' | sort | uniq -d`); dup != "" {
		t.Errorf("inode numbers shown twice: %s", dup)
	}
	// A changed file shows its real ctime, and git sees the change.
	f := filepath.Join(mp2, "src", "d3", "f7.go")
	old := sh(t, mp2, "stat -c '%i %.9Z' src/d3/f7.go")
	sh(t, mp2, "echo changed >> src/d3/f7.go")
	now := sh(t, mp2, "stat -c '%i %.9Z' src/d3/f7.go")
	if strings.Fields(old)[0] != strings.Fields(now)[0] || strings.Fields(old)[1] == strings.Fields(now)[1] {
		t.Errorf("after a write, %s shows %q (was %q): same number, new ctime expected", f, now, old)
	}
	if out := sh(t, mp2, "git status --porcelain src"); strings.TrimSpace(out) != "M src/d3/f7.go" {
		t.Errorf("git status after a change: %q", out)
	}
	if out, err := exec.Command("git", "-C", mp2, "fsck", "--no-progress").CombinedOutput(); err != nil {
		t.Errorf("git fsck: %v\n%s", err, out)
	}
	if r := other.unmount(mp2); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// pendingFiles is the count of lazily restored files not fetched yet, as
// amlfs status --json reports it.
func pendingFiles(t *testing.T, e *env, mp string) int {
	t.Helper()
	r := e.amlfs("status", mp, "--json")
	var st struct {
		PendingFiles int `json:"pendingFiles"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
		t.Fatalf("status: %s", r)
	}
	return st.PendingFiles
}

func firstLines(s string, n int) string {
	l := strings.SplitN(s, "\n", n+1)
	return strings.Join(l[:min(n, len(l))], "\n")
}
