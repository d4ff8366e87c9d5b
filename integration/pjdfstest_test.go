package integration

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pjdfstest is the classic POSIX suite, vendored under third_party (BSD-2).
// It is built once per source digest into the tools cache.
func pjdfstest(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs("../third_party/pjdfstest")
	must(t, err)
	h := sha256.New()
	must(t, filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		fmt.Fprintf(h, "%s %d\n", strings.TrimPrefix(p, src), len(b))
		h.Write(b)
		return err
	}))
	home, _ := os.UserHomeDir()
	cache := filepath.Join(home, ".cache", "amlfs-tools", fmt.Sprintf("pjdfstest-%x", h.Sum(nil)[:6]))
	if fileExists(filepath.Join(cache, "pjdfstest")) {
		return cache
	}
	needTools(t, "autoconf automake gcc make perl, for pjdfstest", "autoreconf", "automake", "gcc", "make", "perl", "prove")
	build := t.TempDir() + "/pjdfstest"
	must(t, exec.Command("cp", "-r", src, build).Run())
	cmd := exec.Command("sh", "-ec", "autoreconf -ifs && ./configure && make pjdfstest")
	cmd.Dir = build
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build pjdfstest: %v\n%s", err, out)
	}
	must(t, os.MkdirAll(filepath.Dir(cache), 0o755))
	os.RemoveAll(cache)
	must(t, exec.Command("cp", "-r", build, cache).Run())
	return cache
}

// pjdResult is one run of the suite: how many tests ran, and the failed
// test numbers of each file that had any.
type pjdResult struct {
	tests    int
	failed   map[string]string
	out      string
	timedOut bool
}

var (
	pjdFile   = regexp.MustCompile(`^(\S+\.t)\s+\(Wstat: (\d+)`)
	pjdFailed = regexp.MustCompile(`^\s+(?:Failed tests?|Parse errors):\s+(.*)$`)
	pjdTotal  = regexp.MustCompile(`Files=\d+, Tests=(\d+),`)
)

// runPjdfstest runs the whole suite in dir, as ext4 is tested: the rename
// ctime tests too, which pjdfstest runs only on file systems it knows.
func runPjdfstest(t *testing.T, suite, dir string) pjdResult {
	t.Helper()
	r := runPjdfstestOnce(t, suite, dir)
	if r.tests == 0 && !r.timedOut {
		// Seen once in about ten runs on the host mount: prove's
		// File::Find got no working directory in a directory made a
		// moment before, and ran nothing. Not understood yet; say so,
		// and start it once more.
		t.Logf("pjdfstest in %s could not start; again:\n%s", dir, r.out)
		r = runPjdfstestOnce(t, suite, dir)
	}
	if r.tests == 0 {
		t.Errorf("pjdfstest in %s ran no tests:\n%s", dir, r.out)
	}
	return r
}

func runPjdfstestOnce(t *testing.T, suite, dir string) pjdResult {
	// Four runs at once take about 15 minutes on 2 cores; one that hangs
	// (a request the daemon never answers) fails within 25, not at the
	// suite's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "prove", "-rQ", filepath.Join(suite, "tests"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PJDFSTEST_FS=EXT4")
	cmd.WaitDelay = 10 * time.Second
	out, _ := cmd.CombinedOutput()
	r := pjdResult{failed: map[string]string{}, out: string(out), timedOut: ctx.Err() != nil}
	if r.timedOut {
		t.Errorf("pjdfstest in %s hung for 25 minutes and was stopped:\n%s", dir, out)
	}
	file := ""
	for _, l := range strings.Split(string(out), "\n") {
		if m := pjdFile.FindStringSubmatch(l); m != nil {
			file = strings.TrimPrefix(m[1], filepath.Join(suite, "tests")+"/")
			if m[2] != "0" {
				r.failed[file] += "exit " + m[2] + " "
			}
		} else if m := pjdFailed.FindStringSubmatch(l); m != nil && file != "" {
			r.failed[file] += strings.TrimSpace(m[1])
		} else if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "                ") {
			if _, ok := r.failed[file]; ok && file != "" && !strings.Contains(l, "passed") {
				r.failed[file] += " " + strings.TrimSpace(l)
			}
		}
		if m := pjdTotal.FindStringSubmatch(l); m != nil {
			r.tests, _ = strconv.Atoi(m[1])
		}
	}
	return r
}

func (r pjdResult) String() string {
	var files []string
	for f, which := range r.failed {
		files = append(files, f+": "+which)
	}
	sort.Strings(files)
	return fmt.Sprintf("%d tests, failed in %d files:\n%s", r.tests, len(files), strings.Join(files, "\n"))
}

// TestPjdfstest runs pjdfstest on the native disk, the workspace, a
// host-directory live mount and an S3 live mount, side by side. The
// workspace and the host mount must pass every test the native disk
// passes, and run as many. The S3 mount is not POSIX (README: Live mounts
// on S3): it must fail in exactly the files the README lists, no more, so
// that a regression, or a fix, shows.
func TestPjdfstest(t *testing.T) {
	if testing.Short() {
		t.Skip("pjdfstest takes minutes")
	}
	suite := pjdfstest(t)
	// Four runs of the suite at once are CPU-bound on a small machine:
	// the daemons are built without the race detector here.
	e := newEnv(t)
	e.bin = nonRaceBin(t)
	host := filepath.Join(e.root, "host")
	must(t, os.Mkdir(host, 0o755))
	mp := e.mount("pjd", "--serve", "fuse", "--mount", "/shared=file://"+host)
	// pjdfstest's files are not for saving: it leaves none, but a
	// failed run may.
	must(t, os.WriteFile(filepath.Join(mp, ".gitignore"), []byte("/pjd/\n"), 0o644))
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "pjd")
	l.bin = e.bin
	s3mp := l.mountNone("pjd")
	dirs := map[string]string{"workspace": filepath.Join(mp, "pjd"), "shared": filepath.Join(mp, "shared", "pjd"), "s3": filepath.Join(s3mp, "s")}
	// The reference run is the workspace served natively, which is the
	// cache disk itself through a bind mount: it must pass everything,
	// as the disk does, and it is the native mode's run of the suite.
	// Where native serving cannot run, the reference is a plain
	// directory on the disk.
	if nativeServing(e) {
		nmp := e.mount("pjd-native", "--serve", "native")
		must(t, os.WriteFile(filepath.Join(nmp, ".gitignore"), []byte("/pjd/\n"), 0o644))
		dirs["native"] = filepath.Join(nmp, "pjd")
		must(t, os.Mkdir(dirs["native"], 0o755))
		if s := serveOf(t, e, nmp); s != "native" {
			t.Fatalf("the native reference is served by %s", s)
		}
	} else {
		t.Log("native serving cannot run here: the reference is a plain directory")
		dirs["native"] = t.TempDir()
	}
	must(t, os.Mkdir(dirs["workspace"], 0o755))
	must(t, os.Mkdir(dirs["shared"], 0o755))
	results := map[string]pjdResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, dir := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			r := runPjdfstest(t, suite, dir)
			t.Logf("pjdfstest on the %s: %d tests in %v", name, r.tests, time.Since(start).Round(time.Second))
			mu.Lock()
			results[name] = r
			mu.Unlock()
		}()
	}
	wg.Wait()
	native := results["native"]
	if len(native.failed) != 0 {
		t.Fatalf("pjdfstest fails on the native disk itself: %s", native)
	}
	for _, name := range []string{"workspace", "shared"} {
		r := results[name]
		t.Logf("%s: %d tests, native %d", name, r.tests, native.tests)
		if len(r.failed) != 0 || r.tests != native.tests {
			t.Errorf("pjdfstest on the %s: %s\n(native: %d tests, all passed)\n%s", name, r, native.tests, r.out)
		}
	}
	r := results["s3"]
	t.Logf("S3 live mount: %s", r)
	want := s3PjdfstestFailures(t)
	var got []string
	for f := range r.failed {
		got = append(got, f)
	}
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("pjdfstest on the S3 live mount failed in\n  %v\nthe README lists\n  %v", got, want)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	if r := l.unmount(s3mp); r.code != 0 {
		t.Fatalf("unmount S3: %s", r)
	}
}

// s3PjdfstestFailures reads the documented list (docs/live-mounts.md) of
// the pjdfstest files that
// fail on an S3 live mount: the lines "- `chmod/00.t`: ..." between the
// markers.
func s3PjdfstestFailures(t *testing.T) []string {
	b, err := os.ReadFile("../docs/live-mounts.md")
	must(t, err)
	s := string(b)
	start := strings.Index(s, "<!-- pjdfstest-s3 -->")
	end := strings.Index(s, "<!-- /pjdfstest-s3 -->")
	if start < 0 || end < start {
		t.Fatal("docs/live-mounts.md has no pjdfstest-s3 list")
	}
	var files []string
	for _, m := range regexp.MustCompile("(?m)^- `([a-z_]+/\\d+\\.t)`").FindAllStringSubmatch(s[start:end], -1) {
		files = append(files, m[1])
	}
	sort.Strings(files)
	return files
}
