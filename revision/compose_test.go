package revision

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
)

// opCounter counts a memory store's operations by kind.
type opCounter struct {
	mu  sync.Mutex
	ops map[string]int
}

func (c *opCounter) hook(op, key string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[op]++
	return nil
}

func (c *opCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.ops
	c.ops = map[string]int{}
	return out
}

// randomTree writes n incompressible files of size bytes under dirs d0..d3.
func randomTree(t *testing.T, dir string, n, size int, seed uint64) map[string]string {
	rng := rand.New(rand.NewPCG(seed, 1))
	files := map[string]string{}
	for i := range n {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		files[fmt.Sprintf("d%d/f%03d", i%4, i)] = string(b)
	}
	writeTree(t, dir, files)
	return files
}

func sameTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(got) != want {
			t.Fatalf("%s in %s: %d bytes, %v; want %d", p, dir, len(got), err, len(want))
		}
	}
}

// TestArchiveComposes: a save after a one-file change composes the next
// archive from the previous one's members: server-side copies of the
// unchanged runs and a short last part, no rewrite of the tree. The
// result restores whole and lazily, and a composition whose base another
// writer pruned is written whole instead.
func TestArchiveComposes(t *testing.T) {
	ctx := context.Background()
	base, src := newBase(t, "mem"), t.TempDir()
	files := randomTree(t, src, 480, 40<<10, 1) // 19 MiB, incompressible
	ops := &opCounter{ops: map[string]int{}}
	base.mem.Fail(ops.hook)
	w := openWS(t, base, "comp", Options{Format: format.FormatArchive, Retention: 5})
	first, err := w.Save(ctx, src, format.Selection{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if first.Uploaded != 480 || first.Reused != 0 {
		t.Errorf("first save: uploaded %d, reused %d", first.Uploaded, first.Reused)
	}
	ops.take()
	files["d2/f242"] = "changed" // about 12 MiB in
	os.WriteFile(filepath.Join(src, "d2/f242"), []byte("changed"), 0o644)
	res, err := w.Save(ctx, src, format.Selection{}, "")
	if err != nil {
		t.Fatal(err)
	}
	got := ops.take()
	if res.Uploaded != 1 || res.Reused != 479 {
		t.Errorf("one-file save: uploaded %d, reused %d", res.Uploaded, res.Reused)
	}
	// Two copied runs around the changed file's member, the new part (the
	// new members, directories and index), one read of that member (its
	// unchanged neighbours), and the index's read and publication.
	if got["copy-part"] != 2 || got["put-part"] != 1 || got["read"] != 2 || got["publish"] != 1 {
		t.Errorf("one-file save made %v", got)
	}
	arch := base.read(t, "comp", res.Entry.Path)
	if n := int64(len(arch)); n < 18<<20 {
		t.Errorf("the composed archive is %d bytes", n)
	}
	// Whole, with a fresh workspace, and lazily.
	for _, lazy := range []bool{false, true} {
		dst := filepath.Join(t.TempDir(), "w")
		r := openWS(t, base, "comp", Options{NoLock: true, LazyRestore: lazy})
		if _, err := r.Restore(ctx, "current", dst, format.Selection{}); err != nil {
			t.Fatal(err)
		}
		if lazy {
			if err := r.populateAll(ctx); err != nil {
				t.Fatal(err)
			}
			if n, _ := r.pending(); n != 480 {
				t.Errorf("lazy restore: %d pending", n)
			}
			ops.take()
			if err := r.ensure(ctx, "d2/f002"); err != nil {
				t.Fatal(err)
			}
			if got := ops.take(); got["read"] != 1 {
				t.Errorf("one file fetched with %v", got)
			}
			r.prefetch(ctx, 4)
		}
		sameTree(t, dst, files)
	}
	// Another writer prunes the base behind this one's back: the next
	// save cannot copy from it, and writes the archive whole.
	seg, _ := format.Seg("comp")
	base.mem.Set(seg+"/"+res.Entry.Path, nil)
	files["d0/f000"] = "again"
	os.WriteFile(filepath.Join(src, "d0/f000"), []byte("again"), 0o644)
	res, err = w.Save(ctx, src, format.Selection{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if res.Uploaded != 480 {
		t.Errorf("save over a pruned base: uploaded %d", res.Uploaded)
	}
	dst := filepath.Join(t.TempDir(), "w")
	if _, err := openWS(t, base, "comp", Options{NoLock: true}).Restore(ctx, "current", dst, format.Selection{}); err != nil {
		t.Fatal(err)
	}
	sameTree(t, dst, files)
}

// TestArchiveMemberLies: a lazily restored file whose member's bytes were
// tampered with in the store fails its fetch; it never reads wrong bytes.
func TestArchiveMemberLies(t *testing.T) {
	ctx := context.Background()
	base, src := newBase(t, "mem"), t.TempDir()
	writeTree(t, src, map[string]string{"a.txt": "alpha alpha alpha", "b.txt": "beta beta beta"})
	w := openWS(t, base, "lies", Options{Format: format.FormatArchive})
	res, err := w.Save(ctx, src, format.Selection{}, "")
	if err != nil {
		t.Fatal(err)
	}
	seg, _ := format.Seg("lies")
	arch := base.read(t, "lies", res.Entry.Path)
	// The first member holds the files: corrupt its compressed bytes.
	bad := bytes.Clone(arch)
	bad[20] ^= 0xff
	base.mem.Set(seg+"/"+res.Entry.Path, bad)
	dst := filepath.Join(t.TempDir(), "w")
	r := openWS(t, base, "lies", Options{NoLock: true, LazyRestore: true})
	if _, err := r.Restore(ctx, "current", dst, format.Selection{}); err != nil {
		t.Fatal(err)
	}
	r.ensureDir(ctx, "")
	for _, p := range []string{"a.txt", "b.txt"} {
		err := r.ensure(ctx, p)
		got, _ := os.ReadFile(filepath.Join(dst, p))
		if err == nil && bytes.Contains(got, []byte("alpha")) == (p == "a.txt") && len(bytes.Trim(got, "\x00")) > 0 {
			continue // this file's bytes were not in the damaged range
		}
		if err == nil {
			t.Errorf("%s: read %q from a damaged member", p, got)
		} else if c := amlerr.Code(err); c != amlerr.InvalidStore && c != "" {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// TestArchiveSymlinks: an archive keeps symlinks in its index (AML's
// reader refuses them in the tar), and restores them.
func TestArchiveSymlinks(t *testing.T) {
	forStores(t, func(t *testing.T, sk string) {
		ctx := context.Background()
		base, src := newBase(t, sk), t.TempDir()
		writeTree(t, src, map[string]string{"d/a.txt": "a"})
		os.Symlink("d/a.txt", filepath.Join(src, "link"))
		w := openWS(t, base, "links", Options{Format: format.FormatArchive})
		res, err := w.Save(ctx, src, format.Selection{}, "")
		if err != nil {
			t.Fatal(err)
		}
		if res.Symlinks != 1 {
			t.Errorf("saved %d symlinks", res.Symlinks)
		}
		for _, lazy := range []bool{false, true} {
			dst := filepath.Join(t.TempDir(), "w")
			if _, err := openWS(t, base, "links", Options{NoLock: true, LazyRestore: lazy}).Restore(ctx, "current", dst, format.Selection{}); err != nil {
				t.Fatal(err)
			}
			if target, err := os.Readlink(filepath.Join(dst, "link")); err != nil || target != "d/a.txt" {
				t.Errorf("lazy %v: link -> %q, %v", lazy, target, err)
			}
		}
	})
}

// TestArchiveForkCopies: the first revision of a fork of an archive
// workspace is the source's archive copied on the store's side, in one
// part, plus one uploaded part (directories and index): no file is read
// or uploaded.
func TestArchiveForkCopies(t *testing.T) {
	ctx := context.Background()
	base, src := newBase(t, "mem"), t.TempDir()
	files := randomTree(t, src, 300, 40<<10, 3)
	a := openWS(t, base, "source", Options{Format: format.FormatArchive})
	first, err := a.Save(ctx, src, format.Selection{}, "")
	if err != nil {
		t.Fatal(err)
	}
	ops := &opCounter{ops: map[string]int{}}
	base.mem.Fail(ops.hook)
	res, err := a.SaveFork(ctx, src, format.Selection{}, "forked", "", first.Entry.ID)
	if err != nil {
		t.Fatal(err)
	}
	got := ops.take()
	if res.Uploaded != 0 || res.Reused != 300 || got["copy-part"] != 1 || got["put-part"] != 1 {
		t.Errorf("fork's first save: uploaded %d, reused %d, %v", res.Uploaded, res.Reused, got)
	}
	dst := filepath.Join(t.TempDir(), "w")
	f := openWS(t, base, "forked", Options{NoLock: true})
	if _, err := f.Restore(ctx, "current", dst, format.Selection{}); err != nil {
		t.Fatal(err)
	}
	sameTree(t, dst, files)
	if o := forkOf(t, f, res.Entry); o == nil || o.ID != "source" || o.Revision != first.Entry.ID {
		t.Errorf("fork record %+v", o)
	}
}

// TestFolderManifestBoundEarly: a folder revision whose manifest.json
// would be over AML's 4 MiB fails before anything is uploaded, naming
// the archive format and --max-entries; the same tree saves as an
// archive, which has no manifest.
func TestFolderManifestBoundEarly(t *testing.T) {
	ctx := context.Background()
	base, src := newBase(t, "mem"), t.TempDir()
	long := strings.Repeat("n", 240)
	for d := range 2 {
		dir := filepath.Join(src, fmt.Sprintf("d%d", d), long)
		os.MkdirAll(dir, 0o755)
		for i := range 5000 { // 10,000 entries of about 500 bytes of JSON
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s%05d", long, i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	ops := &opCounter{ops: map[string]int{}}
	base.mem.Fail(ops.hook)
	w := openWS(t, base, "big", Options{Format: format.FormatFolder})
	_, err := w.Save(ctx, src, format.Selection{}, "")
	if err == nil || !strings.Contains(err.Error(), string(amlerr.LimitExceeded)) || !strings.Contains(err.Error(), "--format archive") || !strings.Contains(err.Error(), "--max-entries") {
		t.Fatalf("folder save over the manifest bound: %v", err)
	}
	if got := ops.take(); got["put"] != 0 {
		t.Errorf("%d objects uploaded before the bound was checked", got["put"])
	}
	a := openWS(t, base, "big-archive", Options{Format: format.FormatArchive})
	if _, err := a.Save(ctx, src, format.Selection{}, ""); err != nil {
		t.Fatalf("the same tree as an archive: %v", err)
	}
}

// TestFormatChoice: with no format given, a new workspace saves archives;
// a workspace keeps the format of its current revision; a tree too large
// for an archive is saved as a folder, and stays one; a format given is
// kept, and its bound reported.
func TestFormatChoice(t *testing.T) {
	ctx := context.Background()
	base, src := newBase(t, "mem"), t.TempDir()
	writeTree(t, src, map[string]string{"a": "a"})
	save := func(id string, opts Options) (format.Entry, error) {
		w := openWS(t, base, id, opts)
		defer w.Close(ctx)
		res, err := w.Save(ctx, src, format.Selection{}, "")
		return res.Entry, err
	}
	if e, err := save("new", Options{}); err != nil || e.Format != format.FormatArchive {
		t.Fatalf("a new workspace saved %q, %v", e.Format, err)
	}
	if e, err := save("old", Options{Format: format.FormatFolder}); err != nil || e.Format != format.FormatFolder {
		t.Fatalf("--format folder saved %q, %v", e.Format, err)
	}
	if e, err := save("old", Options{}); err != nil || e.Format != format.FormatFolder {
		t.Fatalf("a folder workspace then saved %q, %v", e.Format, err)
	}
	// 64 KiB that do not compress, under a 32 KiB archive bound.
	writeTree(t, src, map[string]string{"noise": string(randomBytes(64 << 10))})
	lim := format.Limits{ArchiveBytes: 32 << 10}
	if e, err := save("new", Options{Limits: lim}); err != nil || e.Format != format.FormatFolder {
		t.Fatalf("a tree too large for an archive saved %q, %v", e.Format, err)
	}
	if e, err := save("new", Options{Limits: lim}); err != nil || e.Format != format.FormatFolder {
		t.Fatalf("then saved %q, %v", e.Format, err)
	}
	if _, err := save("strict", Options{Limits: lim, Format: format.FormatArchive}); err == nil || !strings.Contains(err.Error(), "--max-archive-bytes") {
		t.Fatalf("--format archive over the bound: %v", err)
	}
}

func randomBytes(n int) []byte {
	rng := rand.New(rand.NewPCG(uint64(n), 9))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}
