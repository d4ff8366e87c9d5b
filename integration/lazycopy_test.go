package integration

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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
