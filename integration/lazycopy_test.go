package integration

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLazyCopyTools: on a lazily restored tree with prefetch off, every
// everyday copy reads each file's real bytes, in both serving modes:
// cp, cp -r, cp --sparse=always, install, rsync, tar --sparse, mv to
// another mount, and SQLite opening a copied database. These reach a
// placeholder with lseek(SEEK_DATA) and copy_file_range, which read no
// byte: natively they copied zeros before placeholders were filled on
// open. du counts a lazy tree's blocks.
func TestLazyCopyTools(t *testing.T) {
	needTools(t, "sqlite3 rsync", "sqlite3", "rsync", "install", "tar")
	for _, serve := range []string{"fuse", "native"} {
		t.Run(serve, func(t *testing.T) {
			e := newEnv(t)
			if serve == "native" {
				needNative(t, e)
			}
			mp := e.mount("copies", "--serve", serve)
			want := map[string][]byte{}
			for _, name := range []string{"cp.bin", "sparse.bin", "install.bin", "rsync.bin", "tar.bin", "mv.bin", "tree/a.bin", "tree/sub/b.bin", "du/c.bin"} {
				data := make([]byte, 100_000+len(name))
				rand.Read(data)
				must(t, os.MkdirAll(filepath.Dir(filepath.Join(mp, name)), 0o755))
				must(t, os.WriteFile(filepath.Join(mp, name), data, 0o644))
				want[name] = data
			}
			sh(t, mp, `sqlite3 db.sqlite "PRAGMA journal_mode=WAL; CREATE TABLE t(x); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i<2000) INSERT INTO t SELECT randomblob(100) FROM n;" >/dev/null`)
			if r := e.unmount(mp); r.code != 0 {
				t.Fatalf("save: %s", r)
			}
			h := e.host(t)
			mp2 := h.mount("copies", "--serve", serve, "--prefetch", "0")
			if serveOf(t, h, mp2) != serve {
				t.Fatalf("not served %s", serve)
			}
			// du before anything is fetched.
			out := sh(t, mp2, "du -sk du")
			if kb, _ := strconv.Atoi(strings.Fields(out)[0]); kb < 90 {
				t.Errorf("du -sk of a lazily restored directory with 100 kB in it: %s", out)
			}
			dst := t.TempDir() // another mount: mv copies
			sh(t, mp2, fmt.Sprintf(`cp cp.bin %[1]s/cp.bin
cp -r tree %[1]s/tree
cp --sparse=always sparse.bin %[1]s/sparse.bin
install -m 644 install.bin %[1]s/install.bin
rsync -a rsync.bin %[1]s/rsync.bin
tar --sparse -cf %[1]s/t.tar tar.bin && mkdir %[1]s/x && tar -C %[1]s/x -xf %[1]s/t.tar && mv %[1]s/x/tar.bin %[1]s/tar.bin
mv mv.bin %[1]s/mv.bin
cp db.sqlite %[1]s/db.sqlite`, dst))
			for name, data := range want {
				if strings.HasPrefix(name, "du/") {
					continue
				}
				got, err := os.ReadFile(filepath.Join(dst, name))
				if err != nil || !bytes.Equal(got, data) {
					t.Errorf("%s copied from a placeholder: %d bytes, equal %v, %v", name, len(got), bytes.Equal(got, data), err)
				}
			}
			out2, err := exec.Command("sqlite3", filepath.Join(dst, "db.sqlite"), "PRAGMA integrity_check; SELECT count(*) FROM t;").CombinedOutput()
			if err != nil || string(out2) != "ok\n2000\n" {
				t.Errorf("the copied database: %q %v", out2, err)
			}
			if _, err := os.Stat(filepath.Join(mp2, "mv.bin")); !os.IsNotExist(err) {
				t.Errorf("mv left its source: %v", err)
			}
		})
	}
}

// TestStalledStoreBounded: a store that stops answering holds a reader
// of a file not fetched yet for --fetch-timeout at most, which then gets
// EIO, and an unmount while readers wait ends in seconds, in both serving
// modes (issue 26, row 6: 964 s and 16 minutes before).
func TestStalledStoreBounded(t *testing.T) {
	for _, serve := range []string{"fuse", "native"} {
		t.Run(serve, func(t *testing.T) {
			e, px := faultyS3Env(t)
			e.folder() // the faults target a file's object
			if serve == "native" {
				needNative(t, e)
			}
			mp := e.mount("stall", "--serve", serve)
			for i := 0; i < 4; i++ {
				must(t, os.WriteFile(filepath.Join(mp, fmt.Sprintf("f%d", i)), bytes.Repeat([]byte{'x'}, 4096), 0o644))
			}
			if r := e.unmount(mp); r.code != 0 {
				t.Fatalf("save: %s", r)
			}
			h := e.host(t)
			mp2 := h.mount("stall", "--serve", serve, "--prefetch", "0", "--fetch-timeout", "3s")
			px.set(&fault{kind: faultStall, match: func(r *http.Request) bool { return isGet(r) && strings.Contains(r.URL.Path, "/files/") }})
			start := time.Now()
			_, err := os.ReadFile(filepath.Join(mp2, "f0"))
			if took := time.Since(start); !errorsIs(err, syscall.EIO) || took > 10*time.Second {
				t.Errorf("read with the store stalled: %v after %v, want EIO within the 3 s fetch timeout", err, took)
			}
			// Readers waiting while the daemon stops.
			done := make(chan error, 2)
			for _, name := range []string{"f1", "f2"} {
				go func() { _, err := os.ReadFile(filepath.Join(mp2, name)); done <- err }()
			}
			time.Sleep(500 * time.Millisecond)
			start = time.Now()
			r := h.unmount(mp2, "--no-save")
			if took := time.Since(start); r.code != 0 || took > 15*time.Second {
				t.Errorf("unmount with readers waiting on a stalled store: %v, %s", took, r)
			}
			for i := 0; i < 2; i++ {
				select {
				case err := <-done:
					if err == nil {
						t.Errorf("a reader got bytes from a stalled store")
					}
				case <-time.After(15 * time.Second):
					t.Fatal("a reader still waits after the unmount")
				}
			}
			px.set()
		})
	}
}
