package integration

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A folder revision of 10,000 files and 200 MB mounts before its bytes are
// fetched: stat works at once, and reading any file returns its exact
// bytes, fetched on first open.
func TestS3LazyRestore(t *testing.T) {
	srv, proxy, e := proxiedS3Env(t)
	mp := e.mount("lazy")
	// 100 dirs x 100 files of 20 KB each = 200 MB, plus a checksum list.
	sh(t, mp, `for d in $(seq 0 99); do mkdir d$d; for f in $(seq 0 99); do head -c 20000 /dev/urandom > d$d/f$f; done; done; find . -type f | sort | xargs sha256sum > ../lazy.sums`)
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	sums := readFile(t, filepath.Join(e.root, "lazy.sums"))

	// Another host mounts with no prefetch: only the manifest is read.
	other := newS3EnvAt(t, srv, e.prefix)
	other.storeArgs = e.storeArgs
	proxy.reset()
	start := time.Now()
	mp2 := other.mount("lazy", "--prefetch", "0")
	ready := time.Since(start)
	proxy.mu.Lock()
	gets := proxy.fileGets
	proxy.mu.Unlock()
	if gets != 0 {
		t.Errorf("%d file objects fetched before the mount was ready", gets)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(mp2, "d57", "f13"), &st); err != nil || st.Size != 20000 {
		t.Fatalf("stat before fetch: %v size %d", err, st.Size)
	}
	r := other.amlfs("status", mp2, "--json")
	if !strings.Contains(r.stdout, `"pendingFiles": 10000`) {
		t.Errorf("status: %s", r.stdout)
	}
	// Any file reads exactly, fetching just that file.
	for _, name := range []string{"d0/f0", "d57/f13", "d99/f99"} {
		want := ""
		for _, line := range strings.Split(sums, "\n") {
			if strings.HasSuffix(line, " ./"+name) {
				want = strings.Fields(line)[0]
			}
		}
		data, err := os.ReadFile(filepath.Join(mp2, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(data)); got != want {
			t.Errorf("%s: sha256 %s, want %s", name, got, want)
		}
	}
	proxy.mu.Lock()
	gets = proxy.fileGets
	proxy.mu.Unlock()
	if gets != 3 {
		t.Errorf("%d file objects fetched for 3 reads", gets)
	}
	t.Logf("lazy mount of 10k files / 200 MB ready in %v", ready)
	// The whole tree checks out, and an unchanged save copies server-side.
	sh(t, mp2, "sha256sum -c --quiet "+filepath.Join(e.root, "lazy.sums"))
	if r := other.unmount(mp2); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// A lazily restored tree whose bytes were never fetched is saved correctly
// after a crash: the next mount finds the placeholders and fetches them.
func TestLazyRestoreSurvivesCrash(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("lc")
	sh(t, mp, "mkdir a && echo alpha > a/x && echo beta > b")
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}
	mp = e.mount("lc", "--prefetch", "0", "--no-lock")
	sh(t, mp, "chmod 600 b && echo new > c") // b stays a placeholder
	e.crash(mp)
	r := e.mountAt(mp, "lc", "--prefetch", "0", "--no-lock")
	if r.code != 0 {
		t.Fatalf("remount: %s", r)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save of the resumed tree: %s", r)
	}
	mp = e.mount("lc", "--restore", "full")
	for p, want := range map[string]string{"a/x": "alpha\n", "b": "beta\n", "c": "new\n"} {
		if got := readFile(t, filepath.Join(mp, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
}
