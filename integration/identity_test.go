package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestReplacedFilesKeepNewBytes: after a lazy restore on a fresh cache
// dir, files replaced as editors, git checkout, npm and pip replace them
// (rm then create, rm then recreate at one path, a temp file renamed
// over) keep their new bytes, live, after a commit and in the revision a
// fresh cache dir restores, whether the prefetch runs or not. ext4 gives
// a freed inode number to the next file made; the engine once kept the
// placeholders not fetched yet by number, and filled the new files with
// the removed ones' old bytes.
func TestReplacedFilesKeepNewBytes(t *testing.T) {
	for _, prefetch := range []string{"0", "8"} {
		t.Run("prefetch="+prefetch, func(t *testing.T) {
			e := newEnv(t)
			const n = 60
			mp := e.mount("replaced")
			for i := 0; i < n; i++ {
				must(t, os.WriteFile(filepath.Join(mp, fmt.Sprintf("f%d", i)), []byte(fmt.Sprintf("old %d\n", i)), 0o644))
			}
			if r := e.unmount(mp); r.code != 0 {
				t.Fatalf("save: %s", r)
			}
			e.cache = filepath.Join(e.root, "cache-lazy")
			mp = e.mount("replaced", "--prefetch", prefetch)
			// A third each: rm then create another name, rm then
			// recreate, a temp file renamed over.
			sh(t, mp, `i=0
while [ $i -lt 20 ]; do rm f$i; echo "new $i" > g$i; i=$((i+1)); done
while [ $i -lt 40 ]; do rm f$i; echo "again $i" > f$i; i=$((i+1)); done
while [ $i -lt 60 ]; do echo "renamed $i" > .f$i.tmp; mv .f$i.tmp f$i; i=$((i+1)); done`)
			want := map[string]string{}
			for i := 0; i < n; i++ {
				switch {
				case i < 20:
					want[fmt.Sprintf("g%d", i)] = fmt.Sprintf("new %d\n", i)
				case i < 40:
					want[fmt.Sprintf("f%d", i)] = fmt.Sprintf("again %d\n", i)
				default:
					want[fmt.Sprintf("f%d", i)] = fmt.Sprintf("renamed %d\n", i)
				}
			}
			check := func(when, dir string) {
				t.Helper()
				bad := 0
				for p, c := range want {
					if got, err := os.ReadFile(filepath.Join(dir, p)); string(got) != c {
						if bad++; bad <= 3 {
							t.Errorf("%s: %s is %q (%v), want %q", when, p, got, err, c)
						}
					}
				}
				if bad > 0 {
					t.Errorf("%s: %d of %d files wrong", when, bad, len(want))
				}
				if des, _ := os.ReadDir(dir); len(des) != len(want) {
					t.Errorf("%s: %d entries, want %d", when, len(des), len(want))
				}
			}
			check("before the commit", mp)
			if r := e.amlfs("commit", mp); r.code != 0 {
				t.Fatalf("commit: %s", r)
			}
			check("after the commit", mp)
			if r := e.unmount(mp); r.code != 0 {
				t.Fatalf("unmount: %s", r)
			}
			e.cache = filepath.Join(e.root, "cache-fresh")
			mp = e.mount("replaced")
			check("restored on a fresh cache dir", mp)
		})
	}
}
