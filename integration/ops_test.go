package integration

import (
	"strings"
	"testing"
)

// TestRevisionsDiff checks `amlfs revisions diff` on a known pair of
// revisions, on both stores: the text lines and the JSON.
func TestRevisionsDiff(t *testing.T) { forEachStore(t, testRevisionsDiff) }

func testRevisionsDiff(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	mp := e.mount("diff", "--retention", "3")
	sh(t, mp, `mkdir -p src old && echo same > src/same.txt && echo aaaa > src/swap.txt && echo short > grow.txt && echo bye > old/gone.txt && echo '#!/bin/sh' > run.sh`)
	r := e.amlfs("commit", mp)
	if r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	a := strings.TrimSpace(r.stdout)
	sh(t, mp, `echo bbbb > src/swap.txt && echo much longer now > grow.txt && rm -r old && chmod 755 run.sh && printf hello > new.txt`)
	r = e.amlfs("commit", mp)
	if r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	b := strings.TrimSpace(r.stdout)
	r = e.amlfs(append([]string{"revisions", "diff", a, b}, e.storeFlags("diff")...)...)
	want := strings.Join([]string{
		"M  grow.txt  6 bytes -> 16 bytes",
		"A  new.txt  5 bytes",
		"D  old  directory",
		"D  old/gone.txt  4 bytes",
		"M  run.sh  10 bytes -> 10 bytes  mode 0644 -> 0755",
		"M  src/swap.txt  5 bytes -> 5 bytes  (content)",
	}, "\n") + "\n"
	if r.code != 0 || r.stdout != want {
		t.Fatalf("revisions diff:\n%s\nwant:\n%s", r, want)
	}
	r = e.amlfs(append([]string{"revisions", "diff", b, "current", "--json"}, e.storeFlags("diff")...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("diff of current against itself: %s", r)
	}
	r = e.amlfs(append([]string{"revisions", "diff", a}, e.storeFlags("diff")...)...)
	if r.code != 2 {
		t.Fatalf("diff with one revision: %s", r)
	}
	e.unmount(mp)
}
