package integration

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amlfs/amlfs/mount"
	"golang.org/x/sys/unix"
)

// Native serving (--serve native): the workspace is a bind mount of the
// working tree, and lazily restored files are filled by fanotify
// pre-content events.

// needNative skips where native serving cannot run (amlfs check says why).
func needNative(t *testing.T, e *env) {
	t.Helper()
	if r, ok := checkNative(e); !ok {
		t.Skipf("native serving cannot run here: %s", r)
	}
}

// nativeServing reports whether native serving can run here.
func nativeServing(e *env) bool {
	_, ok := checkNative(e)
	return ok
}

// defaultServe is how amlfs serves a workspace that names no --serve
// here: native where it can run. It is asked once per run.
func defaultServe(e *env) string {
	defaultOnce.Do(func() {
		r := e.amlfs(append([]string{"check", "--json"}, e.wsArgs("default-check")...)...)
		defaultMode = "fuse"
		if strings.Contains(r.stdout, `"detail": "native: `) {
			defaultMode = "native"
		}
	})
	return defaultMode
}

var (
	defaultOnce sync.Once
	defaultMode string
)

func checkNative(e *env) (result, bool) {
	r := e.amlfs(append([]string{"check", "--serve", "native"}, e.wsArgs("native-check")...)...)
	return r, strings.Contains(r.stdout, "serve") && !strings.Contains(r.stdout, "cannot run here")
}

// nativeTree writes a tree that exercises every way to reach a file's
// bytes, and returns each file's content.
func nativeTree(t *testing.T, mp string) map[string][]byte {
	t.Helper()
	want := map[string][]byte{}
	put := func(name string, data []byte, mode os.FileMode) {
		p := filepath.Join(mp, name)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, data, mode))
		want[name] = data
	}
	for i := range 50 {
		put(fmt.Sprintf("d%d/f%d.txt", i%5, i), []byte(strings.Repeat(fmt.Sprintf("line %d of file %d\n", i, i), 40+i)), 0o644)
	}
	big := make([]byte, 5<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>12)
	}
	put("big.bin", big, 0o644)
	put("mmap.bin", bytes.Repeat([]byte("mapped!\n"), 1000), 0o644)
	put("bin/hello.sh", []byte("#!/bin/sh\necho hello from a placeholder\n"), 0o755)
	put("append.txt", []byte("first\n"), 0o666)
	put("trunc.txt", []byte("0123456789abcdef"), 0o666)
	return want
}

func serveOf(t *testing.T, e *env, mp string) string {
	t.Helper()
	st := e.amlfs("status", mp, "--json")
	for _, s := range []string{"native", "fuse"} {
		if strings.Contains(st.stdout, `"serve": "`+s+`"`) {
			return s
		}
	}
	t.Fatalf("status names no serving mode: %s", st)
	return ""
}

// lazyNative saves nativeTree from a native mount of e, and mounts it
// natively on another host (a fresh cache dir) with no prefetch, so that
// every file is a placeholder until it is used.
func lazyNative(t *testing.T, e *env) (want map[string][]byte, h *env, mp string) {
	t.Helper()
	needNative(t, e)
	mp = e.mount("native", "--serve", "native")
	if s := serveOf(t, e, mp); s != "native" {
		t.Fatalf("serving %s, want native", s)
	}
	want = nativeTree(t, mp)
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	h = e.host(t)
	return want, h, h.mount("native", "--serve", "native", "--prefetch", "0")
}

// Every way to reach a placeholder's bytes gives the right bytes: read,
// mmap, exec, append, truncate; reads count as no change; the save after
// them publishes exactly the tree. On both stores.
func TestNativeLazyRestore(t *testing.T) { forEachStore(t, testNativeLazyRestore) }

func testNativeLazyRestore(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	want, h, mp2 := lazyNative(t, e)
	st := h.amlfs("status", mp2, "--json").stdout
	if n := jsonInt(t, st, "pendingFiles"); n != len(want) {
		t.Fatalf("%d pending files, want %d: %s", n, len(want), st)
	}
	var fi syscall.Stat_t
	must(t, syscall.Stat(filepath.Join(mp2, "big.bin"), &fi))
	if fi.Size != 5<<20 {
		t.Fatalf("placeholder size %d", fi.Size)
	}
	for _, name := range []string{"d0/f0.txt", "d3/f48.txt", "big.bin"} {
		got, err := os.ReadFile(filepath.Join(mp2, name))
		must(t, err)
		if !bytes.Equal(got, want[name]) {
			t.Fatalf("%s: read %d bytes that differ from the saved ones", name, len(got))
		}
	}
	// A tool call reads through the mount from the daemon's own
	// process: its access must be filled too, never let through.
	r := h.amlfs("tool", mp2, "read_file", `{"path":"d4/f49.txt"}`)
	if r.code != 0 || !strings.Contains(r.stdout, "line 49 of file 49") {
		t.Fatalf("read_file of a placeholder: %s", r)
	}
	// mmap, with no read(2) at all.
	f, err := os.Open(filepath.Join(mp2, "mmap.bin"))
	must(t, err)
	m, err := unix.Mmap(int(f.Fd()), 0, len(want["mmap.bin"]), unix.PROT_READ, unix.MAP_SHARED)
	must(t, err)
	if !bytes.Equal(m, want["mmap.bin"]) {
		t.Errorf("mmap of a placeholder: %q...", m[:16])
	}
	unix.Munmap(m)
	f.Close()
	// exec of a placeholder.
	out, err := exec.Command(filepath.Join(mp2, "bin/hello.sh")).CombinedOutput()
	if err != nil || string(out) != "hello from a placeholder\n" {
		t.Errorf("exec of a placeholder: %q %v", out, err)
	}
	if st := h.amlfs("status", mp2, "--json").stdout; strings.Contains(st, `"dirty": true`) {
		t.Errorf("reads made the tree dirty: %s", st)
	}
	// A write and a truncate of placeholders keep the bytes around them.
	sh(t, mp2, "echo second >> append.txt && truncate -s 10 trunc.txt")
	want["append.txt"] = []byte("first\nsecond\n")
	want["trunc.txt"] = []byte("0123456789")
	checkTree(t, mp2, want)
	if st := h.amlfs("status", mp2, "--json").stdout; !strings.Contains(st, `"dirty": true`) {
		t.Errorf("an append left the tree clean: %s", st)
	}
	if r := h.unmount(mp2); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	// What it published is exactly the tree, through FUSE on a third host.
	h3 := e.host(t)
	mp3 := h3.mount("native", "--serve", "fuse", "--restore", "full")
	checkTree(t, mp3, want)
}

// checkTree compares every file under mp with want, and that no other
// file is there.
func checkTree(t *testing.T, mp string, want map[string][]byte) {
	t.Helper()
	seen := 0
	filepath.Walk(mp, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(mp, p)
		w, ok := want[rel]
		if !ok {
			t.Errorf("unexpected file %s", rel)
			return nil
		}
		seen++
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, w) {
			t.Errorf("%s: %d bytes, sha %x, want %d bytes sha %x (%v)", rel, len(got), sha256.Sum256(got), len(w), sha256.Sum256(w), err)
		}
		return nil
	})
	if seen != len(want) {
		t.Errorf("%d files, want %d", seen, len(want))
	}
}

// A placeholder whose store fails gives EIO, never zeros, and a slow
// store makes the reader wait for the right bytes.
func TestNativeStoreFails(t *testing.T) {
	e, px := faultyS3Env(t)
	e.folder() // the faults target a file's object
	want, _, mp2 := lazyNative(t, e)
	files := func(r *http.Request) bool { return isGet(r) && strings.Contains(r.URL.Path, "/files/") }
	px.set(&fault{kind: faultLatency, match: files, delay: 2 * time.Second})
	start := time.Now()
	got, err := os.ReadFile(filepath.Join(mp2, "d1/f1.txt"))
	if err != nil || !bytes.Equal(got, want["d1/f1.txt"]) || time.Since(start) < 2*time.Second {
		t.Fatalf("slow store: %d bytes after %v, %v", len(got), time.Since(start), err)
	}
	px.set(&fault{kind: faultStatus, match: files, status: 500, code: "InternalError"})
	for _, name := range []string{"d2/f2.txt", "big.bin", "mmap.bin"} {
		_, err := os.ReadFile(filepath.Join(mp2, name))
		if !errorsIs(err, syscall.EIO) {
			t.Errorf("%s with the store failing: %v, want EIO", name, err)
		}
	}
	px.set()
	if eio := checkReads(t, mp2, want); eio != 0 {
		t.Errorf("%d reads gave EIO once the store answered again", eio)
	}
}

func errorsIs(err error, target syscall.Errno) bool {
	for err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return e == target
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// A daemon killed with SIGKILL leaves no zeros behind: its keeper detaches
// the mount and answers EIO to a placeholder still open, and the next
// mount resumes the tree with every byte right.
func TestNativeCrash(t *testing.T) {
	want, h, mp2 := lazyNative(t, newEnv(t))
	// A placeholder opened before the crash is filled by its open; a
	// directory held open lets the test open others after the crash,
	// through the detached mount.
	f, err := os.Open(filepath.Join(mp2, "big.bin"))
	must(t, err)
	defer f.Close()
	dir, err := os.Open(mp2)
	must(t, err)
	defer dir.Close()
	pid := jsonInt(t, h.amlfs("status", mp2, "--json").stdout, "pid")
	must(t, syscall.Kill(pid, syscall.SIGKILL))
	deadline := time.Now().Add(10 * time.Second)
	for isMounted(mp2) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if isMounted(mp2) {
		t.Fatal("the keeper did not detach the mount of a dead daemon")
	}
	buf := make([]byte, 4096)
	if n, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf[:n], want["big.bin"][:n]) {
		t.Fatalf("read of a file opened (so filled) before the crash: %d bytes, %v", n, err)
	}
	if fd, err := unix.Openat(int(dir.Fd()), "d0/f0.txt", unix.O_RDONLY|unix.O_CLOEXEC, 0); !errorsIs(err, syscall.EIO) {
		unix.Close(fd)
		t.Fatalf("open of a placeholder after the daemon died: %v; want EIO", err)
	}
	// The next mount takes the tree over: the same detached tree now
	// fills.
	mp3 := h.mount("native", "--serve", "native", "--prefetch", "0")
	if mp3 != mp2 {
		t.Fatalf("mountpoint %s, want %s", mp3, mp2)
	}
	fd, err := unix.Openat(int(dir.Fd()), "d0/f0.txt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	must(t, err)
	g := os.NewFile(uintptr(fd), "f0")
	got, err := io.ReadAll(g)
	g.Close()
	if err != nil || !bytes.Equal(got, want["d0/f0.txt"]) {
		t.Fatalf("read through the directory held across the crash: %q, %v", got, err)
	}
	checkTree(t, mp3, want)
	f.Close()
	if r := h.unmount(mp3); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if keeperRuns(mp2) {
		t.Errorf("a keeper outlived its clean unmount")
	}
	// A crash with no file held open: the keeper finds no process using
	// the detached mount and exits by itself.
	mp4 := h.mount("native", "--serve", "native", "--prefetch", "0")
	h.crash(mp4)
	deadline = time.Now().Add(40 * time.Second)
	for keeperRuns(mp4) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if keeperRuns(mp4) {
		t.Errorf("the keeper of a dead daemon still runs with no file of its mount open")
	}
}

// A clean unmount of a tree whose placeholders nothing holds open ends the
// keeper, every time: the daemon's own umount is not taken for someone
// else's lazy detach (watchMounts saw the mount go before Unmount said
// it had not detached, about one time in three).
func TestNativeCleanUnmountEndsKeeper(t *testing.T) {
	_, h, mp := lazyNative(t, newEnv(t))
	for i := range 6 {
		if i > 0 {
			mp = h.mount("native", "--serve", "native", "--prefetch", "0", "--no-lock")
		}
		if r := h.amlfs("unmount", "--no-save", mp); r.code != 0 {
			t.Fatalf("unmount: %s", r)
		}
		logs, _ := filepath.Glob(filepath.Join(h.runtime, "*.log"))
		for _, l := range logs {
			if b, _ := os.ReadFile(l); bytes.Contains(b, []byte("still open through the detached mount")) {
				t.Fatalf("round %d: a clean unmount with no file open was taken for a detach: %s", i, b)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for keeperRuns(mp) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if keeperRuns(mp) {
		t.Fatal("the keeper outlived a clean unmount")
	}
}

// keeperRuns reports whether a keeper for mountpoint mp runs.
func keeperRuns(mp string) bool {
	out, _ := exec.Command("pgrep", "-f", "internal-native-keeper "+mp+" ").Output()
	return len(out) > 0
}

// An external umount is noticed: the daemon saves and exits.
func TestNativeExternalUnmount(t *testing.T) {
	e := newEnv(t)
	needNative(t, e)
	mp := e.mount("native", "--serve", "native")
	must(t, os.WriteFile(filepath.Join(mp, "kept.txt"), []byte("kept\n"), 0o644))
	pid := jsonInt(t, e.amlfs("status", mp, "--json").stdout, "pid")
	must(t, syscall.Unmount(mp, 0))
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Fatal("the daemon still runs after its mount was unmounted")
	}
	h := e.host(t)
	mp2 := h.mount("native", "--serve", "native")
	if got, err := os.ReadFile(filepath.Join(mp2, "kept.txt")); err != nil || string(got) != "kept\n" {
		t.Fatalf("after an external umount: %q %v", got, err)
	}
}

// A live mount inside a native workspace has its own FUSE connection; the
// save leaves it out.
func TestNativeLiveMount(t *testing.T) {
	e := newEnv(t)
	needNative(t, e)
	host := filepath.Join(e.root, "host")
	must(t, os.MkdirAll(host, 0o755))
	must(t, os.WriteFile(filepath.Join(host, "h.txt"), []byte("host\n"), 0o644))
	mp := e.mount("native", "--serve", "native", "--mount", "/shared=file://"+host)
	if got, err := os.ReadFile(filepath.Join(mp, "shared/h.txt")); err != nil || string(got) != "host\n" {
		t.Fatalf("live mount: %q %v", got, err)
	}
	var sfs unix.Statfs_t
	must(t, unix.Statfs(filepath.Join(mp, "shared"), &sfs))
	if sfs.Type != 0x65735546 { // FUSE_SUPER_MAGIC
		t.Errorf("the live mount is not a FUSE mount (magic %#x)", sfs.Type)
	}
	must(t, os.WriteFile(filepath.Join(mp, "shared/new.txt"), []byte("new\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(mp, "ws.txt"), []byte("ws\n"), 0o644))
	if got, _ := os.ReadFile(filepath.Join(host, "new.txt")); string(got) != "new\n" {
		t.Errorf("a write through the live mount reached the host dir as %q", got)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if isMounted(filepath.Join(mp, "shared")) || isMounted(mp) {
		t.Fatal("a mount outlived the unmount")
	}
	h := e.host(t)
	mp2 := h.mount("native", "--serve", "fuse", "--restore", "full")
	checkTree(t, mp2, map[string][]byte{"ws.txt": []byte("ws\n")})
}

// A user of the workspace swaps a directory and a symlink to a directory
// only root may read (renameat2 RENAME_EXCHANGE, in a loop) while saves
// run: no save ever holds a byte from outside the tree.
func TestNativeSymlinkSwapDuringSave(t *testing.T) {
	e := newEnv(t)
	needNative(t, e)
	bin := e.attackerBin()
	secret := filepath.Join(e.root, "secret")
	must(t, os.MkdirAll(secret, 0o700))
	for i := range 200 {
		must(t, os.WriteFile(filepath.Join(secret, fmt.Sprintf("f%d.txt", i)), []byte("TOPSECRET\n"), 0o600))
	}
	mp := e.mount("native", "--serve", "native")
	must(t, os.Chmod(mp, 0o777))
	work := filepath.Join(mp, "w")
	must(t, os.MkdirAll(filepath.Join(work, "d"), 0o755))
	for i := range 200 {
		must(t, os.WriteFile(filepath.Join(work, "d", fmt.Sprintf("f%d.txt", i)), []byte("public\n"), 0o644))
	}
	must(t, os.Symlink(secret, filepath.Join(work, "s")))
	must(t, exec.Command("chown", "-R", "-h", "4242:4242", work).Run())
	cmd := exec.Command(bin)
	cmd.Dir = work
	cmd.Env = []string{"AMLFS_TEST_CHILD=swap", "PATH=" + os.Getenv("PATH")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 4242, Gid: 4242}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	must(t, cmd.Start())
	stop := func() {
		os.WriteFile(filepath.Join(work, "stop"), nil, 0o644)
		cmd.Wait()
	}
	defer stop()
	saved := 0
	for i := range 20 {
		r := e.amlfs("commit", mp, "--revision", fmt.Sprintf("r%d", i))
		if r.code == 0 {
			saved++
		} else if !strings.Contains(r.stderr, "changed during") {
			t.Fatalf("commit %d: %s", i, r)
		}
	}
	stop()
	if !strings.Contains(out.String(), "swaps") {
		t.Fatalf("the swapper did not run: %s", out.String())
	}
	t.Logf("%d saves; %s", saved, strings.TrimSpace(out.String()))
	// No object of any revision holds the secret.
	leaked := 0
	filepath.Walk(e.storeD, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if data, _ := os.ReadFile(p); bytes.Contains(data, []byte("TOPSECRET")) {
				leaked++
			}
		}
		return nil
	})
	if leaked > 0 {
		t.Fatalf("%d objects in the store hold bytes only root could read", leaked)
	}
}

// swapChild exchanges d and s in the working directory until a file
// named stop appears.
func swapChild() {
	n, fails := 0, 0
	for i := 0; ; i++ {
		if i%1000 == 0 {
			if _, err := os.Lstat("stop"); err == nil {
				break
			}
		}
		if err := unix.Renameat2(unix.AT_FDCWD, "d", unix.AT_FDCWD, "s", unix.RENAME_EXCHANGE); err != nil {
			fails++
		} else {
			n++
		}
	}
	fmt.Printf("%d swaps, %d failed\n", n, fails)
}

// bothModes is the part of this suite about the workspace itself: POSIX,
// crash, lifecycle, tools and exec, and live mounts inside it. The suite
// serves the workspace as amlfs does by default (natively, where that can
// run); TestFUSESuite runs these a second time through FUSE. pjdfstest
// runs in both modes inside TestPjdfstest.
var bothModes = []string{
	// POSIX
	// (Not TestExchangeRaceStaysInside: it races the FUSE daemon's own
	// path walks, and names --serve fuse; natively the racing user's
	// calls are the kernel's own, and TestNativeSymlinkSwapDuringSave
	// races the daemon's reads for a save.)
	"TestPOSIX", "TestUnprivilegedTruncateKillsSuid", "TestLocks",
	"TestManyInodes", "TestGitStatusAfterRestore",
	"TestLiveLocalMount", "TestLiveDirentIno", "TestLiveHostGetcwd", "TestStoreNone", "TestS3LiveMount",
	// crash
	"TestCrashRecovery", "TestLazyRestoreSurvivesCrash", "TestStaleMountAfterCrash",
	"TestPlaceholderWithoutItsBase", "TestKillDuringSave",
	// lifecycle
	"TestRoundTrip", "TestUnchangedUnmountKeepsRevision", "TestRetentionAndRestore",
	"TestSecondMountConflicts", "TestNoLockStaleWriterFails", "TestResumeIsAStaleWriter",
	"TestSaveWithoutItsBase", "TestSaveFailureKeepsPreviousRevision", "TestSignals",
	"TestUnmountTwice", "TestDestroy", "TestCommitFork", "TestS3IncrementalSave",
	// tools
	"TestToolAndShellSeeOneTree", "TestToolConcurrency", "TestToolDeleteAllOrNothing",
	"TestMCPServer", "TestMCPReadOnlyMount", "TestToolBadCalls", "TestToolWriteTooLarge",
	"TestGit", "TestEditorsAndSed", "TestSQLiteConcurrentWriters",
	"TestUntarSourceTree", "TestReplacedFilesKeepNewBytes", "TestSharedMappingWritesSaved",
	// exec
	"TestExec", "TestExecSignal", "TestExecStop",
}

var testResult = regexp.MustCompile(`(?m)^--- (PASS|FAIL|SKIP): (\w+) \(([\d.]+)s\)`)

// TestFUSESuite runs bothModes again in a child run of this test binary,
// with every mount that names no mode served through FUSE
// (AMLFS_TEST_SERVE=fuse), the fallback where native serving cannot run.
// Each test must pass or skip with a reason; a name that no longer runs
// fails, so the list cannot rot. Where the default is FUSE already (no
// native serving here), the run itself was that run.
func TestFUSESuite(t *testing.T) {
	if os.Getenv("AMLFS_TEST_SERVE") != "" {
		t.Skip("this run already serves as AMLFS_TEST_SERVE says")
	}
	if testing.Short() {
		t.Skip("the FUSE suite takes minutes")
	}
	if defaultServe(newEnv(t)) != "native" {
		t.Skip("the default serving here is FUSE: this run was the FUSE suite")
	}
	timeout := 40 * time.Minute
	if d, ok := t.Deadline(); ok {
		timeout = time.Until(d) - 30*time.Second
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^("+strings.Join(bothModes, "|")+")$",
		"-test.v", "-test.count=1", "-test.timeout", timeout.String())
	cmd.Env = append(os.Environ(), "AMLFS_TEST_SERVE=fuse", "AMLFS_TEST_BIN="+amlfsBin)
	out, err := cmd.CombinedOutput()
	ran := map[string]string{}
	for _, m := range testResult.FindAllStringSubmatch(string(out), -1) {
		ran[m[2]] = m[1]
		t.Logf("fuse: %s %s (%ss)", m[1], m[2], m[3])
	}
	for _, name := range bothModes {
		switch ran[name] {
		case "PASS":
		case "SKIP":
			if why := skipReason(string(out), name); why != "" {
				t.Logf("fuse: %s skipped: %s", name, why)
			}
		case "FAIL":
			t.Errorf("%s fails with the workspace served through FUSE", name)
		default:
			t.Errorf("%s did not run through FUSE: renamed, or the run stopped before it", name)
		}
	}
	if err != nil || t.Failed() {
		t.Fatalf("FUSE run: %v\n%s", err, out)
	}
}

// skipReason is the first line a skipped test logged in a -test.v run.
func skipReason(out, name string) string {
	i := strings.Index(out, "=== RUN   "+name+"\n")
	if i < 0 {
		return ""
	}
	rest := out[i+len("=== RUN   "+name+"\n"):]
	line, _, _ := strings.Cut(rest, "\n")
	return strings.TrimSpace(line)
}

// TestServeAuto: a mount that names no --serve is served natively where
// native serving can run, and says why in its status, its log and check;
// one that asks for a FUSE option falls back to FUSE with one log line
// naming the reason.
func TestServeAuto(t *testing.T) {
	e := newEnv(t)
	needNative(t, e)
	logOf := func(mp string) string {
		b, err := os.ReadFile(filepath.Join(e.runtime, filepath.Base(mount.LogPath(mp))))
		if err != nil {
			t.Fatalf("the daemon's log: %v", err)
		}
		return string(b)
	}
	cases := []struct {
		name, serve string
		extra       []string
		why, log    string
	}{
		{"default", "native", nil, "--serve auto: root, Linux", "--serve auto: serving natively"},
		{"fuse option", "fuse", []string{"-o", "umask=022"}, "native serving cannot run here: -o umask=022 is a FUSE option", "serving through FUSE: native serving cannot run here"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mp := filepath.Join(e.root, "mnt-auto-"+c.serve)
			if r := e.mountAt(mp, "auto-"+c.serve, c.extra...); r.code != 0 {
				t.Fatalf("mount: %s", r)
			}
			st := e.amlfs("status", mp, "--json")
			if !strings.Contains(st.stdout, `"serve": "`+c.serve+`"`) || !strings.Contains(st.stdout, c.why) {
				t.Errorf("status: want serve %s because %q:\n%s", c.serve, c.why, st.stdout)
			}
			if l := logOf(mp); strings.Count(l, c.log) != 1 {
				t.Errorf("the daemon's log says %q %d times, want once:\n%s", c.log, strings.Count(l, c.log), l)
			}
			if r := e.unmount(mp, "--no-save"); r.code != 0 {
				t.Fatalf("unmount: %s", r)
			}
		})
	}
	r := e.amlfs(append([]string{"check", "--json"}, e.wsArgs("auto-check")...)...)
	if !strings.Contains(r.stdout, `"detail": "native: --serve auto: root, Linux`) {
		t.Errorf("check names no native serving and why:\n%s", r.stdout)
	}
}
