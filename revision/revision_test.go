package revision

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store/dirstore"

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
		w.prunes.Wait() // pruning runs after the save returns
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
		w := openWS(t, base, "bad", Options{Format: format.FormatFolder})
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

// lazyTree saves files (path -> content) as the first revision of a
// workspace id opened with opts (LazyRestore set) and restores it lazily
// into a new directory: the workspace and the directory.
func lazyTree(t *testing.T, base testBase, id string, files map[string]string, opts Options) (*Workspace, string) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	writeTree(t, src, files)
	opts.LazyRestore = true
	w := openWS(t, base, id, opts)
	if _, err := w.Save(ctx, src, format.Selection{}, ""); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "w")
	if _, err := w.Restore(ctx, "current", dst, format.Selection{}); err != nil {
		t.Fatal(err)
	}
	return w, dst
}
