package integration

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCrashRecovery kills the daemon with SIGKILL while the workspace holds
// unsaved, fsync'd work. The next mount of the same id and cache dir cleans
// the dead mount, takes over the dead process's lease (fresh, so only
// because its slot proves it dead), resumes the tree byte for byte, and
// says so; --discard-unsaved throws such a tree away instead.
func TestCrashRecovery(t *testing.T) { forEachStore(t, testCrashRecovery) }

func testCrashRecovery(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("crashy")
	sh(t, mp, `git init -q repo && cd repo && echo one > a && git add a && git commit -qm one`)
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit: %s", r)
	}

	// Unsaved work: fsync'd files of several sizes, a rename, a removal,
	// a chmod and a git commit.
	for i, size := range []int{0, 1, 4096, 1 << 20, 9<<20 + 7} {
		writeSynced(t, filepath.Join(mp, "data", "f"+string(rune('0'+i))), size)
	}
	sh(t, mp, `mv data/f1 data/moved && chmod 600 data/f2 && rm repo/a && cd repo && git add -A && echo two > b && git add b && git commit -qm two`)
	want := treeDigest(t, mp, nil)
	e.crash(mp)
	// A FUSE mount is left dead, for the next mount to clean; a native
	// one its keeper detached.
	says := []string{"taking over the workspace lease of pid", "resuming unsaved work"}
	if isMounted(mp) {
		says = append(says, "stale mount")
	}

	r := e.mountAt(mp, "crashy")
	if r.code != 0 {
		t.Fatalf("mount after the crash: %s", r)
	}
	for _, say := range says {
		if !strings.Contains(r.stderr, say) {
			t.Errorf("the remount does not say %q:\n%s", say, r.stderr)
		}
	}
	if d := diffDigests(want, treeDigest(t, mp, nil)); len(d) > 0 {
		t.Fatalf("the resumed tree differs from the one before the crash: %v", d)
	}
	sh(t, mp, `cd repo && git fsck --no-progress && test "$(git log --format=%s | head -1)" = two`)
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	// The resumed tree is what the next mount restores from the store,
	// with a cache dir of its own (another host).
	other := *e
	other.cache = filepath.Join(t.TempDir(), "cache")
	mp2 := other.mount("crashy")
	if d := diffDigests(want, treeDigest(t, mp2, nil)); len(d) > 0 {
		t.Fatalf("the revision saved after resuming differs: %v", d)
	}
	other.unmount(mp2)

	// Again, but the remount asks to discard the unsaved tree.
	mp = e.mount("crashy")
	sh(t, mp, `echo lost > lost.txt && sync`)
	e.crash(mp)
	r = e.mountAt(mp, "crashy", "--discard-unsaved")
	if r.code != 0 || !strings.Contains(r.stderr, "discarding unsaved work") {
		t.Fatalf("mount --discard-unsaved: %s", r)
	}
	if d := diffDigests(want, treeDigest(t, mp, nil)); len(d) > 0 {
		t.Fatalf("after --discard-unsaved the tree is not the last revision: %v", d)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// writeSynced writes size random bytes to p, making its directory, and
// fsyncs the file before closing it.
func writeSynced(t *testing.T, p string, size int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	rand.Read(buf)
	if _, err := f.Write(buf); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
