package revision

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store/dirstore"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
)

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(dir, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func openWS(t *testing.T, base testBase, id string, opts Options) *Workspace {
	t.Helper()
	st := base.store(t, id)
	opts.ID = id
	w, err := Open(context.Background(), st, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(context.Background()) })
	return w
}

func TestSaveRestoreRoundTrip(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		for _, kind := range []string{format.FormatFolder, format.FormatArchive} {
			t.Run(kind, func(t *testing.T) {
				ctx := context.Background()
				base, src := newBase(t, sk), t.TempDir()
				writeTree(t, src, map[string]string{
					"a/b/c.txt":     "hello",
					"empty/":        "",
					"run.sh":        "#!/bin/sh\n",
					"build/out.o":   "junk",
					".gitignore":    "build/\n*.log\n",
					"x.log":         "log",
					"keep/.gitkeep": "",
				})
				os.Chmod(filepath.Join(src, "run.sh"), 0o755)
				w := openWS(t, base, "ws 1", Options{Format: kind, Retention: 2})
				res, err := w.Save(ctx, src, format.Selection{}, "")
				if err != nil {
					t.Fatal(err)
				}
				// The index follows AML's rules.
				data := base.read(t, "ws 1", "workspace.json")
				idx, err := format.ParseIndex(data)
				if err != nil {
					t.Fatal(err)
				}
				if idx.Current != res.Entry.ID || len(idx.Revisions) != 1 || idx.Revisions[0].Format != kind {
					t.Fatalf("index %s", data)
				}
				if !strings.HasPrefix(string(data), `{"current":"`) || !strings.HasSuffix(string(data), `],"version":1}`) {
					t.Errorf("index not in AML's layout: %s", data)
				}
				w.Close(ctx)

				w2 := openWS(t, base, "ws 1", Options{Format: kind})
				dst := filepath.Join(t.TempDir(), "work")
				if _, err := w2.Restore(ctx, "current", dst, format.Selection{}); err != nil {
					t.Fatal(err)
				}
				for p, want := range map[string]string{"a/b/c.txt": "hello", "run.sh": "#!/bin/sh\n", ".gitignore": "build/\n*.log\n", "keep/.gitkeep": ""} {
					got, err := os.ReadFile(filepath.Join(dst, p))
					if err != nil || string(got) != want {
						t.Errorf("%s = %q, %v", p, got, err)
					}
				}
				if fi, err := os.Stat(filepath.Join(dst, "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
					t.Errorf("run.sh mode: %v %v", fi, err)
				}
				if fi, err := os.Stat(filepath.Join(dst, "empty")); err != nil || !fi.IsDir() {
					t.Errorf("empty dir not restored: %v", err)
				}
				for _, gone := range []string{"build", "x.log"} {
					if _, err := os.Stat(filepath.Join(dst, gone)); !os.IsNotExist(err) {
						t.Errorf("%s should be ignored, got %v", gone, err)
					}
				}
			})
		}
	})
}

func TestManifestOrderAndFormat(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, map[string]string{"b.txt": "b", "a/z.txt": "zz", "a/b/c": "c", "A": "A"})
	os.Symlink("../b.txt", filepath.Join(src, "a", "l"))
	es, _, err := Snapshot(src, format.Selection{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range es {
		if es[i].Mtime == 0 {
			t.Errorf("%s: no mtime", es[i].Path)
		}
		es[i].Mtime = 0
		if es[i].Type != format.TypeDir && (es[i].Stat.Ino == 0 || es[i].Stat.Ctime == 0) {
			t.Errorf("%s: no inode number or ctime: %+v", es[i].Path, es[i].Stat)
		}
		es[i].Stat = format.EntryStat{}
	}
	es[0].Mtime = format.MtimeOf(time.Date(2026, 12, 4, 21, 0, 0, 123456789, time.UTC))
	es[0].Stat = format.EntryStat{Ctime: es[0].Mtime + 1, Ino: 1234, Uid: 1000, Gid: 1001}
	data, _ := format.NewManifest(es).Marshal(format.DefaultLimits)
	// AML's keys, in AML's order, with mtime among them where AML's
	// parser ignores it, and symlinks in the top-level extension.
	want := `{"entries":[{"amlfs":"1796418000.123456790 1234 1000 1001","mode":420,"mtime":"1796418000.123456789","path":"A","size":1,"type":"file"},{"mode":493,"path":"a","size":0,"type":"directory"},{"mode":420,"path":"b.txt","size":1,"type":"file"},{"mode":493,"path":"a/b","size":0,"type":"directory"},{"mode":420,"path":"a/z.txt","size":2,"type":"file"},{"mode":420,"path":"a/b/c","size":1,"type":"file"}],"amlfs":{"symlinks":[{"mode":511,"path":"a/l","size":0,"target":"../b.txt","type":"symlink"}]},"version":1}`
	if string(data) != want {
		t.Errorf("manifest\n got %s\nwant %s", data, want)
	}
	m, err := format.ParseManifest("m", data, format.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Tree(); !reflect.DeepEqual(got, es) {
		t.Errorf("parsed back\n got %+v\nwant %+v", got, es)
	}
}

func TestSelection(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, map[string]string{
		".gitignore": "*.log\nnode_modules/\n", "src/a.go": "", "src/debug.log": "", "node_modules/x/y.js": "",
		"docs/readme.md": "", "secret.env": "", "sub/.gitignore": "local.txt\n", "sub/local.txt": "", "sub/keep.txt": "",
	})
	cases := []struct {
		name string
		sel  format.Selection
		want []string
	}{
		{"gitignore", format.Selection{}, []string{".gitignore", "docs", "secret.env", "src", "sub", "docs/readme.md", "src/a.go", "sub/.gitignore", "sub/keep.txt"}},
		{"no-gitignore", format.Selection{NoGitignore: true, Exclude: []string{"node_modules"}}, []string{".gitignore", "docs", "secret.env", "src", "sub", "docs/readme.md", "src/a.go", "src/debug.log", "sub/.gitignore", "sub/keep.txt", "sub/local.txt"}},
		{"include overrides gitignore", format.Selection{Include: []string{"src/**"}}, []string{"src", "src/a.go", "src/debug.log"}},
		{"exclude wins over include", format.Selection{Include: []string{"src/**"}, Exclude: []string{"**/*.log"}}, []string{"src", "src/a.go"}},
		{"exclude", format.Selection{Exclude: []string{"*.env", "docs"}}, []string{".gitignore", "src", "sub", "src/a.go", "sub/.gitignore", "sub/keep.txt"}},
		{"hidden", format.Selection{Hidden: []string{"src"}}, []string{".gitignore", "docs", "secret.env", "sub", "docs/readme.md", "sub/.gitignore", "sub/keep.txt"}},
		{"include into ignored dir", format.Selection{Include: []string{"node_modules/x/*.js"}}, []string{"node_modules", "node_modules/x", "node_modules/x/y.js"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			es, _, err := Snapshot(src, tc.sel)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range es {
				got = append(got, e.Path)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestSnapshotEntries(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a.txt": "a", "d/x": "x"})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("a.txt", filepath.Join(src, "link")))
	must(os.Symlink("/nowhere/at all", filepath.Join(src, "d", "dangling")))
	must(syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644))
	must(syscall.Mkfifo(filepath.Join(src, "d", "fifo2"), 0o644))
	es, skipped, err := Snapshot(src, format.Selection{})
	must(err)
	targets := map[string]string{}
	for _, e := range es {
		if e.Type == format.TypeSymlink {
			targets[e.Path] = e.Target
		}
	}
	if !reflect.DeepEqual(targets, map[string]string{"link": "a.txt", "d/dangling": "/nowhere/at all"}) {
		t.Errorf("symlinks %v", targets)
	}
	if !reflect.DeepEqual(skipped, []string{"fifo", "d/fifo2"}) && !reflect.DeepEqual(skipped, []string{"d/fifo2", "fifo"}) {
		t.Errorf("skipped %v", skipped)
	}
	if err := SpecialFilesError(skipped); amlerr.Code(err) != amlerr.UnsupportedEntry || !strings.Contains(err.Error(), `"fifo"`) || !strings.Contains(err.Error(), `"d/fifo2"`) {
		t.Errorf("strict error %v", err)
	}
	// A name no revision can hold fails the snapshot, naming every one.
	must(os.WriteFile(filepath.Join(src, "bad\xff"), nil, 0o644))
	must(os.WriteFile(filepath.Join(src, "d", "bad\xfe"), nil, 0o644))
	_, _, err = Snapshot(src, format.Selection{})
	if amlerr.Code(err) != amlerr.UnsupportedEntry || !strings.Contains(err.Error(), `bad\xff`) || !strings.Contains(err.Error(), `bad\xfe`) {
		t.Fatalf("got %v", err)
	}
	// Excluded, they are fine.
	if _, _, err := Snapshot(src, format.Selection{Exclude: []string{"bad*", "d/bad*"}}); err != nil {
		t.Fatal(err)
	}
}

func TestRetentionAndPrune(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		w := openWS(t, base, "r", Options{Retention: 3})
		var ids []string
		for i := 0; i < 5; i++ {
			writeTree(t, src, map[string]string{"n.txt": strings.Repeat("x", i)})
			res, err := w.Save(ctx, src, format.Selection{}, "")
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, res.Entry.ID)
		}
		idx := w.Index()
		if len(idx.Revisions) != 3 || idx.Revisions[0].ID != ids[4] || idx.Revisions[2].ID != ids[2] {
			t.Fatalf("index %+v", idx)
		}
		if ents := base.revisions(t, "r"); len(ents) != 3 {
			t.Errorf("the store holds %d artifacts, want 3: %v", len(ents), ents)
		}
	})
}

func TestStaleWriterFails(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"a": "1"})
		a := openWS(t, base, "s", Options{NoLock: true})
		b := openWS(t, base, "s", Options{NoLock: true})
		ra, err := a.Save(ctx, src, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.Save(ctx, src, format.Selection{}, "")
		if amlerr.ExitStatus(err) != amlerr.ExitConflict || !amlerr.Has(err, amlerr.PublishConflict) {
			t.Fatalf("stale save: %v", err)
		}
		c := openWS(t, base, "s", Options{NoLock: true})
		if c.Index().Current != ra.Entry.ID {
			t.Errorf("current changed to %s", c.Index().Current)
		}
		if ents := base.revisions(t, "s"); len(ents) != 1 {
			t.Errorf("orphan upload left behind: %v", ents)
		}
	})
}

func TestLockConflictAndTakeover(t *testing.T) {
	ctx := context.Background()
	base := newBase(t, "dir")
	openWS(t, base, "l", Options{})
	st, _ := dirstore.New(base.dir, "l")
	_, err := Open(ctx, st, Options{ID: "l"})
	if amlerr.ExitStatus(err) != amlerr.ExitConflict || !strings.Contains(err.Error(), "AML_WORKSPACE_CONFLICT") || !strings.Contains(err.Error(), `"l"`) {
		t.Fatalf("second lock: %v", err)
	}
	// A lock untouched for 21 minutes is stale and taken over; the first
	// holder then finds its lease lost.
	old := time.Now().Add(-21 * time.Minute)
	os.Chtimes(filepath.Join(base.dir, "l.lock"), old, old)
	w2, err := Open(ctx, st, Options{ID: "l"})
	if err != nil {
		t.Fatalf("takeover: %v", err)
	}
	// A fresh lease is taken over only when its holder, by name, is
	// reported dead; the new holding has a new name.
	var asked []string
	_, err = Open(ctx, st, Options{ID: "l", DeadHolder: func(h string) bool { asked = append(asked, h); return h == "someone else" }})
	if amlerr.ExitStatus(err) != amlerr.ExitConflict || len(asked) != 1 || asked[0] != w2.Lease().Holder {
		t.Fatalf("live holder %q: asked %q, err %v", w2.Lease().Holder, asked, err)
	}
	w3, err := Open(ctx, st, Options{ID: "l", DeadHolder: func(h string) bool { return h == w2.Lease().Holder }})
	if err != nil {
		t.Fatalf("takeover from a dead holder: %v", err)
	}
	defer w3.Close(ctx)
	if w3.Lease().Holder == w2.Lease().Holder || w3.Lease().Holder == "" {
		t.Errorf("holder names: %q then %q", w2.Lease().Holder, w3.Lease().Holder)
	}
	if err := w2.CheckLease(); !amlerr.Has(err, amlerr.LockLost) {
		t.Errorf("the dead holder's lease: %v", err)
	}
}

func TestLostLeaseFailsSave(t *testing.T) {
	ctx := context.Background()
	base, src := newBase(t, "dir"), t.TempDir()
	writeTree(t, src, map[string]string{"a": "1"})
	w := openWS(t, base, "lost", Options{})
	lp := filepath.Join(base.dir, "lost.lock")
	os.Remove(lp)
	os.Mkdir(lp, 0o755) // another writer's lock
	_, err := w.Save(ctx, src, format.Selection{}, "")
	if !amlerr.Has(err, amlerr.LockLost) || amlerr.ExitStatus(err) != amlerr.ExitSave {
		t.Fatalf("save with lost lease: %v", err)
	}
	if st := w.Lease(); st.State != "lost" || st.Holder == "" {
		t.Errorf("lease status after the loss: %+v", st)
	}
	if err := w.CheckLease(); !amlerr.Has(err, amlerr.LockLost) {
		t.Errorf("check of a lost lease: %v", err)
	}
	if err := w.Close(ctx); !amlerr.Has(err, amlerr.LockLost) {
		t.Fatalf("release of lost lease: %v", err)
	}
	if _, err := os.Stat(lp); err != nil {
		t.Errorf("the other writer's lock was removed: %v", err)
	}
}

func TestBadStores(t *testing.T) {
	ctx := context.Background()
	good := func(t *testing.T, base testBase) string {
		src := t.TempDir()
		writeTree(t, src, map[string]string{"a/b.txt": "abc"})
		w := openWS(t, base, "bad", Options{})
		res, err := w.Save(ctx, src, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		w.Close(ctx)
		return res.Entry.ID
	}
	cases := []struct {
		name  string
		spoil func(t *testing.T, root, rev string)
	}{
		{"malformed index", func(t *testing.T, root, rev string) {
			os.WriteFile(filepath.Join(root, "workspace.json"), []byte(`{"current":`), 0o644)
		}},
		{"missing revision", func(t *testing.T, root, rev string) {
			os.RemoveAll(filepath.Join(root, "revisions", rev))
		}},
		{"traversal in manifest", func(t *testing.T, root, rev string) {
			os.WriteFile(filepath.Join(root, "revisions", rev, "manifest.json"), []byte(`{"entries":[{"mode":420,"path":"../x","size":3,"type":"file"}],"version":1}`), 0o644)
		}},
		{"size mismatch", func(t *testing.T, root, rev string) {
			os.WriteFile(filepath.Join(root, "revisions", rev, "files", "a", "b.txt"), []byte("abcd"), 0o644)
		}},
		{"current not listed", func(t *testing.T, root, rev string) {
			os.WriteFile(filepath.Join(root, "workspace.json"), []byte(`{"current":"nope","revisions":[],"version":1}`), 0o644)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := newBase(t, "dir")
			rev := good(t, base)
			root := filepath.Join(base.dir, "bad")
			tc.spoil(t, root, rev)
			before := snapshotDir(t, base.dir)
			st, _ := dirstore.New(base.dir, "bad")
			w, err := Open(ctx, st, Options{ID: "bad"})
			if err == nil {
				_, err = w.Restore(ctx, "current", filepath.Join(t.TempDir(), "w"), format.Selection{})
				w.Close(ctx)
			}
			if err == nil {
				t.Fatal("bad store accepted")
			}
			t.Log(err)
			if after := snapshotDir(t, base.dir); after != before {
				t.Errorf("store changed:\n%s\n%s", before, after)
			}
		})
	}
}

func snapshotDir(t *testing.T, dir string) string {
	var b strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !strings.HasSuffix(p, ".lock") {
			data := ""
			if fi.Mode().IsRegular() {
				d, _ := os.ReadFile(p)
				data = string(d)
			}
			b.WriteString(p + " " + data + "\n")
		}
		return nil
	})
	return b.String()
}

func tarGz(t testing.TB, hdrs []*tar.Header, body func(*tar.Header) []byte) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if b := body(h); b != nil {
			tw.Write(b)
		}
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// An archive written by another tar (GNU tar here; AML uses node-tar, also
// rooted at ".") restores, and one amlfs writes lists cleanly with tar(1).
func TestArchiveInteropWithTar(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar")
	}
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a/b.txt": "bee", "top.txt": "top", "empty/": ""})
	arch := filepath.Join(t.TempDir(), "x.tar.gz")
	if out, err := exec.Command("tar", "-czf", arch, "-C", src, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	f, err := os.Open(arch)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dst := t.TempDir()
	entries, err := readArchive(f, dst, "x", format.DefaultLimits, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 4 {
		t.Errorf("entries %+v", entries)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a", "b.txt")); string(b) != "bee" {
		t.Errorf("a/b.txt = %q", b)
	}
	// And the other way: tar(1) reads what amlfs writes.
	es, _, _ := Snapshot(src, format.Selection{})
	var buf bytes.Buffer
	if _, _, err := writeArchive(&buf, src, es, format.DefaultLimits); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("tar", "-tzf", "-")
	cmd.Stdin = &buf
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(out); got != "./\n./a/\n./empty/\n./top.txt\n./a/b.txt\n" {
		t.Errorf("tar -t:\n%s", got)
	}
}

func TestIncrementalSaveReusesUnchangedFiles(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		files := map[string]string{}
		for i := 0; i < 50; i++ {
			files[fmt.Sprintf("d%d/f%d.txt", i%5, i)] = strings.Repeat("x", i+1)
		}
		writeTree(t, src, files)
		w := openWS(t, base, "inc", Options{Retention: 2})
		first, err := w.Save(ctx, src, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if first.Uploaded != 50 || first.Reused != 0 {
			t.Fatalf("first save: %+v", first)
		}
		// One content change, one chmod, one same-size rewrite with the old
		// mtime put back: all three must upload; the rest is reused.
		os.WriteFile(filepath.Join(src, "d0/f0.txt"), []byte("changed"), 0o644)
		os.Chmod(filepath.Join(src, "d1/f1.txt"), 0o600)
		p := filepath.Join(src, "d2/f2.txt")
		fi, _ := os.Stat(p)
		os.WriteFile(p, []byte("ZZZ"), 0o644)
		os.Chtimes(p, fi.ModTime(), fi.ModTime())
		second, err := w.Save(ctx, src, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if second.Uploaded != 3 || second.Reused != 47 || second.UploadedBytes != int64(len("changed")+2+3) {
			t.Fatalf("second save: uploaded %d (%d bytes), reused %d", second.Uploaded, second.UploadedBytes, second.Reused)
		}
		// Both revisions restore exactly.
		for _, tc := range []struct {
			rev  string
			want map[string]string
		}{
			{first.Entry.ID, files},
			{second.Entry.ID, func() map[string]string {
				m := map[string]string{}
				for k, v := range files {
					m[k] = v
				}
				m["d0/f0.txt"] = "changed"
				m["d2/f2.txt"] = "ZZZ"
				return m
			}()},
		} {
			dst := filepath.Join(t.TempDir(), "w")
			if _, err := w.Restore(ctx, tc.rev, dst, format.Selection{}); err != nil {
				t.Fatal(err)
			}
			for path, want := range tc.want {
				if got, _ := os.ReadFile(filepath.Join(dst, path)); string(got) != want {
					t.Errorf("%s %s = %q, want %q", tc.rev, path, got, want)
				}
			}
		}
		// After a restore, an untouched tree reuses everything.
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		third, err := w.Save(ctx, dst, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if third.Uploaded != 0 || third.Reused != 50 {
			t.Errorf("save of a fresh restore: %+v", third)
		}
	})
}

func TestLazyRestore(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"a/one.txt": "one", "a/two.txt": "second file", "b/three.bin": strings.Repeat("3", 5000), "empty/": ""})
		os.Chmod(filepath.Join(src, "a/two.txt"), 0o640)
		w := openWS(t, base, "lazy", Options{LazyRestore: true, Retention: 5})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		// The directories are there at once; their files are made on first
		// use of each directory.
		if des, err := os.ReadDir(filepath.Join(dst, "a")); err != nil || len(des) != 0 {
			t.Fatalf("a/ before first use: %v %v", des, err)
		}
		for _, d := range []string{"a", "b", "empty", "a"} {
			if err := w.ensureDir(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
		// Then the files, sizes and modes are there; the bytes are not.
		if n, b := w.pending(); n != 3 || b != 3+11+5000 {
			t.Fatalf("pending %d files, %d bytes", n, b)
		}
		fi, err := os.Stat(filepath.Join(dst, "a/two.txt"))
		if err != nil || fi.Size() != 11 || fi.Mode().Perm() != 0o640 {
			t.Fatalf("placeholder stat: %v %v", fi, err)
		}
		if raw, _ := os.ReadFile(filepath.Join(dst, "a/two.txt")); string(raw) == "second file" {
			t.Fatal("bytes fetched eagerly")
		}
		// Ensure fetches, exactly once, and keeps the inode.
		var before, after syscall.Stat_t
		syscall.Stat(filepath.Join(dst, "a/two.txt"), &before)
		if err := w.ensure(ctx, "a/two.txt"); err != nil {
			t.Fatal(err)
		}
		syscall.Stat(filepath.Join(dst, "a/two.txt"), &after)
		if got, _ := os.ReadFile(filepath.Join(dst, "a/two.txt")); string(got) != "second file" || before.Ino != after.Ino {
			t.Fatalf("after Ensure: %q, inode %d -> %d", got, before.Ino, after.Ino)
		}
		if n, _ := w.pending(); n != 2 {
			t.Errorf("pending after one fetch: %d", n)
		}
		// A chmod'd placeholder must be saved with its real bytes, not zeros;
		// an untouched one is reused without fetching.
		os.Chmod(filepath.Join(dst, "b/three.bin"), 0o600)
		res, err := w.Save(ctx, dst, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if res.Uploaded != 1 || res.Reused != 2 {
			t.Errorf("save over placeholders: uploaded %d reused %d", res.Uploaded, res.Reused)
		}
		if n, _ := w.pending(); n != 1 {
			t.Errorf("pending after save: %d (a/one.txt should still be lazy)", n)
		}
		// "Crash": a fresh workspace finds the remaining placeholder by xattr.
		w2 := openWS(t, base, "lazy2", Options{NoLock: true})
		if n, err := w2.resumePending(dst, format.Selection{}, false); err != nil || n != 1 {
			t.Fatalf("resume: %d %v", n, err)
		}
		w.prefetch(ctx, 2)
		if n, _ := w.pending(); n != 0 {
			t.Errorf("pending after prefetch: %d", n)
		}
		check := filepath.Join(t.TempDir(), "c")
		w3 := openWS(t, base, "lazy", Options{NoLock: true})
		if _, err := w3.Restore(ctx, "current", check, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]string{"a/one.txt": "one", "a/two.txt": "second file", "b/three.bin": strings.Repeat("3", 5000)} {
			for _, d := range []string{dst, check} {
				if got, _ := os.ReadFile(filepath.Join(d, p)); string(got) != want {
					t.Errorf("%s in %s: %d bytes, want %d", p, d, len(got), len(want))
				}
			}
		}
		buf := make([]byte, 100)
		if _, err := unix.Getxattr(filepath.Join(dst, "a/one.txt"), PendingXattr(), buf); err == nil {
			t.Error("marker left after fetch")
		}
	})
}

func TestProgressReports(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"a": "12345", "b/c": "678"})
		var last Progress
		var mu sync.Mutex
		w := openWS(t, base, "prog", Options{Progress: func(p Progress) { mu.Lock(); last = p; mu.Unlock() }})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !last.Done || last.Phase != "save" || last.Files != 2 || last.TotalFiles != 2 || last.Bytes != 8 || last.TotalBytes != 8 {
			t.Errorf("last report %+v", last)
		}
	})
}

// Pruning never strands a placeholder: a save repoints reused placeholders
// at the new revision, and fetches the rest before pruning.
func TestLazyPlaceholdersSurvivePruning(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"keep.txt": "kept", "skip.log": "excluded later", "x.txt": "x"})
		w := openWS(t, base, "prune", Options{LazyRestore: true, Retention: 1})
		if _, err := w.Save(ctx, src, format.Selection{NoGitignore: true}, ""); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		// Writes reach the working dir through the mount, which populates the
		// directory and fetches the file first.
		if err := w.ensureDir(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if err := w.ensure(ctx, "x.txt"); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dst, "x.txt"), []byte("changed"), 0o644)
		// skip.log is not in this save's selection, so its bytes exist only in
		// the revision being pruned.
		if _, err := w.Save(ctx, dst, format.Selection{Exclude: []string{"*.log"}}, ""); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]string{"keep.txt": "kept", "skip.log": "excluded later", "x.txt": "changed"} {
			if got, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(got) != want {
				// read straight from the working dir: only correct if fetched
				// or still fetchable.
				if err := w.ensure(ctx, p); err != nil {
					t.Fatalf("%s: %v", p, err)
				}
				if got, _ := os.ReadFile(filepath.Join(dst, p)); string(got) != want {
					t.Errorf("%s = %q, want %q", p, got, want)
				}
			}
		}
		if n, _ := w.pending(); n != 0 {
			w.prefetch(ctx, 1)
		}
		if n, _ := w.pending(); n != 0 {
			t.Errorf("%d placeholders could not be fetched after pruning", n)
		}
	})
}

// A directory not yet populated survives a crash and a move of its parent:
// the next run finds it by its marker and makes the placeholders of the
// directory's manifest path at wherever it is now, and a save after that
// holds every file with its bytes.
func TestLazyDirectoriesResumeAfterCrash(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"top.txt": "top", "p/q/deep.txt": "deep bytes", "p/q/r/deeper.txt": "deeper", "p/side.txt": "side"})
		w := openWS(t, base, "lazydir", Options{LazyRestore: true, Retention: 3})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		if err := w.ensureDir(ctx, "p"); err != nil {
			t.Fatal(err)
		}
		// p is whole, so moving p/q is allowed (the mount populates the
		// moved directory itself first; a move of an ancestor does not).
		if err := os.Rename(filepath.Join(dst, "p"), filepath.Join(dst, "moved")); err != nil {
			t.Fatal(err)
		}
		w.Close(ctx)

		// "Crash": a fresh workspace finds what is left to do by its markers.
		w2 := openWS(t, base, "lazydir", Options{NoLock: true})
		if _, err := w2.resumePending(dst, format.Selection{}, false); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{"", "moved", "moved/q", "moved/q/r"} {
			if err := w2.ensureDir(ctx, d); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 200)
			if _, err := unix.Lgetxattr(filepath.Join(dst, d), PendingDirXattr(), buf); err == nil {
				t.Errorf("%q still marked after EnsureDir", d)
			}
		}
		want := map[string]string{"top.txt": "top", "moved/q/deep.txt": "deep bytes", "moved/q/r/deeper.txt": "deeper", "moved/side.txt": "side"}
		for p, content := range want {
			if err := w2.ensure(ctx, p); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if got, _ := os.ReadFile(filepath.Join(dst, p)); string(got) != content {
				t.Errorf("%s = %q, want %q", p, got, content)
			}
		}
		if _, err := w2.Save(ctx, dst, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		check := filepath.Join(t.TempDir(), "c")
		w3 := openWS(t, base, "lazydir", Options{NoLock: true})
		if _, err := w3.Restore(ctx, "current", check, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		for p, content := range want {
			if got, _ := os.ReadFile(filepath.Join(check, p)); string(got) != content {
				t.Errorf("saved %s = %q, want %q", p, got, content)
			}
		}
	})
}

// Population never replaces a file it did not make, and an interrupted
// population is finished without duplicating or clobbering.
func TestLazyPopulationIsIdempotent(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"d/a.txt": "aaa", "d/b.txt": "bbbb"})
		w := openWS(t, base, "idem", Options{LazyRestore: true})
		if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "w")
		if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		if err := w.ensureDir(ctx, "d"); err != nil {
			t.Fatal(err)
		}
		// Put the marker back, as if the run had died before clearing it, and
		// replace b.txt with a file that is not a placeholder.
		var rev string
		for _, e := range w.Index().Revisions {
			rev = e.Path
		}
		if err := unix.Lsetxattr(filepath.Join(dst, "d"), PendingDirXattr(), []byte(rev+"\x00d"), 0); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(dst, "d/b.txt"))
		os.WriteFile(filepath.Join(dst, "d/b.txt"), []byte("mine"), 0o644)
		w2 := openWS(t, base, "idem", Options{NoLock: true})
		if _, err := w2.resumePending(dst, format.Selection{}, false); err != nil {
			t.Fatal(err)
		}
		if err := w2.ensureDir(ctx, "d"); err != nil {
			t.Fatal(err)
		}
		if n, _ := w2.pending(); n != 1 {
			t.Errorf("pending %d, want 1 (a.txt)", n)
		}
		if err := w2.ensure(ctx, "d/a.txt"); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]string{"d/a.txt": "aaa", "d/b.txt": "mine"} {
			if got, _ := os.ReadFile(filepath.Join(dst, p)); string(got) != want {
				t.Errorf("%s = %q, want %q", p, got, want)
			}
		}
	})
}

// TestSaveChangingTree saves, in both formats, while a writer rewrites one
// file in place, appends lines to another, and makes and removes others:
// every save succeeds, and each file it holds is whole (one version of
// the rewritten file, whole lines of the log) with the manifest's size.
func TestSaveChangingTree(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		for _, kind := range []string{format.FormatFolder, format.FormatArchive} {
			t.Run(kind, func(t *testing.T) {
				ctx := context.Background()
				base, src := newBase(t, sk), t.TempDir()
				w := openWS(t, base, "chg", Options{Format: kind, Retention: 2})
				writeTree(t, src, map[string]string{"rewrite": strings.Repeat("v0 ", 50000), "log": "", "churn/keep": "k"})
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					rw, _ := os.OpenFile(filepath.Join(src, "rewrite"), os.O_RDWR, 0)
					lg, _ := os.OpenFile(filepath.Join(src, "log"), os.O_WRONLY|os.O_APPEND, 0)
					defer rw.Close()
					defer lg.Close()
					for i := 1; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						// In place, and of another length: a torn read
						// mixes versions or sizes.
						v := strings.Repeat(fmt.Sprintf("v%d ", i), 400000+i%200000)
						rw.WriteAt([]byte(v), 0)
						rw.Truncate(int64(len(v)))
						// Opened for each rewrite, as most tools do, and of one
						// length, so that every instant outside a write call
						// holds one whole version.
						if f, err := os.OpenFile(filepath.Join(src, "reopened"), os.O_WRONLY|os.O_CREATE, 0o644); err == nil {
							f.WriteAt([]byte(strings.Repeat(fmt.Sprintf("%07d ", i), 200000)), 0)
							f.Close()
						}
						fmt.Fprintf(lg, "line %d\n", i)
						p := filepath.Join(src, "churn", fmt.Sprint("f", i%7))
						if i%2 == 0 {
							os.WriteFile(p, []byte(v[:i%5000]), 0o644)
						} else {
							os.Remove(p)
						}
						time.Sleep(3 * time.Millisecond)
					}
				}()
				for i := 0; i < 8; i++ {
					res, err := w.Save(ctx, src, format.Selection{}, "")
					if err != nil {
						close(stop)
						<-done
						t.Fatalf("save %d of a changing tree: %v", i, err)
					}
					dst := filepath.Join(t.TempDir(), "r")
					if _, err := w.Restore(ctx, res.Entry.ID, dst, format.Selection{}); err != nil {
						t.Fatalf("restore %d: %v", i, err)
					}
					for _, name := range []string{"rewrite", "reopened"} {
						got, _ := os.ReadFile(filepath.Join(dst, name))
						if f := strings.Fields(string(got)); len(f) > 0 && strings.Count(string(got), f[0]+" ") != len(f) {
							t.Errorf("save %d: %s is torn: %d bytes, %d words, first %q", i, name, len(got), len(f), f[0])
						}
					}
					lg, _ := os.ReadFile(filepath.Join(dst, "log"))
					if len(lg) > 0 && lg[len(lg)-1] != '\n' {
						t.Errorf("save %d: the log ends mid-line: %q", i, lg[max(0, len(lg)-20):])
					}
				}
				close(stop)
				<-done
			})
		}
	})
}
