package integration

import (
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGitStatusAfterRestore: a lazy restore on a fresh cache dir shows
// each untouched file with the stat data git's index holds (inode number,
// ctime, mtime, size, owner), so the first git status reads no working
// file: it fetches no file object outside .git, and takes about as long
// as the second. A change to a file then shows its real ctime. Served
// natively, the same holds with git's core.checkStat minimal.
func TestGitStatusAfterRestore(t *testing.T) {
	needTools(t, "git", "git")
	srv, proxy, e := proxiedS3Env(t)
	mp := e.mount("git")
	sh(t, mp, `git init -q -b main .
for d in $(seq 0 9); do mkdir -p src/d$d; for f in $(seq 0 49); do echo "package d$d // $f" > src/d$d/f$f.go; done; done
ln -s src/d0/f0.go link.go
git add -A && git commit -q -m init
sleep 1.1 # past git's racy-clean window
git status --porcelain >/dev/null`)
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

	other := newS3EnvAt(t, srv, e.prefix)
	other.storeArgs = e.storeArgs
	mp2 := other.mount("git", "--prefetch", "0")
	proxy.reset()
	if serveOf(t, other, mp2) == "native" {
		// Served natively, the restored files show their own inode
		// numbers and ctimes, not the saved ones (README: Serving), so
		// git would rehash every file and fetch it. Git's own
		// core.checkStat minimal compares only what a restore keeps,
		// size and mtime, and the first status then reads nothing
		// outside .git, as below.
		sh(t, mp2, "git config core.checkStat minimal")
	} else if after := stats(mp2); after != before {
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
