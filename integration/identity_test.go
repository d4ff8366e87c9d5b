package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/revision/store/s3store"
)

// TestReplacedFilesKeepNewBytes: after a lazy restore on a fresh cache
// dir, files replaced as editors, git checkout, npm and pip replace them
// (rm then create, rm then recreate at one path, a temp file renamed
// over) keep their new bytes, live, after a commit and in the revision a
// fresh cache dir restores, whether the prefetch runs or not. ext4 gives
// a freed inode number to the next file made; the engine once kept the
// placeholders not fetched yet by number, and filled the new files with
// the removed ones' old bytes.
func TestReplacedFilesKeepNewBytes(t *testing.T) {
	for _, prefetch := range []string{"0", "8"} {
		t.Run("prefetch="+prefetch, func(t *testing.T) {
			e := newEnv(t)
			const n = 60
			mp := e.mount("replaced")
			for i := 0; i < n; i++ {
				must(t, os.WriteFile(filepath.Join(mp, fmt.Sprintf("f%d", i)), []byte(fmt.Sprintf("old %d\n", i)), 0o644))
			}
			if r := e.unmount(mp); r.code != 0 {
				t.Fatalf("save: %s", r)
			}
			e.cache = filepath.Join(e.root, "cache-lazy")
			mp = e.mount("replaced", "--prefetch", prefetch)
			// A third each: rm then create another name, rm then
			// recreate, a temp file renamed over.
			sh(t, mp, `i=0
while [ $i -lt 20 ]; do rm f$i; echo "new $i" > g$i; i=$((i+1)); done
while [ $i -lt 40 ]; do rm f$i; echo "again $i" > f$i; i=$((i+1)); done
while [ $i -lt 60 ]; do echo "renamed $i" > .f$i.tmp; mv .f$i.tmp f$i; i=$((i+1)); done`)
			want := map[string]string{}
			for i := 0; i < n; i++ {
				switch {
				case i < 20:
					want[fmt.Sprintf("g%d", i)] = fmt.Sprintf("new %d\n", i)
				case i < 40:
					want[fmt.Sprintf("f%d", i)] = fmt.Sprintf("again %d\n", i)
				default:
					want[fmt.Sprintf("f%d", i)] = fmt.Sprintf("renamed %d\n", i)
				}
			}
			check := func(when, dir string) {
				t.Helper()
				bad := 0
				for p, c := range want {
					if got, err := os.ReadFile(filepath.Join(dir, p)); string(got) != c {
						if bad++; bad <= 3 {
							t.Errorf("%s: %s is %q (%v), want %q", when, p, got, err, c)
						}
					}
				}
				if bad > 0 {
					t.Errorf("%s: %d of %d files wrong", when, bad, len(want))
				}
				if des, _ := os.ReadDir(dir); len(des) != len(want) {
					t.Errorf("%s: %d entries, want %d", when, len(des), len(want))
				}
			}
			check("before the commit", mp)
			if r := e.amlfs("commit", mp); r.code != 0 {
				t.Fatalf("commit: %s", r)
			}
			check("after the commit", mp)
			if r := e.unmount(mp); r.code != 0 {
				t.Fatalf("unmount: %s", r)
			}
			e.cache = filepath.Join(e.root, "cache-fresh")
			mp = e.mount("replaced")
			check("restored on a fresh cache dir", mp)
		})
	}
}

// TestS3LostPublishReply: the conditional PUT of workspace.json lands on
// S3, and its reply is lost (the connection reset after the request).
// The commit reads the index back: it succeeds, or, while the index
// cannot be read either, exits 4 saying the outcome is unknown, and keeps
// the artifact. Either way the store loads the revision, and a commit
// --revision retried converges on it.
func TestS3LostPublishReply(t *testing.T) {
	e, px := faultyS3Env(t)
	mp := e.mount("lost")
	must(t, os.WriteFile(filepath.Join(mp, "a"), []byte("one"), 0o644))
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	// The reply lost once: the SDK's retry of the PUT gets a failed
	// precondition (its own request moved the ETag on).
	must(t, os.WriteFile(filepath.Join(mp, "a"), []byte("two"), 0o644))
	lost := &fault{kind: faultLost, match: onIndex(http.MethodPut), limit: 1}
	px.set(lost)
	if r := e.amlfs("commit", mp, "--revision", "R1"); r.code != 0 || strings.TrimSpace(r.stdout) != "R1" {
		t.Fatalf("commit with its reply lost: %s", r)
	}
	if px.acted(lost) != 1 {
		t.Fatal("the fault never acted")
	}
	e.verifyCurrent(t, "lost", map[string][]byte{"a": []byte("two")})
	// Lost, and the index unreadable for longer than the commit reads it
	// back: the outcome is unknown, and said so.
	must(t, os.WriteFile(filepath.Join(mp, "a"), []byte("three"), 0o644))
	lost = &fault{kind: faultLost, match: onIndex(http.MethodPut), limit: 1}
	px.set(lost, &fault{kind: faultStatus, status: 503, code: "ServiceUnavailable", match: onIndex(http.MethodGet), after: lost})
	r := e.amlfs("commit", mp, "--revision", "R2")
	if r.code != 4 || !strings.Contains(r.stderr, "may or may not have been published") || strings.Contains(r.stderr, "still current") {
		t.Fatalf("commit with the outcome unknown: %s", r)
	}
	px.set()
	e.verifyCurrent(t, "lost", map[string][]byte{"a": []byte("three")})
	// The retry converges: R2 is current and holds this tree.
	if r := e.amlfs("commit", mp, "--revision", "R2"); r.code != 0 || strings.TrimSpace(r.stdout) != "R2" {
		t.Fatalf("commit retried: %s", r)
	}
	must(t, os.WriteFile(filepath.Join(mp, "a"), []byte("four"), 0o644))
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit after: %s", r)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	e.verifyCurrent(t, "lost", map[string][]byte{"a": []byte("four")})
}

// TestS3LeaseLostReply: a lease's refresh whose reply is lost (it landed,
// and moved lock.json's ETag on) does not lose the lease, and its release
// still deletes lock.json: both read the lock back when their condition
// fails.
func TestS3LeaseLostReply(t *testing.T) {
	srv := startS3(t, false)
	px := startFaultProxy(t, srv.endpoint)
	e := newS3Env(t, srv)
	e.s3 = &s3Server{endpoint: px.endpoint}
	st, err := s3store.New(e.client(), s3Bucket, e.prefix, "lease")
	if err != nil {
		t.Fatal(err)
	}
	st.LockRefresh = 200 * time.Millisecond
	lostLease := make(chan error, 1)
	lease, err := st.Lock(context.Background(), func(err error) { lostLease <- err }, nil)
	if err != nil {
		t.Fatal(err)
	}
	onLock := func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/lock.json")
	}
	lost := &fault{kind: faultLost, match: onLock, limit: 1}
	px.set(lost)
	time.Sleep(2 * time.Second) // several refreshes
	if px.acted(lost) != 1 {
		t.Fatal("the fault never acted")
	}
	select {
	case err := <-lostLease:
		t.Fatalf("the lease was lost: %v", err)
	default:
	}
	if err := lease.Lost(); err != nil {
		t.Fatalf("lease: %v", err)
	}
	// The next refresh's reply lost too, just before the release.
	lost = &fault{kind: faultLost, match: onLock, limit: 1}
	px.set(lost)
	for px.acted(lost) == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.storeD, "lease", "lock.json")); !os.IsNotExist(err) {
		t.Fatalf("lock.json after the release: %v", err)
	}
}

// TestSharedMappingWritesSaved: writes through a shared writable mapping
// are saved, after a lazy restore: a file written so and closed, and one
// whose mapping is held across commits and written again to a page that
// is still dirty (which changes no stamp). Natively such writes reach the
// disk with no event, and none was ever saved; through FUSE the second
// write through one mapping was lost.
func TestSharedMappingWritesSaved(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("mapped")
	must(t, os.WriteFile(filepath.Join(mp, "f"), []byte(strings.Repeat("a", 10)), 0o644))
	must(t, os.WriteFile(filepath.Join(mp, "g"), []byte(strings.Repeat("b", 10)), 0o644))
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	e.cache = filepath.Join(e.root, "cache-lazy")
	mp = e.mount("mapped", "--prefetch", "0")
	commit := func(want map[string][]byte) {
		t.Helper()
		if r := e.amlfs("commit", mp); r.code != 0 {
			t.Fatalf("commit: %s", r)
		}
		e.verifyCurrent(t, "mapped", want)
	}
	mapFile := func(name string) (*os.File, []byte) {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(mp, name), os.O_RDWR, 0)
		must(t, err)
		m, err := syscall.Mmap(int(f.Fd()), 0, 10, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		must(t, err)
		return f, m
	}
	msync := func(m []byte) {
		t.Helper()
		must(t, unix.Msync(m, unix.MS_SYNC))
	}
	// Written through a mapping, synced, unmapped and closed.
	f, m := mapFile("f")
	copy(m, "XYZ")
	msync(m)
	must(t, syscall.Munmap(m))
	f.Close()
	commit(map[string][]byte{"f": []byte("XYZaaaaaaa")})
	// A mapping held across commits.
	g, m := mapFile("g")
	m[0] = '1'
	msync(m)
	commit(map[string][]byte{"g": []byte("1bbbbbbbbb")})
	m[1] = '2' // the page is dirty again: no fault, no new mtime
	commit(map[string][]byte{"g": []byte("12bbbbbbbb")})
	m[2] = '3' // not synced: in the page cache only
	commit(map[string][]byte{"g": []byte("123bbbbbbb")})
	must(t, syscall.Munmap(m))
	g.Close()
	commit(map[string][]byte{"g": []byte("123bbbbbbb"), "f": []byte("XYZaaaaaaa")})
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	e.verifyCurrent(t, "mapped", map[string][]byte{"g": []byte("123bbbbbbb"), "f": []byte("XYZaaaaaaa")})
}

// TestNotKeptWhileMapped: natively, a clean stop does not keep its tree
// while a process in another mount namespace (whose copy of the mount
// outlives the unmount) still maps a file of it shared and writable: it
// could change the file's bytes with no new stamp, and the next mount
// would adopt a tree that is not its revision.
func TestNotKeptWhileMapped(t *testing.T) {
	e := newEnv(t)
	needNative(t, e)
	needTools(t, "util-linux", "unshare")
	needTools(t, "python3", "python3")
	mp := e.mount("mappedkeep", "--serve", "native")
	must(t, os.WriteFile(filepath.Join(mp, "db"), []byte(strings.Repeat("d", 4096)), 0o644))
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "python3", "-c", `
import mmap, sys
f = open(sys.argv[1], "r+b"); m = mmap.mmap(f.fileno(), 0)
print("mapped", flush=True); sys.stdin.read()
m[0:1] = b"X"; m.flush()`, filepath.Join(mp, "db"))
	in, err := cmd.StdinPipe()
	must(t, err)
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 7)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "mapped\n" {
		t.Fatalf("the writer did not map the file: %q %v", buf, err)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	works, _ := filepath.Glob(filepath.Join(e.cache, "workspaces", "*", "*", "kept.json"))
	if len(works) != 0 {
		t.Fatalf("a tree a writer still maps was kept: %v", works)
	}
	// The writer writes after the stop; the next mount restores the
	// revision, not the bytes written behind it.
	in.Close()
	cmd.Wait()
	mp = e.mount("mappedkeep", "--serve", "native")
	if got, _ := os.ReadFile(filepath.Join(mp, "db")); len(got) == 0 || got[0] != 'd' {
		t.Fatalf("the next mount serves %.8q, want the revision's bytes", got)
	}
}

// TestCancelledDaemonMount: `amlfs mount --daemon` stopped (SIGTERM) at
// any moment, then the caller's cleanup (`amlfs unmount --no-save`), as
// AML's provider cancels an acquisition: at once the workspace mounts
// again with no conflict, and nothing is left mounted. A signal that came
// after the daemon was ready was passed on to it, and the command
// returned while the daemon still held the lease (AML's provider test "a
// cancelled acquisition" failed so in CI).
func TestCancelledDaemonMount(t *testing.T) {
	srv := startS3(t, false)
	e := newS3Env(t, srv)
	mp := filepath.Join(e.root, "mnt")
	must(t, os.Mkdir(mp, 0o755))
	for delay := time.Duration(0); delay < 300*time.Millisecond; delay += 8 * time.Millisecond {
		{
			cmd := exec.Command(amlfsBin, append([]string{"mount", "--daemon", "--json", mp}, e.wsArgs("cancelled")...)...)
			cmd.Env = append(append(os.Environ(), e.extraEnv...), "AMLFS_RUNTIME_DIR="+e.runtime, "XDG_CACHE_HOME="+filepath.Join(e.root, "xdg"))
			must(t, cmd.Start())
			time.Sleep(delay)
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			e.amlfs("unmount", "--no-save", mp)
			r := e.mountAt(mp, "cancelled")
			if r.code != 0 {
				t.Fatalf("SIGTERM after %v, the cleanup, then a mount: %s", delay, r)
			}
			if r := e.unmount(mp, "--no-save"); r.code != 0 {
				t.Fatalf("unmount: %s", r)
			}
		}
	}
}
