package storetest

import (
	"bytes"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/store"
)

func testFolder(t *testing.T, b Base) {
	s := open(t, b, "w")
	st, err := s.Stage(ctx, "revisions/r1/")
	if err != nil {
		t.Fatal(err)
	}
	var landed []string
	var mu sync.Mutex
	st.OnWritten(func(name string, size int64) { mu.Lock(); landed = append(landed, name); mu.Unlock() })
	files := map[string]string{"manifest.json": "{}", "files/a.txt": "alpha", "files/d/e/f.txt": "deep", "files/empty": "", "files/ünï cøde": "u"}
	for name, data := range files {
		put(t, st, name, data)
	}
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The manifest, which makes a folder a revision, is not readable
	// before Commit. (Its files may be: S3 writes them in place.)
	mustNotExist(t, s, "revisions/r1/manifest.json")
	if err := st.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		mustRead(t, s, "revisions/r1/"+name, data)
	}
	mu.Lock()
	slices.Sort(landed)
	mu.Unlock()
	if len(landed) != len(files) {
		t.Errorf("OnWritten saw %v", landed)
	}
	if got := revisions(t, s); !slices.Equal(got, []string{"revisions/r1/"}) {
		t.Fatalf("artifacts: %v", got)
	}
	mustNotExist(t, s, "revisions/r1/files/missing")
}

func testArchive(t *testing.T, b Base) {
	s := open(t, b, "w")
	st, err := s.Stage(ctx, "revisions/a.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, "x", bytes.NewReader([]byte("no")), 2); err == nil {
		t.Error("a named object in a single-object artifact")
	}
	put(t, st, "", "archive bytes")
	if err := st.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	mustRead(t, s, "revisions/a.tar.gz", "archive bytes")
	if got := revisions(t, s); !slices.Equal(got, []string{"revisions/a.tar.gz"}) {
		t.Fatalf("artifacts: %v", got)
	}
}

// testCommitOnce: an artifact key is written once; a second commit at it
// is ErrExist and leaves the first intact.
func testCommitOnce(t *testing.T, b Base) {
	s := open(t, b, "w")
	stage(t, s, "revisions/r1/", map[string]string{"files/a": "first", "manifest.json": "first manifest"})
	for _, key := range []string{"revisions/r1/", "revisions/a.tar.gz"} {
		if key == "revisions/a.tar.gz" {
			st, _ := s.Stage(ctx, key)
			put(t, st, "", "first")
			if err := st.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		st, err := s.Stage(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		name := "files/a"
		if key == "revisions/a.tar.gz" {
			name = ""
		}
		err = st.Put(ctx, name, bytes.NewReader([]byte("second")), 6)
		if err == nil && name != "" {
			err = st.Put(ctx, "manifest.json", bytes.NewReader([]byte("{}")), 2)
		}
		if err == nil {
			err = st.Flush(ctx)
		}
		if err == nil {
			err = st.Commit(ctx)
		}
		if !errors.Is(err, store.ErrExist) {
			t.Fatalf("second commit at %s: %v", key, err)
		}
		st.Abort(ctx)
		mustRead(t, s, key+name, "first")
		if name != "" {
			mustRead(t, s, key+"manifest.json", "first manifest")
		}
	}
}

func testAbort(t *testing.T, b Base) {
	s := open(t, b, "w")
	before := artifacts(t, s)
	st, err := s.Stage(ctx, "revisions/r1/")
	if err != nil {
		t.Fatal(err)
	}
	put(t, st, "files/a", "a")
	if err := st.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	mustNotExist(t, s, "revisions/r1/files/a")
	if after := artifacts(t, s); !slices.Equal(before, after) {
		t.Fatalf("abort left %v (before %v)", after, before)
	}
	// The key is still free.
	stage(t, s, "revisions/r1/", map[string]string{"files/a": "b"})
	mustRead(t, s, "revisions/r1/files/a", "b")
}

// testShortPut: a reader that ends before the size it was promised fails
// the put, as a file that shrank during a save must.
func testShortPut(t *testing.T, b Base) {
	s := open(t, b, "w")
	st, err := s.Stage(ctx, "revisions/r1/")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Abort(ctx)
	err = st.Put(ctx, "files/short", bytes.NewReader([]byte("abc")), 10)
	if err == nil {
		err = st.Flush(ctx)
	}
	if err == nil {
		t.Fatal("a short put succeeded")
	}
	// Size -1 takes everything.
	if err := st.Put(ctx, "files/all", bytes.NewReader([]byte("everything")), -1); err != nil {
		t.Fatal(err)
	}
}

func testPutFile(t *testing.T, b Base) {
	s := open(t, b, "w")
	st, err := s.Stage(ctx, "revisions/r1/")
	if err != nil {
		t.Fatal(err)
	}
	f := tempFile(t, "file bytes")
	want, err := store.FileStamp(f)
	if err != nil {
		t.Fatal(err)
	}
	var got *store.Stamp
	var mu sync.Mutex
	if err := st.PutFile(ctx, "files/f", f, func(stp store.Stamp, err error) {
		if err != nil {
			t.Errorf("PutFile of a quiet file: %v", err)
		}
		mu.Lock()
		got = &stp
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	put(t, st, "manifest.json", "{}")
	flushCommit(t, st, "revisions/r1/")
	mu.Lock()
	defer mu.Unlock()
	if got == nil || *got != want {
		t.Fatalf("stamp %+v, want %+v", got, want)
	}
	mustRead(t, s, "revisions/r1/files/f", "file bytes")
}

func testReuse(t *testing.T, b Base) {
	s := open(t, b, "w")
	stage(t, s, "revisions/r1/", map[string]string{"files/a": "kept bytes"})
	st, err := s.Stage(ctx, "revisions/r2/")
	if err != nil {
		t.Fatal(err)
	}
	called := false
	if err := st.Reuse(ctx, "files/a", "revisions/r1/files/a", tempFile(t, "kept bytes"), func(stp *store.Stamp, _ error) {
		called = true
		if stp != nil {
			t.Error("a reused object reported bytes written from the tree")
		}
	}); err != nil {
		t.Fatal(err)
	}
	put(t, st, "manifest.json", "{}")
	flushCommit(t, st, "revisions/r2/")
	if !called {
		t.Error("done was not called")
	}
	mustRead(t, s, "revisions/r2/files/a", "kept bytes")
	// The copy outlives its source.
	if err := s.Remove(ctx, "revisions/r1/"); err != nil {
		t.Fatal(err)
	}
	mustRead(t, s, "revisions/r2/files/a", "kept bytes")
}

// testReuseGone: reuse of an object another writer pruned writes the
// tree's bytes instead, or, with no tree file (a placeholder), fails with
// BASE_REVISION_GONE.
func testReuseGone(t *testing.T, b Base) {
	s := open(t, b, "w")
	st, err := s.Stage(ctx, "revisions/r2/")
	if err != nil {
		t.Fatal(err)
	}
	var got *store.Stamp
	var mu sync.Mutex
	if err := st.Reuse(ctx, "files/a", "revisions/r1/files/a", tempFile(t, "from the tree"), func(stp *store.Stamp, _ error) { mu.Lock(); got = stp; mu.Unlock() }); err != nil {
		t.Fatal(err)
	}
	put(t, st, "manifest.json", "{}")
	flushCommit(t, st, "revisions/r2/")
	mu.Lock()
	if got == nil || got.Size != uint64(len("from the tree")) {
		t.Errorf("stamp of the bytes written from the tree: %+v", got)
	}
	mu.Unlock()
	mustRead(t, s, "revisions/r2/files/a", "from the tree")

	st, err = s.Stage(ctx, "revisions/r3/")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Abort(ctx)
	err = st.Reuse(ctx, "files/b", "revisions/r1/files/b", nil, func(*store.Stamp, error) {})
	if err == nil {
		err = st.Flush(ctx)
	}
	if !amlerr.Has(err, amlerr.BaseRevisionGone) {
		t.Fatalf("reuse of a gone object with no tree file: %v", err)
	}
}

func testForeign(t *testing.T, b Base) {
	src := open(t, b, "source")
	stage(t, src, "revisions/r1/", map[string]string{"files/a": "shared"})
	dst := open(t, b, "fork")
	key := src.Foreign("revisions/r1/files/a")
	if !store.IsForeign(key) || src.Foreign(key) != key || dst.Foreign(key) != key {
		t.Fatalf("foreign key %q", key)
	}
	mustRead(t, dst, key, "shared")
	sib, err := dst.Sibling("source")
	if err != nil {
		t.Fatal(err)
	}
	mustRead(t, sib, "revisions/r1/files/a", "shared")
	st, err := dst.Stage(ctx, "revisions/f1/")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Reuse(ctx, "files/a", key, nil, func(*store.Stamp, error) {}); err != nil {
		t.Fatal(err)
	}
	put(t, st, "manifest.json", "{}")
	flushCommit(t, st, "revisions/f1/")
	mustRead(t, dst, "revisions/f1/files/a", "shared")
	// A store never removes another workspace's objects.
	if err := dst.Remove(ctx, key); err == nil {
		t.Fatal("removed another workspace's object")
	}
	mustRead(t, src, "revisions/r1/files/a", "shared")
	// Foreign keys reach revision objects only.
	b.Raw("source", "workspace.json", []byte("secret index"))
	for _, k := range []string{"../source/workspace.json", "../source/../x/revisions/r/", "../../etc/revisions/x", "../source/revisions/../workspace.json"} {
		if data, err := read(t, dst, k); err == nil {
			t.Errorf("read %s through a foreign key: %q", k, data)
		}
	}
}

func testRemove(t *testing.T, b Base) {
	s := open(t, b, "w")
	stage(t, s, "revisions/r1/", map[string]string{"files/a": "a", "files/d/b": "b"})
	stage(t, s, "revisions/r2/", map[string]string{"files/a": "a2"})
	st, _ := s.Stage(ctx, "revisions/x.tar.gz")
	put(t, st, "", "tgz")
	if err := st.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"revisions/r1/", "revisions/x.tar.gz", "revisions/never/"} {
		if err := s.Remove(ctx, k); err != nil {
			t.Fatalf("remove %s: %v", k, err)
		}
	}
	mustNotExist(t, s, "revisions/r1/files/a")
	mustNotExist(t, s, "revisions/r1/files/d/b")
	mustNotExist(t, s, "revisions/x.tar.gz")
	mustRead(t, s, "revisions/r2/files/a", "a2")
	if got := revisions(t, s); !slices.Equal(got, []string{"revisions/r2/"}) {
		t.Fatalf("artifacts: %v", got)
	}
	// A removed key can be written again.
	stage(t, s, "revisions/r1/", map[string]string{"files/a": "again"})
	mustRead(t, s, "revisions/r1/files/a", "again")
}
