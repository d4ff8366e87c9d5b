package integration

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io/fs"
	"math/rand/v2"
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
	e.folder() // counts requests for each file's object
	mp := e.mount("lazy")
	// 100 dirs x 100 files of 20 KB each = 200 MB, written from here
	// rather than by a process per file, with their digests.
	sums := map[string][32]byte{}
	rnd := rand.New(rand.NewPCG(1, 18))
	buf := make([]byte, 20000)
	for d := range 100 {
		must(t, os.Mkdir(filepath.Join(mp, fmt.Sprintf("d%d", d)), 0o755))
		for f := range 100 {
			for i := 0; i < len(buf); i += 8 {
				binary.LittleEndian.PutUint64(buf[i:], rnd.Uint64())
			}
			name := fmt.Sprintf("d%d/f%d", d, f)
			must(t, os.WriteFile(filepath.Join(mp, name), buf, 0o644))
			sums[name] = sha256.Sum256(buf)
		}
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save: %s", r)
	}

	// Another host mounts with no prefetch: only the manifest is read.
	other := newS3EnvAt(t, srv, e.prefix)
	other.folder() // a test of the folder layout
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
		data, err := os.ReadFile(filepath.Join(mp2, name))
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(data) != sums[name] {
			t.Errorf("%s: not the bytes saved", name)
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
	n := 0
	must(t, filepath.WalkDir(mp2, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(mp2, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if want, ok := sums[rel]; !ok || sha256.Sum256(data) != want {
			t.Errorf("%s: not the bytes saved", rel)
		}
		n++
		return nil
	}))
	if n != len(sums) {
		t.Errorf("%d files restored, %d saved", n, len(sums))
	}
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
