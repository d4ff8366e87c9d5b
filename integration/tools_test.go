package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestGit(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("git")
	sh(t, mp, `
git init -q -b main repo && cd repo
for i in 1 2 3 4 5; do echo "line $i" > f$i.txt; done
mkdir -p sub && echo nested > sub/n.txt
git add -A && git commit -qm first
git branch feature && git checkout -q feature
echo change >> f1.txt && git mv f2.txt sub/f2.txt && git rm -q f3.txt
git commit -qam second
git checkout -q main && test "$(cat f1.txt)" = "line 1" && test -f f3.txt
git merge -q --no-edit feature && test ! -f f3.txt
git gc -q --aggressive
git fsck --full --strict
test -z "$(git status --porcelain)"
test "$(git rev-list --count HEAD)" = 2
`)
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	// The repository survives a save and restore intact.
	mp = e.mount("git")
	sh(t, filepath.Join(mp, "repo"), `git fsck --full --strict && test -z "$(git status --porcelain)" && git log --oneline | wc -l | grep -q 2`)
}

func TestEditorsAndSed(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("edit")
	// vim's own save path when it is installed, and the same dance by hand:
	// write a swap file, write the new content to a temp file, fsync, then
	// rename over the original.
	if _, err := exec.LookPath("vim.tiny"); err == nil {
		sh(t, mp, `printf 'alpha\nbeta\n' > v.txt && vim.tiny -u NONE -i NONE -n -es -c '%s/beta/gamma/' -c 'wq' v.txt; test "$(cat v.txt)" = "$(printf 'alpha\ngamma')"`)
	} else {
		t.Log("vim.tiny not installed; testing the swap-and-rename save by hand only")
	}
	sh(t, mp, `
printf 'one\ntwo\n' > doc.txt
ln doc.txt doc.hard
printf 'swap' > .doc.txt.swp
printf 'one\nTWO\n' > doc.txt~new && sync doc.txt~new
mv doc.txt~new doc.txt && rm .doc.txt.swp
test "$(cat doc.txt)" = "$(printf 'one\nTWO')"
test "$(cat doc.hard)" = "$(printf 'one\ntwo')"
sed -i 's/one/ONE/' doc.txt && test "$(head -1 doc.txt)" = ONE
sed -i.bak -e '1d' doc.txt && test "$(cat doc.txt)" = TWO && test -f doc.txt.bak
`)
}

func TestSQLiteConcurrentWriters(t *testing.T) {
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Skip("sqlite3 not installed")
	}
	e := newEnv(t)
	mp := e.mount("sqlite")
	for _, mode := range []string{"delete", "wal"} {
		db := filepath.Join(mp, mode+".db")
		sh(t, mp, fmt.Sprintf(`sqlite3 %s "PRAGMA journal_mode=%s; CREATE TABLE t(w INTEGER, i INTEGER);"`, db, mode))
		const writers, rows = 4, 50
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				var sql strings.Builder
				sql.WriteString(".timeout 30000\n")
				for i := 0; i < rows; i++ {
					fmt.Fprintf(&sql, "INSERT INTO t VALUES(%d, %d);\n", w, i)
				}
				cmd := exec.Command("sqlite3", db)
				cmd.Stdin = strings.NewReader(sql.String())
				if out, err := cmd.CombinedOutput(); err != nil {
					errs <- fmt.Errorf("writer %d: %v: %s", w, err, out)
				}
			}(w)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		out := sh(t, mp, fmt.Sprintf(`sqlite3 %s "PRAGMA integrity_check; SELECT count(*), count(DISTINCT w*1000+i) FROM t;"`, db))
		if want := fmt.Sprintf("ok\n%d|%d\n", writers*rows, writers*rows); out != want {
			t.Errorf("%s: got %q, want %q", mode, out, want)
		}
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	mp = e.mount("sqlite")
	out := sh(t, mp, `sqlite3 delete.db "PRAGMA integrity_check; SELECT count(*) FROM t;"`)
	if out != "ok\n200\n" {
		t.Errorf("after restore: %q", out)
	}
}

func TestUntarSourceTree(t *testing.T) {
	src := filepath.Join(getenvDefault("GOROOT_SRC", "/usr/local/go/src"))
	if _, err := os.Stat(src); err != nil {
		t.Skipf("no source tree at %s", src)
	}
	e := newEnv(t)
	tarball := filepath.Join(t.TempDir(), "src.tar")
	sh(t, filepath.Dir(src), fmt.Sprintf("tar -cf %s %s", tarball, filepath.Base(src)))
	mp := e.mount("untar", "--no-gitignore")
	sh(t, mp, fmt.Sprintf("tar -xf %s && diff -r %s src", tarball, src))
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	mp = e.mount("untar")
	sh(t, mp, fmt.Sprintf("diff -r %s src && rm -rf src && test -z \"$(ls -A)\"", src))
}

func getenvDefault(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
