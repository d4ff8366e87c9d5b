package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amlfs/amlfs/mount"
	"github.com/amlfs/amlfs/revision/format"
)

func readIndex(t *testing.T, e *env, id string) *format.Index {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.storeD, id, "workspace.json"))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := format.ParseIndex(data)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

func TestSecondMountConflicts(t *testing.T) { forEachStore(t, testSecondMountConflicts) }

func testSecondMountConflicts(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("c")
	r := e.mountAt(filepath.Join(e.root, "other"), "c")
	if r.code != 3 || !strings.Contains(r.stderr, "AML_WORKSPACE_CONFLICT") || !strings.Contains(r.stderr, `"c"`) {
		t.Fatalf("second mount: %s", r)
	}
	// The first keeps working and saves.
	sh(t, mp, "echo still > works.txt && cat works.txt")
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if readIndex(t, e, "c").Current == "" {
		t.Error("no revision")
	}
}

func TestNoLockStaleWriterFails(t *testing.T) { forEachStore(t, testNoLockStaleWriterFails) }

func testNoLockStaleWriterFails(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	a := e.mount("nl", "--no-lock")
	b := e.mountAtOK(filepath.Join(e.root, "b"), "nl", "--no-lock")
	sh(t, a, "echo from-a > who")
	sh(t, b, "echo from-b > who")
	ra := e.unmount(a)
	if ra.code != 0 {
		t.Fatalf("first save: %s", ra)
	}
	rb := e.unmount(b)
	if rb.code != 3 || !strings.Contains(rb.stderr, "AML_PUBLISH_CONFLICT") || !strings.Contains(rb.stderr, "previous revision is still current") {
		t.Fatalf("stale save: %s", rb)
	}
	idx := readIndex(t, e, "nl")
	if idx.Current != strings.TrimSpace(ra.stdout) || len(idx.Revisions) != 1 {
		t.Fatalf("index changed: %+v", idx)
	}
	ents, _ := os.ReadDir(filepath.Join(e.storeD, "nl", "revisions"))
	if len(ents) != 1 {
		t.Errorf("the stale writer left %d artifacts", len(ents))
	}
	// The current revision holds A's work (seen from another host)...
	h := e.host(t)
	m := h.mount("nl")
	if got, _ := os.ReadFile(filepath.Join(m, "who")); string(got) != "from-a\n" {
		t.Errorf("who = %q", got)
	}
	h.unmount(m)
	// ...and B's unsaved tree is kept: the next mount on B's cache dir
	// resumes it, and says so.
	r := e.mountAt(filepath.Join(e.root, "again"), "nl")
	if r.code != 0 || !strings.Contains(r.stderr, "resuming unsaved work") {
		t.Fatalf("remount: %s", r)
	}
	if got, _ := os.ReadFile(filepath.Join(e.root, "again", "who")); string(got) != "from-b\n" {
		t.Errorf("resumed who = %q", got)
	}
}

func (e *env) mountAtOK(mp, id string, extra ...string) string {
	e.t.Helper()
	if r := e.mountAt(mp, id, extra...); r.code != 0 {
		e.t.Fatalf("mount %s: %s", mp, r)
	}
	return mp
}

func TestRetentionAndRestore(t *testing.T) { forEachStore(t, testRetentionAndRestore) }

func testRetentionAndRestore(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("ret", "--retention", "3")
	var revs []string
	for i := 1; i <= 5; i++ {
		sh(t, mp, fmt.Sprintf("echo v%d > version", i))
		r := e.amlfs("commit", mp)
		if r.code != 0 {
			t.Fatalf("commit: %s", r)
		}
		revs = append(revs, strings.TrimSpace(r.stdout))
	}
	if r := e.unmount(mp); r.code != 0 || strings.TrimSpace(r.stdout) != revs[4] {
		t.Fatalf("unmount of an unchanged tree should keep %s: %s", revs[4], r)
	}
	idx := checkAMLStore(t, filepath.Join(e.storeD, "ret"))
	if len(idx.Revisions) != 3 || idx.Current != revs[4] || idx.Revisions[1].ID != revs[3] || idx.Revisions[2].ID != revs[2] {
		t.Fatalf("index: %+v, revs %v", idx, revs)
	}
	for _, gone := range revs[:2] {
		if _, err := os.Stat(filepath.Join(e.storeD, "ret", "revisions", gone)); !os.IsNotExist(err) && !isEmptyDir(filepath.Join(e.storeD, "ret", "revisions", gone)) {
			t.Errorf("pruned revision %s still on disk: %v", gone, err)
		}
	}
	// Restore the oldest kept revision into a new current one.
	r := e.amlfs(append([]string{"revisions", "restore", revs[2], "--retention", "3"}, e.wsArgs("ret")...)...)
	if r.code != 0 {
		t.Fatalf("restore: %s", r)
	}
	newRev := strings.TrimSpace(r.stdout)
	idx = readIndex(t, e, "ret")
	if idx.Current != newRev || len(idx.Revisions) != 3 {
		t.Fatalf("after restore: %+v", idx)
	}
	mp = e.mount("ret")
	if got, _ := os.ReadFile(filepath.Join(mp, "version")); string(got) != "v3\n" {
		t.Errorf("restored content %q, want v3", got)
	}
	r = e.amlfs(append([]string{"revisions", "show", "current"}, e.storeFlags("ret")...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "version") {
		t.Errorf("show: %s", r)
	}
}

func TestSignals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			e := newEnv(t)
			mp := filepath.Join(e.root, "mnt")
			cmd, _ := e.foreground(mp, "sig")
			sh(t, mp, "echo data > f")
			// SIGUSR1 checkpoints without unmounting.
			cmd.Process.Signal(syscall.SIGUSR1)
			waitFor(t, func() bool {
				_, err := os.Stat(filepath.Join(e.storeD, "sig", "workspace.json"))
				return err == nil
			})
			first := readIndex(t, e, "sig").Current
			if !isMounted(mp) {
				t.Fatal("SIGUSR1 unmounted")
			}
			sh(t, mp, "echo more > g")
			cmd.Process.Signal(sig)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("exit after %v: %v", sig, err)
			}
			if isMounted(mp) {
				t.Fatal("still mounted")
			}
			idx := readIndex(t, e, "sig")
			if idx.Current == first {
				t.Fatal("no save on signal")
			}
			if e.lockExists("sig") {
				t.Error("lock not released")
			}
		})
	}
}

// foreground starts `amlfs mount` in the foreground and waits until the
// mount is ready.
func (e *env) foreground(mp, id string, extra ...string) (*exec.Cmd, *syncBuffer) {
	e.t.Helper()
	args := append([]string{"mount", mp}, e.wsArgs(id, extra...)...)
	cmd := exec.Command(amlfsBin, args...)
	cmd.Env = append(append(os.Environ(), e.extraEnv...), "AMLFS_RUNTIME_DIR="+e.runtime)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait() // reap; an error just means the test already waited
		e.forceUnmount(mp)
	})
	waitFor(e.t, func() bool { return strings.Contains(stderr.String(), "mounted") })
	return cmd, stderr
}

// syncBuffer is a bytes.Buffer safe to read while a process writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 300; i++ {
		if cond() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("timed out waiting")
}

func TestSaveFailureKeepsPreviousRevision(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("sf")
	sh(t, mp, "echo one > a")
	first := strings.TrimSpace(e.unmount(mp).stdout)
	mp = e.mount("sf")
	// A name that is not UTF-8: no S3 key or manifest can hold it.
	sh(t, mp, `echo two > a && touch "$(printf 'bad\377')"`)
	r := e.unmount(mp)
	if r.code != 4 || !strings.Contains(r.stderr, "UNSUPPORTED_ENTRY") || !strings.Contains(r.stderr, `bad\xff`) {
		t.Fatalf("save with a name that is not UTF-8: %s", r)
	}
	if readIndex(t, e, "sf").Current != first {
		t.Fatal("current changed")
	}
	// The unsaved tree is kept and resumed by the next mount.
	mp = e.mount("sf")
	if got, _ := os.ReadFile(filepath.Join(mp, "a")); string(got) != "two\n" {
		t.Errorf("resumed a = %q", got)
	}
	sh(t, mp, `rm "$(printf 'bad\377')"`)
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

func TestStaleMountAfterCrash(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("crash")
	sh(t, mp, "echo unsaved > u && sync")
	e.crash(mp)
	// A FUSE mount is left dead; a native one, its keeper detached.
	stale := isMounted(mp)
	// A plain stat may be answered from the kernel's attribute cache;
	// the daemon's own probe asks the (dead) connection.
	if stale && !mount.IsDeadMount(mp) {
		_, err := os.Stat(mp)
		t.Fatalf("expected a dead mount, got %v", err)
	}
	// An unlocked remount also cleans the dead mount and resumes the
	// unsaved tree (TestCrashRecovery covers the locked one).
	r := e.mountAt(mp, "crash", "--no-lock")
	if r.code != 0 || (stale && !strings.Contains(r.stderr+r.stdout, "stale mount")) {
		t.Fatalf("remount: %s", r)
	}
	if got, _ := os.ReadFile(filepath.Join(mp, "u")); string(got) != "unsaved\n" {
		t.Errorf("unsaved file after crash: %q", got)
	}
}

// crash kills the daemon serving mp with SIGKILL and waits until the mount
// it leaves behind is dead.
func (e *env) crash(mp string) {
	e.t.Helper()
	e.kill(mp, e.pid(mp))
}

// pid is the pid of the daemon serving mp.
func (e *env) pid(mp string) int {
	e.t.Helper()
	return jsonInt(e.t, e.amlfs("status", mp, "--json").stdout, "pid")
}

// kill kills daemon pid, serving mp, with SIGKILL and waits until the
// mount it leaves behind is dead (FUSE), or gone (native serving: its
// keeper detaches it).
func (e *env) kill(mp string, pid int) {
	e.t.Helper()
	syscall.Kill(pid, syscall.SIGKILL)
	waitFor(e.t, func() bool { return mount.IsDeadMount(mp) || !isMounted(mp) })
}

func jsonInt(t *testing.T, s, key string) int {
	t.Helper()
	i := strings.Index(s, `"`+key+`": `)
	if i < 0 {
		t.Fatalf("no %s in %s", key, s)
	}
	rest := s[i+len(key)+4:]
	j := strings.IndexAny(rest, ",\n}")
	n, err := strconv.Atoi(strings.TrimSpace(rest[:j]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestBadStoreInput(t *testing.T) { forEachStore(t, testBadStoreInput) }

func testBadStoreInput(t *testing.T, newEnv func(*testing.T) *env) {
	tgz := func(hdrs ...*tar.Header) []byte {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		for _, h := range hdrs {
			tw.WriteHeader(h)
			if h.Size > 0 && h.Size < 1<<20 {
				tw.Write(make([]byte, h.Size))
			}
		}
		tw.Close()
		gz.Close()
		return buf.Bytes()
	}
	const ts = "2026-12-02T18:00:00.000Z"
	idxFor := func(id, kind string) string {
		return fmt.Sprintf(`{"current":"%s","revisions":[{"createdAt":"%s","format":"%s","id":"%s","path":"%s"}],"version":1}`, id, ts, kind, id, format.RevisionPath(id, kind))
	}
	cases := []struct {
		name  string
		files map[string][]byte
		want  string
	}{
		{"malformed index", map[string][]byte{"workspace.json": []byte(`{"current": "r1", "revisions": [`)}, "malformed JSON"},
		{"missing revision", map[string][]byte{"workspace.json": []byte(idxFor("r1", "folder"))}, "missing"},
		{"manifest traversal", map[string][]byte{
			"workspace.json":             []byte(idxFor("r1", "folder")),
			"revisions/r1/manifest.json": []byte(`{"entries":[{"mode":420,"path":"../x","size":1,"type":"file"}],"version":1}`),
			"revisions/r1/files/x":       []byte("x"),
		}, "../x"},
		{"tar absolute path", map[string][]byte{
			"workspace.json":      []byte(idxFor("r1", "archive")),
			"revisions/r1.tar.gz": tgz(&tar.Header{Name: "/etc/evil", Typeflag: tar.TypeReg, Size: 4, Mode: 0o644}),
		}, "absolute"},
		{"tar bomb", map[string][]byte{
			"workspace.json":      []byte(idxFor("r1", "archive")),
			"revisions/r1.tar.gz": tgzBomb(t),
		}, "LIMIT_EXCEEDED"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			for name, data := range tc.files {
				e.putStoreFile("bad/"+name, data)
			}
			before := treeDigest(t, e.storeD, nil)
			mp := filepath.Join(e.root, "mnt")
			r := e.mountAt(mp, "bad")
			if r.code == 0 {
				t.Fatalf("bad store mounted: %s", r)
			}
			if !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "INVALID_STORE") && !strings.Contains(r.stderr, "LIMIT_EXCEEDED") {
				t.Errorf("error does not explain itself: %s", r)
			}
			if isMounted(mp) {
				t.Error("mounted anyway")
			}
			after := treeDigest(t, e.storeD, nil)
			if d := diffDigests(before, after); len(d) > 0 {
				t.Errorf("store changed: %v", d)
			}
			if ents, _ := os.ReadDir(filepath.Join(e.cache, "workspaces")); len(ents) > 0 {
				sub, _ := os.ReadDir(filepath.Join(e.cache, "workspaces", ents[0].Name()))
				for _, s := range sub {
					if s.Name() == "work" || strings.HasSuffix(s.Name(), ".restoring") {
						t.Errorf("a partial working tree was left: %s", s.Name())
					}
				}
			}
		})
	}
}

// tgzBomb is a small, complete archive holding 2 GiB of zeros. It is
// built as concatenated gzip members, which a gzip reader reads as one
// stream, so that its 2,048 identical 1 MiB members are compressed once.
func tgzBomb(t *testing.T) []byte {
	member := func(data []byte) []byte {
		var buf bytes.Buffer
		gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		gz.Write(data)
		gz.Close()
		return buf.Bytes()
	}
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	if err := tw.WriteHeader(&tar.Header{Name: "./zeros", Typeflag: tar.TypeReg, Size: 2 << 30, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	tw.Flush()
	out := member(hdr.Bytes())
	mib := member(make([]byte, 1<<20))
	for i := 0; i < 2<<10; i++ {
		out = append(out, mib...)
	}
	return append(out, member(make([]byte, 1024))...) // the end-of-archive blocks
}

// TestIDsAMLRefuses: every workspace id AML refuses (empty, or changed by
// JavaScript's trim) exits 2 with INVALID_CONFIG, for mount and for the
// revisions commands, and writes nothing to the store.
func TestIDsAMLRefuses(t *testing.T) {
	e := newEnv(t)
	for _, id := range []string{"", " lead", "trail ", " ", "\n", "nbsp\u00a0", "\u3000ideo", "feff\ufeff"} {
		r := e.mountAt(filepath.Join(e.root, "mnt-bad"), id)
		if r.code != 2 || !strings.Contains(r.stderr, "INVALID_CONFIG") || !strings.Contains(r.stderr, "AML refuses it") {
			t.Errorf("mount --id %q: %s", id, r)
		}
		if r := e.amlfs(append([]string{"revisions", "list"}, e.storeFlags(id)...)...); r.code != 2 {
			t.Errorf("revisions list --id %q: %s", id, r)
		}
	}
	if ents, _ := os.ReadDir(e.storeD); len(ents) != 0 {
		t.Errorf("the store holds %d entries", len(ents))
	}
}

// TestMountOverNonEmpty: mounting over files would hide them, so amlfs
// refuses unless -o nonempty, and then says what it hides.
func TestMountOverNonEmpty(t *testing.T) {
	e := newEnv(t)
	mp := filepath.Join(e.root, "mnt-nonempty")
	must(t, os.MkdirAll(mp, 0o755))
	must(t, os.WriteFile(filepath.Join(mp, "hidden.txt"), nil, 0o644))
	r := e.mountAt(mp, "nonempty")
	if r.code != 2 || !strings.Contains(r.stderr, "not empty") || !strings.Contains(r.stderr, "-o nonempty") {
		t.Errorf("mount over a non-empty directory: %s", r)
	}
	r = e.mountAt(mp, "nonempty", "-o", "nonempty")
	if r.code != 0 || !strings.Contains(r.stderr, "hidden.txt") {
		t.Errorf("mount -o nonempty over a non-empty directory: %s", r)
	}
}

func fuseOtherMode(t *testing.T) os.FileMode {
	fi, err := os.Stat("/dev/fuse")
	must(t, err)
	return fi.Mode().Perm()
}

// TestCheckFuseAsUser: as a user other than root, `amlfs check` reports
// FUSE ok only if a trial mount as that user works, and otherwise says
// what is missing: the setuid fusermount3 (install fuse3), or access to
// /dev/fuse. As root, the trial mount works, and one with an option the
// kernel refuses fails; neither leaves a mount behind.
func TestCheckFuseAsUser(t *testing.T) {
	needTools(t, "util-linux", "setpriv")
	dir, err := os.MkdirTemp("", "amlfs-check-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "amlfs")
	data, err := os.ReadFile(amlfsBin)
	must(t, err)
	must(t, os.WriteFile(bin, data, 0o755))
	mounts := func() string {
		b, err := os.ReadFile("/proc/self/mountinfo")
		must(t, err)
		var n []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "amlfs:check") {
				n = append(n, l)
			}
		}
		return strings.Join(n, "\n")
	}
	cmd := exec.Command("setpriv", "--reuid", "4242", "--regid", "4242", "--clear-groups", "env", "HOME="+dir, "XDG_RUNTIME_DIR=",
		bin, "check", "--store", "file://"+filepath.Join(dir, "store"), "--json")
	out, _ := cmd.CombinedOutput()
	var want []string
	p, err := exec.LookPath("fusermount3")
	fi, serr := os.Stat(p)
	switch {
	case err != nil || serr != nil || fi.Mode()&os.ModeSetuid == 0:
		want = []string{`"detail": "/dev/fuse is present, but a user other than root mounts through the setuid fusermount3, which is missing: apt-get install fuse3"`}
	case fuseOtherMode(t)&0o006 != 0o006: // 4242 is neither owner nor in the group
		want = []string{`"status": "fail"`, `cannot be opened by this user`, `chmod 0666 /dev/fuse`}
	default:
		// uid 4242 has no passwd entry here, so fusermount3 itself
		// refuses; what matters is that the trial mount ran.
		want = []string{`a trial mount`, `mounts for this user`}
	}
	// Not root: served through FUSE by default, saying why.
	want = append(want, `"detail": "fuse: --serve auto: native serving cannot run here: `)
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Errorf("check as uid 4242: want %s in\n%s", w, out)
		}
	}
	if m := mounts(); m != "" {
		t.Errorf("check left its trial mount behind:\n%s", m)
	}
	e := newEnv(t)
	r := e.amlfs("check", "--store", "file://"+filepath.Join(dir, "store"), "--json")
	if r.code != 0 || !strings.Contains(r.stdout, "a trial mount worked (as root") {
		t.Errorf("check as root: %s", r)
	}
	r = e.amlfs("check", "--store", "file://"+filepath.Join(dir, "store"), "--json", "-o", "no_such_option")
	if r.code == 0 || !strings.Contains(r.stdout, "a trial mount failed") || !strings.Contains(r.stdout, "invalid argument") {
		t.Errorf("check with an option the kernel refuses: %s", r)
	}
	if m := mounts(); m != "" {
		t.Errorf("check left its trial mount behind:\n%s", m)
	}
}
