package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestSoak runs 16 workers that write, rewrite (in place and by rename),
// read back, rename and delete files of mixed sizes (1 byte to 48 MiB) on a
// workspace mount for AMLFS_SOAK_DURATION (default 1m; CI runs 10m), with
// an `amlfs commit` every 20 s. Every read is checked against the workers'
// model; at the end every file on the mount and every file of every
// retained revision is checked by SHA-256. It reports the daemon's peak
// RSS, which must stay bounded whatever the file sizes: the daemon streams
// data, it never holds a file.
//
// The daemon is built without the race detector here, so that its RSS is
// the one users see.
func TestSoak(t *testing.T) {
	dur := time.Minute
	if s := os.Getenv("AMLFS_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("AMLFS_SOAK_DURATION: %v", err)
		}
		dur = d
	}
	e := newEnv(t)
	e.bin = nonRaceBin(t)
	mp := filepath.Join(e.root, "mnt")
	// Through FUSE, whose daemon carries every byte: natively it carries
	// none, and its RSS says nothing.
	if r := e.mountAt(mp, "soak", "--serve", "fuse", "--retention", "4"); r.code != 0 {
		t.Fatalf("mount: %s", r)
	}
	pid := e.pid(mp)

	const workers, slots = 16, 6
	m := &soakModel{files: map[string]string{}}
	var stop atomic.Bool
	var ops, bytesOut, bytesIn atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			dir := filepath.Join(mp, fmt.Sprintf("w%02d", w))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				errs <- err
				return
			}
			for !stop.Load() {
				if err := soakOp(m, rng, mp, dir, slots, &bytesOut, &bytesIn); err != nil {
					errs <- err
					stop.Store(true)
					return
				}
				ops.Add(1)
			}
		}()
	}
	// Commits, each recording the tree it saved.
	saved := map[string]map[string]string{}
	deadline := time.Now().Add(dur)
	var peak int64
	for time.Now().Before(deadline) && !stop.Load() {
		time.Sleep(min(20*time.Second, time.Until(deadline)))
		peak = max(peak, vmHWM(t, pid))
		m.mu.Lock()
		r := e.amlfs("commit", mp)
		if r.code != 0 {
			m.mu.Unlock()
			t.Fatalf("commit: %s", r)
		}
		saved[strings.TrimSpace(r.stdout)] = m.snapshot()
		m.mu.Unlock()
		t.Logf("%s: committed %s: %d files, %d ops, %d MiB written, %d MiB read, RSS peak %d MiB",
			time.Until(deadline).Round(time.Second), strings.TrimSpace(r.stdout), len(saved[strings.TrimSpace(r.stdout)]), ops.Load(), bytesOut.Load()>>20, bytesIn.Load()>>20, peak>>20)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Every file on the mount, by checksum.
	final := m.snapshot()
	if got := soakTree(t, mp); !sameFiles(got, final) {
		t.Fatalf("the mount differs from the model: %d files on the mount, %d in the model", len(got), len(final))
	}
	peak = max(peak, vmHWM(t, pid))
	r := e.amlfs("unmount", mp)
	if r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	saved[strings.TrimSpace(r.stdout)] = final
	// Every retained revision, by checksum, read straight from the store.
	idx := readIndex(t, e, "soak")
	if len(idx.Revisions) < 2 {
		t.Fatalf("only %d revisions retained", len(idx.Revisions))
	}
	hashes := map[uint64]string{} // by inode: revisions share unchanged files
	for _, rv := range idx.Revisions {
		want, ok := saved[rv.ID]
		if !ok {
			t.Fatalf("revision %s was not made by this test (saved: %d)", rv.ID, len(saved))
		}
		got := map[string]string{}
		root := filepath.Join(e.storeD, "soak", filepath.FromSlash(rv.Path), "files")
		filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() {
				return err
			}
			ino := fi.Sys().(*syscall.Stat_t).Ino
			if _, ok := hashes[ino]; !ok {
				hashes[ino] = fileSHA(t, p)
			}
			rel, _ := filepath.Rel(root, p)
			got[filepath.ToSlash(rel)] = hashes[ino]
			return nil
		})
		if !sameFiles(got, want) {
			t.Fatalf("revision %s differs from the tree committed: %d files, want %d", rv.ID, len(got), len(want))
		}
	}
	t.Logf("soak %s: %d ops, %d MiB written, %d MiB read, %d commits, %d revisions verified; daemon peak RSS %d MiB",
		dur, ops.Load(), bytesOut.Load()>>20, bytesIn.Load()>>20, len(saved), len(idx.Revisions), peak>>20)
	if peak > 256<<20 {
		t.Errorf("daemon peak RSS %d MiB is over 256 MiB", peak>>20)
	}
}

// soakModel is what the workers have written: path (relative to the
// mount) to SHA-256. Workers hold mu for reading while they change a file
// and its entry together; a commit holds it for writing.
type soakModel struct {
	mu    sync.RWMutex
	fmu   sync.Mutex
	files map[string]string // GUARDED_BY(fmu)
}

func (m *soakModel) get(p string) (string, bool) {
	m.fmu.Lock()
	defer m.fmu.Unlock()
	h, ok := m.files[p]
	return h, ok
}

func (m *soakModel) set(p, h string) {
	m.fmu.Lock()
	defer m.fmu.Unlock()
	if h == "" {
		delete(m.files, p)
	} else {
		m.files[p] = h
	}
}

func (m *soakModel) snapshot() map[string]string {
	m.fmu.Lock()
	defer m.fmu.Unlock()
	c := make(map[string]string, len(m.files))
	for k, v := range m.files {
		c[k] = v
	}
	return c
}

// soakSize draws a file size: mostly small, some of a few MiB, a few large.
func soakSize(rng *rand.Rand) int {
	switch r := rng.IntN(100); {
	case r < 60:
		return 1 + rng.IntN(64<<10)
	case r < 92:
		return rng.IntN(4 << 20)
	default:
		return 16<<20 + rng.IntN(32<<20)
	}
}

// soakOp does one random operation in dir and checks what it reads.
func soakOp(m *soakModel, rng *rand.Rand, mp, dir string, slots int, out, in *atomic.Int64) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	name := func() string { return filepath.Join(dir, "f"+strconv.Itoa(rng.IntN(slots))) }
	rel := func(p string) string { r, _ := filepath.Rel(mp, p); return filepath.ToSlash(r) }
	p := name()
	switch op := rng.IntN(100); {
	case op < 35: // write in place, sometimes fsync'd
		h, n, err := writeRandom(p, p, soakSize(rng), rng.Uint64(), rng.IntN(4) == 0)
		if err != nil {
			return err
		}
		out.Add(n)
		m.set(rel(p), h)
	case op < 50: // write a temporary file and rename it over (as editors do)
		tmp := p + ".tmp"
		h, n, err := writeRandom(tmp, p, soakSize(rng), rng.Uint64(), false)
		if err != nil {
			return err
		}
		out.Add(n)
		m.set(rel(p), h)
	case op < 85: // read back and check
		want, ok := m.get(rel(p))
		if !ok {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				return fmt.Errorf("%s: the model has no such file, stat says %v", p, err)
			}
			return nil
		}
		got := fileSHAErr(p, in)
		if got != want {
			return fmt.Errorf("%s: read sha %s, want %s", p, got, want)
		}
	case op < 93: // delete
		err := os.Remove(p)
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		m.set(rel(p), "")
	default: // rename onto another slot
		q := name()
		if _, ok := m.get(rel(p)); !ok || p == q {
			return nil
		}
		if err := os.Rename(p, q); err != nil {
			return err
		}
		h, _ := m.get(rel(p))
		m.set(rel(q), h)
		m.set(rel(p), "")
	}
	return nil
}

// writeRandom writes size pseudo-random bytes from seed to tmp, renames it
// to p if they differ, and returns the bytes' SHA-256.
func writeRandom(tmp, p string, size int, seed uint64, sync bool) (string, int64, error) {
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return "", 0, err
	}
	src := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24), byte(seed >> 32), byte(seed >> 40), byte(seed >> 48), byte(seed >> 56)})
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(src, int64(size)), make([]byte, 256<<10))
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && tmp != p {
		err = os.Rename(tmp, p)
	}
	return hex.EncodeToString(h.Sum(nil)), n, err
}

func fileSHAErr(p string, in *atomic.Int64) string {
	f, err := os.Open(p)
	if err != nil {
		return "open: " + err.Error()
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "read: " + err.Error()
	}
	if in != nil {
		in.Add(n)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	s := fileSHAErr(p, nil)
	if strings.Contains(s, ": ") {
		t.Fatalf("%s: %s", p, s)
	}
	return s
}

// soakTree hashes every regular file under dir, by relative path.
func soakTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			out[filepath.ToSlash(rel)] = fileSHA(t, p)
		}
		return nil
	})
	return out
}

func sameFiles(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// vmHWM is the peak resident set size of process pid, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
