// Package integration runs the real amlfs binary against real FUSE.
package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var amlfsBin string

func TestMain(m *testing.M) {
	// A copy of this binary runs as a child process of some tests,
	// maybe as another user: it runs its part and exits.
	switch os.Getenv("AMLFS_TEST_CHILD") {
	case "":
	case "race":
		n, _ := strconv.Atoi(os.Getenv("RACE_N"))
		raceChild(os.Getenv("RACE_OP"), n)
		os.Exit(0)
	case "lock":
		lockChild()
		os.Exit(0)
	case "socket":
		socketChild()
		os.Exit(0)
	case "swap":
		swapChild()
		os.Exit(0)
	default:
		fmt.Println("unknown AMLFS_TEST_CHILD", os.Getenv("AMLFS_TEST_CHILD"))
		os.Exit(2)
	}
	// The second lane: `go test ./...` is the fast one, which leaves this
	// package out unless AMLFS_INTEGRATION is set (as .ci/run does).
	if os.Getenv("AMLFS_INTEGRATION") == "" {
		fmt.Println("the integration suite is the second lane: run it as root with AMLFS_INTEGRATION=1; skipping")
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		fmt.Println("integration tests need root for FUSE; skipping")
		os.Exit(0)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		fmt.Println("no /dev/fuse; skipping integration tests")
		os.Exit(0)
	}
	// A binary built with the race detector sleeps a second as it exits
	// (GORACE atexit_sleep_ms, 1000 by default), so that threads still
	// running can report. Every amlfs command a test runs, and every
	// daemon it stops, paid that second: about a third of the suite's
	// time. A race found before the exit is reported all the same.
	if !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
		os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	if bin := os.Getenv("AMLFS_TEST_BIN"); bin != "" {
		// A run of the suite inside this one (TestFUSESuite) uses the
		// daemon its parent built.
		amlfsBin = bin
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "amlfs-bin-")
	if err != nil {
		panic(err)
	}
	amlfsBin = filepath.Join(dir, "amlfs")
	build := exec.Command("go", "build", "-race", "-o", amlfsBin, "../cmd/amlfs")
	if os.Getenv("AMLFS_NO_RACE") != "" {
		build = exec.Command("go", "build", "-o", amlfsBin, "../cmd/amlfs")
	}
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Println("build amlfs:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's store, cache and runtime dirs.
type env struct {
	t         *testing.T
	kind      string // "file" or "s3"
	root      string
	storeD    string // where the store's objects can be read as files
	store     string
	storeArgs []string // extra flags naming the store (S3 endpoint)
	extraEnv  []string
	s3        *s3Server
	prefix    string // S3 key prefix of the store
	cache     string
	runtime   string
	bin       string // the amlfs binary the env runs; amlfsBin if empty
}

func newEnv(t *testing.T) *env {
	t.Helper()
	root := t.TempDir()
	e := &env{t: t, kind: "file", root: root, storeD: filepath.Join(root, "store"), cache: filepath.Join(root, "cache"), runtime: filepath.Join(root, "run")}
	e.store = "file://" + e.storeD
	return e
}

// result of running amlfs.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
}

// amlfs runs the binary to completion.
func (e *env) amlfs(args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := e.bin
	if bin == "" {
		bin = amlfsBin
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	// Each env is a host of its own: its own runtime dir, and its own
	// user cache (where the store probe is remembered).
	cmd.Env = append(append(os.Environ(), e.extraEnv...), "AMLFS_RUNTIME_DIR="+e.runtime, "XDG_CACHE_HOME="+filepath.Join(e.root, "xdg"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("run amlfs: %v", err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// folder makes the env's commands save folder revisions unless told
// otherwise (AMLFS_FORMAT): for tests of the folder layout itself (they
// read or remove a file's object), where the default is an archive.
func (e *env) folder() *env {
	e.extraEnv = append(e.extraEnv, "AMLFS_FORMAT=folder")
	return e
}

func (e *env) wsArgs(id string, extra ...string) []string {
	args := append([]string{"--store", e.store, "--id", id, "--cache-dir", e.cache}, e.storeArgs...)
	return append(args, extra...)
}

// storeFlags names workspace id's store, for the revisions commands.
func (e *env) storeFlags(id string) []string {
	return append([]string{"--store", e.store, "--id", id}, e.storeArgs...)
}

func isEmptyDir(p string) bool {
	ents, err := os.ReadDir(p)
	return err == nil && len(ents) == 0
}

// mount mounts workspace id with --daemon and registers cleanup.
func (e *env) mount(id string, extra ...string) string {
	e.t.Helper()
	mp := filepath.Join(e.root, "mnt-"+strings.ReplaceAll(id, "/", "_"))
	r := e.mountAt(mp, id, extra...)
	if r.code != 0 {
		e.t.Fatalf("mount: %s", r)
	}
	return mp
}

func (e *env) mountAt(mp, id string, extra ...string) result {
	e.t.Helper()
	// A mount that names no --serve is served as amlfs does by default
	// (natively, where that can run), or as AMLFS_TEST_SERVE says (fuse:
	// TestFUSESuite's run).
	mode := ""
	if !slices.Contains(extra, "--serve") {
		mode = os.Getenv("AMLFS_TEST_SERVE")
		switch {
		case mode != "":
			extra = append(extra[:len(extra):len(extra)], "--serve", mode)
		case !slices.Contains(extra, "-o"): // -o may name a FUSE option: FUSE then
			mode = defaultServe(e)
		}
	}
	args := append([]string{"mount", "--daemon", mp}, e.wsArgs(id, extra...)...)
	r := e.amlfs(args...)
	if r.code == 0 {
		e.t.Cleanup(func() { e.forceUnmount(mp) })
		// No silent fallback: a run in one mode runs in that mode.
		if mode != "" {
			if s := serveOf(e.t, e, mp); s != mode {
				e.t.Fatalf("mounted with --serve %s, serving %s", mode, s)
			}
		}
	}
	return r
}

// forceUnmount is the cleanup: an unsaved unmount, then a lazy detach if
// anything is left.
func (e *env) forceUnmount(mp string) {
	e.amlfs("unmount", "--no-save", mp)
	for i := 0; i < 50 && isMounted(mp); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if isMounted(mp) {
		syscall.Unmount(mp, syscall.MNT_DETACH)
	}
}

func isMounted(mp string) bool {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == mp {
			return true
		}
	}
	return false
}

func (e *env) unmount(mp string, extra ...string) result {
	e.t.Helper()
	return e.amlfs(append([]string{"unmount", mp}, extra...)...)
}

// sh runs a shell script in dir and fails the test on error.
func sh(t *testing.T, dir, script string) string {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s\n%s: %v", script, out, err)
	}
	return string(out)
}

// treeDigest describes every path, type, mode and content hash under dir.
func treeDigest(t *testing.T, dir string, skip func(rel string) bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if skip != nil && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%v", fi.Mode())
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			io.Copy(h, f)
			f.Close()
			desc += " " + hex.EncodeToString(h.Sum(nil))
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffDigests(a, b map[string]string) []string {
	var diffs []string
	for k, v := range a {
		if b[k] != v {
			diffs = append(diffs, fmt.Sprintf("%s: %q vs %q", k, v, b[k]))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: only in second", k))
		}
	}
	sort.Strings(diffs)
	return diffs
}

// needTools skips t when one of tools is missing, or fails it under CI,
// where .ci/run must have installed pkg, which provides them.
func needTools(t *testing.T, pkg string, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s (%s) is missing; .ci/run must install it", tool, pkg)
			}
			t.Skipf("%s (%s) is missing", tool, pkg)
		}
	}
}

// traversable opens e.root and every directory above it (below $TMPDIR)
// to other users, for a test that runs something as another user.
func (e *env) traversable() {
	for d := e.root; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
}

// attackerBin is a copy of this test binary that another user may run
// (as AMLFS_TEST_CHILD), under a traversable e.root.
func (e *env) attackerBin() string {
	e.t.Helper()
	e.traversable()
	bin := filepath.Join(e.root, "bin", "attacker")
	must(e.t, os.MkdirAll(filepath.Dir(bin), 0o755))
	src, err := os.ReadFile(os.Args[0])
	must(e.t, err)
	must(e.t, os.WriteFile(bin, src, 0o755))
	return bin
}

var nonRace struct {
	once sync.Once
	bin  string
	err  error
}

// nonRaceBin is amlfs built without the race detector, once per test
// process, for the tests that measure the daemon (its RSS) or drive it
// hard for long (pjdfstest), where the detector's cost would dominate.
func nonRaceBin(t *testing.T) string {
	t.Helper()
	nonRace.once.Do(func() {
		nonRace.bin = filepath.Join(filepath.Dir(amlfsBin), "amlfs-norace")
		if out, err := exec.Command("go", "build", "-o", nonRace.bin, "../cmd/amlfs").CombinedOutput(); err != nil {
			nonRace.err = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if nonRace.err != nil {
		t.Fatal(nonRace.err)
	}
	return nonRace.bin
}
