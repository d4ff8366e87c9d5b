package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestS3Forks: eight forks of one workspace, each changed in one file and
// saved at unmount. The base has 1,000 files here (8 forks of 10,000 files
// take 80,000 copies through versitygw, 8 minutes on 2 cores; the PUT count
// does not depend on the size); AMLFS_FORK_FILES=10000 runs that by hand. Each fork's save is incremental against the
// source: at most 3 PUTs (the changed file, the manifest, the index), the
// rest copied server-side. Each fork then loads whole on a fresh cache dir,
// after the source has moved on and pruned the revision they came from.
func TestS3Forks(t *testing.T) {
	srv, proxy, e := proxiedS3Env(t)
	e.folder() // counts requests for each file's object
	start := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	mp := e.mount("base")
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("AMLFS_FORK_FILES")); err == nil && v >= 1000 && v%100 == 0 {
		n = v
	}
	sh(t, mp, fmt.Sprintf(`for d in $(seq 0 99); do mkdir d$d; for f in $(seq 0 %d); do echo "file $d/$f" > d$d/f$f.txt; done; done; test $(find . -type f | wc -l) = %d`, n/100-1, n))
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save the base: %s", r)
	}
	baseRev := readIndex(t, e, "base").Current
	phase("base saved")

	const forks = 8
	mps := make([]string, forks)
	for i := range forks {
		mps[i] = e.mount(fmt.Sprintf("fork%d", i), "--from", "base", "--prefetch", "0")
		sh(t, mps[i], fmt.Sprintf("echo fork %d > d%d/f%d.txt", i, i, i))
	}
	if r := e.amlfs("status", mps[0]); !strings.Contains(r.stdout, `(of workspace "base": a fork, not saved yet)`) {
		t.Errorf("status of a fork: %s", r)
	}
	phase("forks mounted and changed")
	proxy.reset()
	var wg sync.WaitGroup
	res := make([]result, forks)
	for i := range forks {
		wg.Add(1)
		go func() { defer wg.Done(); res[i] = e.unmount(mps[i]) }()
	}
	wg.Wait()
	proxy.mu.Lock()
	keys, copies := proxy.putKeys, proxy.copies
	proxy.mu.Unlock()
	for i := range forks {
		if res[i].code != 0 {
			t.Fatalf("fork %d: save: %s", i, res[i])
		}
		var puts []string
		for _, k := range keys {
			if strings.Contains(k, fmt.Sprintf("/fork%d/", i)) {
				puts = append(puts, k)
			}
		}
		if len(puts) > 3 {
			t.Errorf("fork %d: %d PUTs, want at most 3: %v", i, len(puts), puts)
		}
		if idx := readIndex(t, e, fmt.Sprintf("fork%d", i)); len(idx.Revisions) != 1 {
			t.Errorf("fork %d: index %+v", i, idx)
		}
	}
	if copies != forks*(n-1) {
		t.Errorf("server-side copies: %d, want %d", copies, forks*(n-1))
	}
	phase("forks saved")
	// The fork is recorded; the source is unchanged.
	r := e.amlfs(append([]string{"revisions", "show", "current"}, e.storeFlags("fork3")...)...)
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf(`forked from workspace "base", revision %s`, baseRev)) {
		t.Errorf("revisions show of a fork: %s", r)
	}
	if idx := readIndex(t, e, "base"); idx.Current != baseRev || len(idx.Revisions) != 1 {
		t.Errorf("the source changed: %+v", idx)
	}
	// The source moves on and prunes the revision the forks came from.
	mp = e.mount("base")
	sh(t, mp, "echo moved on > d0/f0.txt")
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save the base again: %s", r)
	}
	if idx := readIndex(t, e, "base"); len(idx.Revisions) != 1 || idx.Current == baseRev {
		t.Fatalf("the source did not prune: %+v", idx)
	}
	phase("base moved on")
	other := newS3EnvAt(t, srv, e.prefix)
	other.folder() // a test of the folder layout
	other.storeArgs = e.storeArgs
	for _, i := range []int{0, 5, 7} {
		id := fmt.Sprintf("fork%d", i)
		m := other.mount(id, "--restore", "full")
		got := readFile(t, filepath.Join(m, fmt.Sprintf("d%d/f%d.txt", i, i)))
		if got != fmt.Sprintf("fork %d\n", i) {
			t.Errorf("%s: changed file %q", id, got)
		}
		if out := sh(t, m, `find . -type f | wc -l; cat d9/f9.txt d0/f0.txt`); out != fmt.Sprintf("%d\nfile 9/9\n%s", n, map[bool]string{true: "fork 0\n", false: "file 0/0\n"}[i == 0]) {
			t.Errorf("%s after the source pruned: %q", id, out)
		}
		if r := other.unmount(m, "--no-save"); r.code != 0 {
			t.Fatalf("unmount %s: %s", id, r)
		}
		phase(id + " loaded whole")
	}
}

// TestCommitFork: commit --fork publishes the mounted tree, unsaved changes
// and all, as the first revision of a new workspace, hard-linking unchanged
// files on a file store, and leaves the mounted workspace as it was: its
// current revision, its unsaved changes, its lease. A fork of an existing
// workspace, or of itself, is refused.
func TestCommitFork(t *testing.T) {
	e := newEnv(t)
	e.folder() // a test of the folder layout
	mp := e.mount("main")
	sh(t, mp, `mkdir -p src && for f in $(seq 0 49); do echo $f > src/f$f; done`)
	r := e.amlfs("commit", mp)
	if r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	mainRev := strings.TrimSpace(r.stdout)
	sh(t, mp, "echo unsaved > src/f7 && echo new > new.txt")
	r = e.amlfs("commit", mp, "--fork", "experiment")
	if r.code != 0 {
		t.Fatalf("commit --fork: %s", r)
	}
	forkRev := strings.TrimSpace(r.stdout)
	if !strings.Contains(r.stderr, `workspace "experiment"`) {
		t.Errorf("commit --fork output: %s", r)
	}
	if idx := readIndex(t, e, "main"); idx.Current != mainRev || len(idx.Revisions) != 1 {
		t.Errorf("the mounted workspace changed: %+v", idx)
	}
	if idx := readIndex(t, e, "experiment"); idx.Current != forkRev {
		t.Errorf("the fork's index: %+v", idx)
	}
	// Unchanged files are the source's objects, hard-linked.
	ino := func(id, rev, p string) uint64 {
		var st syscall.Stat_t
		must(t, syscall.Stat(filepath.Join(e.storeD, id, "revisions", rev, "files", p), &st))
		return st.Ino
	}
	if ino("main", mainRev, "src/f3") != ino("experiment", forkRev, "src/f3") {
		t.Error("an unchanged file was not hard-linked from the source")
	}
	r = e.amlfs(append([]string{"revisions", "show", forkRev}, e.storeFlags("experiment")...)...)
	if !strings.Contains(r.stdout, fmt.Sprintf(`forked from workspace "main", revision %s`, mainRev)) {
		t.Errorf("revisions show: %s", r)
	}
	for _, id := range []string{"experiment", "main"} {
		if r := e.amlfs("commit", mp, "--fork", id); r.code != 2 {
			t.Errorf("commit --fork %s: %s", id, r)
		}
	}
	// The mounted tree is still unsaved: its own save publishes it.
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if idx := readIndex(t, e, "main"); idx.Current == mainRev {
		t.Error("the mounted workspace's changes were taken for saved")
	}
	for _, id := range []string{"main", "experiment"} {
		other := e.host(t)
		m := other.mount(id)
		if got := readFile(t, filepath.Join(m, "src/f7")) + readFile(t, filepath.Join(m, "new.txt")); got != "unsaved\nnew\n" {
			t.Errorf("%s: %q", id, got)
		}
		if r := other.unmount(m, "--no-save"); r.code != 0 {
			t.Fatal(r)
		}
	}
	// --from refuses an existing workspace, itself, and a missing source.
	for _, args := range [][]string{{"--from", "main"}, {"--from", "nothing"}, {"--from", "main@nope"}} {
		if r := e.mountAt(filepath.Join(e.root, "refused"), "experiment", args...); r.code != 2 {
			t.Errorf("mount --id experiment %v: %s", args, r)
		}
	}
	if r := e.mountAt(filepath.Join(e.root, "refused"), "main", "--from", "main"); r.code != 2 {
		t.Errorf("mount --id main --from main: %s", r)
	}
	os.RemoveAll(filepath.Join(e.root, "refused"))
}
