package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/mount"
	"github.com/amlfs/amlfs/revision"
	"github.com/amlfs/amlfs/revision/format"
)

// entryNames are file names real trees hold that need care as S3 keys, in
// URLs, in copy sources, in JSON and in tar: every ASCII punctuation mark,
// spaces, control characters, unicode and a 255-byte name.
func entryNames() []string {
	names := []string{
		"a+b.txt", "+incompatible", "100%.txt", "%", "%2F", "a%20b", "what?.txt", "#hash", "a&b", "k=v",
		"with space.txt", " leading", "trailing ", `back\slash`, `"dq"`, "'sq'", "ctl\x01\x1f\x7f", "tab\there", "new\nline",
		"ünïcødé-日本語-🙂", "~tilde", "*star", "[br]", "semi;colon", "<lt>", "|pipe", "$dollar", "`tick`", "!bang",
		"@at", "^caret", "{brace}", "comma,", "colon:", ".hidden", "..dots", "-dash", "\u00a0nbsp", "e\u0301", // NFD
		strings.Repeat("n", 255), strings.Repeat("é", 127), // 254 bytes of two-byte runes
	}
	return names
}

// specialTree makes what npm, venv and a running program leave in a tree:
// relative, absolute, dangling and directory symlinks, a hard link, fifos, a
// socket, and exact (nanosecond) mtimes on files, directories and symlinks.
func specialTree(t *testing.T, mp string) {
	t.Helper()
	w := func(rel, data string) {
		t.Helper()
		p := filepath.Join(mp, rel)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(data), 0o644))
	}
	for i, n := range entryNames() {
		w(n, fmt.Sprintf("%d %q\n", i, n))
		w("odd dir +%?#&=/"+n, n)
	}
	w("node_modules/jest/bin/jest.js", "#!/usr/bin/env node\n")
	must(t, os.Chmod(filepath.Join(mp, "node_modules/jest/bin/jest.js"), 0o755))
	must(t, os.MkdirAll(filepath.Join(mp, "node_modules/.bin"), 0o755))
	for target, link := range map[string]string{
		"../jest/bin/jest.js": "node_modules/.bin/jest",
		"/etc/passwd":         "abs",
		"../nowhere/at all":   "dangling",
		"odd dir +%?#&=":      "dirlink",
		"a+b.txt":             "odd dir +%?#&=/link+1",
	} {
		must(t, os.Symlink(target, filepath.Join(mp, link)))
	}
	w("h1", "hard\n")
	must(t, os.Link(filepath.Join(mp, "h1"), filepath.Join(mp, "h2")))
	must(t, syscall.Mkfifo(filepath.Join(mp, "pipe"), 0o644))
	must(t, os.MkdirAll(filepath.Join(mp, "sub"), 0o755))
	must(t, syscall.Mkfifo(filepath.Join(mp, "sub", "pipe2"), 0o644))
	must(t, syscall.Mknod(filepath.Join(mp, "sock"), syscall.S_IFSOCK|0o644, 0))
	for rel, ns := range exactTimes() {
		ts := unix.NsecToTimespec(ns)
		must(t, unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(mp, rel), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// exactTimes are mtimes specialTree sets, by path: a file, a directory
// (set last, after its entries), and a symlink.
func exactTimes() map[string]int64 {
	return map[string]int64{
		"a+b.txt":                time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC).UnixNano(),
		"node_modules/.bin/jest": time.Date(2024, 1, 2, 3, 4, 5, 600000007, time.UTC).UnixNano(),
		"odd dir +%?#&=":         time.Date(2023, 7, 8, 9, 10, 11, 123456789, time.UTC).UnixNano(),
	}
}

// checkSpecialTree checks a restored specialTree: every name and its
// bytes, symlink targets, exact mtimes, hard links as equal files, and no
// special files.
func checkSpecialTree(t *testing.T, mp string) {
	t.Helper()
	mtime := func(rel string) int64 {
		var st unix.Stat_t
		must(t, unix.Lstat(filepath.Join(mp, rel), &st))
		return st.Mtim.Nano()
	}
	// Times first, before any read fetches a lazily restored file.
	for rel, ns := range exactTimes() {
		if got := mtime(rel); got != ns {
			t.Errorf("%q: mtime %d, saved %d", rel, got, ns)
		}
	}
	for i, n := range entryNames() {
		if got := readFile(t, filepath.Join(mp, n)); got != fmt.Sprintf("%d %q\n", i, n) {
			t.Errorf("%q holds %q", n, got)
		}
		if got := readFile(t, filepath.Join(mp, "odd dir +%?#&=", n)); got != n {
			t.Errorf("odd dir/%q holds %q", n, got)
		}
	}
	if got := mtime("a+b.txt"); got != exactTimes()["a+b.txt"] {
		t.Errorf("a+b.txt: mtime %d after a read, saved %d", got, exactTimes()["a+b.txt"])
	}
	for link, target := range map[string]string{
		"node_modules/.bin/jest": "../jest/bin/jest.js", "abs": "/etc/passwd", "dangling": "../nowhere/at all",
		"dirlink": "odd dir +%?#&=", "odd dir +%?#&=/link+1": "a+b.txt",
	} {
		fi, err := os.Lstat(filepath.Join(mp, link))
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s: %v, %v; want a symlink", link, fi, err)
			continue
		}
		if got, err := os.Readlink(filepath.Join(mp, link)); err != nil || got != target {
			t.Errorf("%s -> %q, %v; want %q", link, got, err, target)
		}
	}
	if got := readFile(t, filepath.Join(mp, "node_modules/.bin/jest")); got != "#!/usr/bin/env node\n" {
		t.Errorf("through node_modules/.bin/jest: %q", got)
	}
	if fi, err := os.Stat(filepath.Join(mp, "node_modules/jest/bin/jest.js")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("jest.js: %v %v", fi, err)
	}
	if a, b := readFile(t, filepath.Join(mp, "h1")), readFile(t, filepath.Join(mp, "h2")); a != "hard\n" || b != a {
		t.Errorf("hard links: %q %q", a, b)
	}
	for _, p := range []string{"pipe", "sub/pipe2", "sock"} {
		if _, err := os.Lstat(filepath.Join(mp, p)); err == nil {
			t.Errorf("special file %s was restored", p)
		}
	}
}

// TestRevisionEntries saves and restores what real sandboxes make, on both
// stores: symlinks, odd names, special files left out and reported, exact
// mtimes, through a lazy and a full restore on fresh cache dirs, and an
// incremental save that copies every unchanged odd-named object.
func TestRevisionEntries(t *testing.T) { forEachStore(t, testRevisionEntries) }

func testRevisionEntries(t *testing.T, newEnv func(*testing.T) *env) {
	e := newEnv(t)
	e.folder() // a test of the folder layout
	mp := e.mount("ents")
	specialTree(t, mp)
	r := e.unmount(mp)
	if r.code != 0 || !strings.Contains(r.stderr, "left out 3 special files") || !strings.Contains(r.stderr, "sub/pipe2") {
		t.Fatalf("unmount: %s", r)
	}
	idx := readIndex(t, e, "ents")
	mdata, err := os.ReadFile(filepath.Join(e.storeD, "ents", idx.Revisions[0].Path, "manifest.json"))
	must(t, err)
	checkAMLManifest(t, "manifest.json", mdata)
	if !bytes.Contains(mdata, []byte(`"amlfs":{"symlinks":[`)) {
		t.Errorf("no symlink extension in %s", mdata[:min(len(mdata), 300)])
	}

	// A lazy restore on another host, then an incremental save there.
	h := e.host(t)
	mp = h.mount("ents")
	checkSpecialTree(t, mp)
	sh(t, mp, "echo changed > 'a&b' && mkfifo new-pipe")
	r = h.amlfs("commit", mp)
	if r.code != 0 || !strings.Contains(r.stderr, "left out 1 special file ") || !strings.Contains(r.stderr, "new-pipe") {
		t.Fatalf("incremental commit: %s", r)
	}
	var st struct {
		LastSave struct {
			Reused              int      `json:"reused"`
			Uploaded            int      `json:"uploaded"`
			Symlinks            int      `json:"symlinks"`
			SpecialFilesSkipped int      `json:"specialFilesSkipped"`
			SpecialFiles        []string `json:"specialFiles"`
		} `json:"lastSave"`
	}
	must(t, json.Unmarshal([]byte(h.amlfs("status", mp, "--json").stdout), &st))
	if ls := st.LastSave; ls.Uploaded != 1 || ls.Reused < 2*len(entryNames()) || ls.Symlinks != 5 || ls.SpecialFilesSkipped != 1 || len(ls.SpecialFiles) != 1 {
		t.Errorf("status after the incremental save: %+v", ls)
	}
	if r := h.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}

	// A full restore on a third host sees the incremental revision whole.
	v := e.host(t)
	mp = v.mount("ents", "--restore", "full")
	if got := readFile(t, filepath.Join(mp, "a&b")); got != "changed\n" {
		t.Errorf("a&b = %q", got)
	}
	must(t, os.WriteFile(filepath.Join(mp, "a&b"), []byte(fmt.Sprintf("%d %q\n", 8, "a&b")), 0o644))
	checkSpecialTree(t, mp)
	if r := v.unmount(mp, "--no-save"); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// TestRevisionEntriesStrictAndArchive: --strict-entries fails a save that
// meets special files, naming every one; the archive format keeps
// symlinks (in its index, since AML's reader refuses them in the tar) and
// exact mtimes.
func TestRevisionEntriesStrictAndArchive(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("strict", "--strict-entries")
	sh(t, mp, "echo a > a && mkfifo p1 && mkdir d && mkfifo d/p2")
	r := e.amlfs("commit", mp)
	if r.code != 4 || !strings.Contains(r.stderr, "UNSUPPORTED_ENTRY") || !strings.Contains(r.stderr, `"p1"`) || !strings.Contains(r.stderr, `"d/p2"`) {
		t.Errorf("strict commit: %s", r)
	}
	if r := e.unmount(mp, "--no-save"); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}

	mp = e.mount("arch", "--format", "archive", "--load", "none")
	sh(t, mp, "echo a > a && ln -s a l1 && mkdir d && ln -s ../a d/l2 && mkfifo p && touch -d '2024-02-29 12:34:56.123456789 UTC' a d")
	if r := e.unmount(mp); r.code != 0 || !strings.Contains(r.stderr, "left out 1 special file ") {
		t.Fatalf("archive unmount: %s", r)
	}
	h := e.host(t)
	mp = h.mount("arch", "--format", "archive")
	want := time.Date(2024, 2, 29, 12, 34, 56, 123456789, time.UTC).UnixNano()
	for _, p := range []string{"a", "d"} {
		var st unix.Stat_t
		must(t, unix.Lstat(filepath.Join(mp, p), &st))
		if st.Mtim.Nano() != want {
			t.Errorf("%s: mtime %d, saved %d", p, st.Mtim.Nano(), want)
		}
	}
	for p, want := range map[string]string{"l1": "a", "d/l2": "../a"} {
		if got, err := os.Readlink(filepath.Join(mp, p)); err != nil || got != want {
			t.Errorf("%s -> %q, %v; saved -> %q", p, got, err, want)
		}
	}
	if r := h.unmount(mp, "--no-save"); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// FuzzS3Names saves a tree holding a fuzzed file name to versitygw, twice
// (the second save copies the unchanged object server-side), and restores
// it: the name and its bytes come back exactly. A name no revision can
// hold (not UTF-8) fails the save with UNSUPPORTED_ENTRY, publishing
// nothing.
func FuzzS3Names(f *testing.F) {
	for _, n := range entryNames() {
		f.Add(n)
	}
	f.Add("bad\xff")
	srv := startS3(f, false)
	for _, kv := range s3Env() {
		k, v, _ := strings.Cut(kv, "=")
		f.Setenv(k, v)
	}
	ctx := context.Background()
	var seq atomic.Int64
	f.Fuzz(func(t *testing.T, name string) {
		if name == "" || name == "." || name == ".." || len(name) > 255 || strings.ContainsAny(name, "/\x00") {
			return // not a file name
		}
		if name == "d" || name == "other" {
			return // the tree's own entries
		}
		st, err := mount.OpenStore(ctx, "s3://"+s3Bucket+"/fuzz", mount.S3Options{Endpoint: srv.endpoint, PathStyle: true}, fmt.Sprint("n", seq.Add(1)))
		if err != nil {
			t.Fatal(err)
		}
		ws, err := revision.Open(ctx, st, revision.Options{NoLock: true})
		if err != nil {
			t.Fatal(err)
		}
		src := t.TempDir()
		must(t, os.Mkdir(filepath.Join(src, "d"), 0o755))
		for _, p := range []string{name, "d/" + name} {
			must(t, os.WriteFile(filepath.Join(src, p), []byte(p), 0o644))
		}
		must(t, os.WriteFile(filepath.Join(src, "other"), []byte("1"), 0o644))
		_, err = ws.Save(ctx, src, format.Selection{NoGitignore: true}, "")
		if !utf8.ValidString(name) {
			if !amlerr.Has(err, amlerr.UnsupportedEntry) || ws.Index() != nil {
				t.Fatalf("save of %q: %v, index %v", name, err, ws.Index())
			}
			return
		}
		if err != nil {
			t.Fatalf("save of %q: %v", name, err)
		}
		must(t, os.WriteFile(filepath.Join(src, "other"), []byte("2"), 0o644))
		res, err := ws.Save(ctx, src, format.Selection{NoGitignore: true}, "")
		if err != nil {
			t.Fatalf("incremental save of %q: %v", name, err)
		}
		if res.Reused < 2 {
			t.Errorf("incremental save of %q reused %d objects", name, res.Reused)
		}
		dst := filepath.Join(t.TempDir(), "r")
		if _, err := ws.Restore(ctx, "current", dst, format.Selection{NoGitignore: true}); err != nil {
			t.Fatalf("restore of %q: %v", name, err)
		}
		for _, p := range []string{name, "d/" + name} {
			if got, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(got) != p {
				t.Errorf("%q after restore: %q, %v", p, got, err)
			}
		}
	})
}
