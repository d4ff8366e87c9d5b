// Package storetest is the conformance suite every store passes: the
// directory and memory stores in the unit lane, the S3 store against a
// real S3 server in the integration suite. It checks what the engine
// relies on: conditional publication of the index, staged artifacts that
// appear whole or not at all, reuse of objects (also across workspaces by
// foreign keys), removal, the single-writer lease and its takeover,
// hostile keys, and a store that fails.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/store"
)

// A Base is one store base made for one test: an empty place where
// workspaces live side by side.
type Base struct {
	// Open returns the store of workspace id in this base.
	Open func(id string) (store.Family, error)
	// Tune sets a store's lease heartbeat and staleness.
	Tune func(s store.Store, refresh, stale time.Duration)
	// Raw writes the object at key under workspace id's root as another
	// writer (or an attacker with access to the store) would; nil data
	// deletes it.
	Raw func(id, key string, data []byte)
	// Break, if not nil, makes every later operation of the base fail
	// with err, until called again with nil.
	Break func(err error)
	// Root, if not nil, is a directory every object lies beneath, so the
	// suite can check that nothing was written outside it.
	Root string
}

// Run runs the suite; newBase makes a fresh, empty base for each test.
func Run(t *testing.T, newBase func(t *testing.T) Base) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b Base)
	}{
		{"Index", testIndex},
		{"IndexRace", testIndexRace},
		{"FolderArtifact", testFolder},
		{"ArchiveArtifact", testArchive},
		{"CommitOnce", testCommitOnce},
		{"Abort", testAbort},
		{"ShortPut", testShortPut},
		{"PutFile", testPutFile},
		{"Reuse", testReuse},
		{"ReuseGone", testReuseGone},
		{"Foreign", testForeign},
		{"Remove", testRemove},
		{"HostileKeys", testHostileKeys},
		{"HostileIDs", testHostileIDs},
		{"Lease", testLease},
		{"LeaseTakeover", testLeaseTakeover},
		{"LeaseStale", testLeaseStale},
		{"Destroy", testDestroy},
		{"Probe", testProbe},
		{"Faults", testFaults},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newBase(t)) })
	}
}

var ctx = context.Background()

func open(t *testing.T, b Base, id string) store.Family {
	t.Helper()
	s, err := b.Open(id)
	if err != nil {
		t.Fatalf("open %q: %v", id, err)
	}
	return s
}

func read(t *testing.T, s store.Store, key string) ([]byte, error) {
	t.Helper()
	r, err := s.Open(ctx, key)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func mustRead(t *testing.T, s store.Store, key, want string) {
	t.Helper()
	got, err := read(t, s, key)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	if string(got) != want {
		t.Fatalf("read %s = %q, want %q", key, got, want)
	}
}

func mustNotExist(t *testing.T, s store.Store, key string) {
	t.Helper()
	if _, err := read(t, s, key); !errors.Is(err, store.ErrNotExist) {
		t.Fatalf("read %s: %v, want ErrNotExist", key, err)
	}
}

func put(t *testing.T, st store.Stager, name, data string) {
	t.Helper()
	if err := st.Put(ctx, name, bytes.NewReader([]byte(data)), int64(len(data))); err != nil {
		t.Fatalf("put %q: %v", name, err)
	}
}

// stage writes a folder artifact of files and commits it.
func stage(t *testing.T, s store.Store, key string, files map[string]string) {
	t.Helper()
	st, err := s.Stage(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		put(t, st, name, data)
	}
	if _, ok := files["manifest.json"]; !ok {
		put(t, st, "manifest.json", "{}")
	}
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(ctx); err != nil {
		t.Fatalf("commit %s: %v", key, err)
	}
}

func artifacts(t *testing.T, s store.Store) []string {
	t.Helper()
	keys, err := s.Artifacts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

// revisions is the artifacts under revisions/, without staging leftovers.
func revisions(t *testing.T, s store.Store) []string {
	var out []string
	for _, k := range artifacts(t, s) {
		if len(k) > len("revisions/") && k[:len("revisions/")] == "revisions/" {
			out = append(out, k)
		}
	}
	return out
}

func tempFile(t *testing.T, data string) *os.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func testIndex(t *testing.T, b Base) {
	s := open(t, b, "w")
	if _, _, err := s.ReadIndex(ctx); !errors.Is(err, store.ErrNotExist) {
		t.Fatalf("index of a new workspace: %v", err)
	}
	if _, err := s.PublishIndex(ctx, []byte("one"), "bogus"); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("publish over no index with a version: %v", err)
	}
	v1, err := s.PublishIndex(ctx, []byte("one"), "")
	if err != nil {
		t.Fatal(err)
	}
	data, v, err := s.ReadIndex(ctx)
	if err != nil || string(data) != "one" || v != v1 {
		t.Fatalf("read back: %q %q %v (published %q)", data, v, err, v1)
	}
	if _, err := s.PublishIndex(ctx, []byte("two"), ""); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("create over an existing index: %v", err)
	}
	v2, err := s.PublishIndex(ctx, []byte("two"), v1)
	if err != nil {
		t.Fatal(err)
	}
	if v2 == v1 {
		t.Fatal("a new index kept its version")
	}
	if _, err := s.PublishIndex(ctx, []byte("three"), v1); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("publish on a stale version: %v", err)
	}
	// Another writer replaces the index behind our back: our version is
	// stale.
	b.Raw("w", "workspace.json", []byte("foreign"))
	if _, err := s.PublishIndex(ctx, []byte("four"), v2); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("publish over a foreign write: %v", err)
	}
	data, _, err = s.ReadIndex(ctx)
	if err != nil || string(data) != "foreign" {
		t.Fatalf("index: %q %v", data, err)
	}
	// Each workspace has its own index.
	if _, _, err := open(t, b, "other").ReadIndex(ctx); !errors.Is(err, store.ErrNotExist) {
		t.Fatalf("a sibling sees this index: %v", err)
	}
}

// testIndexRace publishes from many writers on one version: exactly one
// wins.
func testIndexRace(t *testing.T, b Base) {
	s := open(t, b, "w")
	v0, err := s.PublishIndex(ctx, []byte("base"), "")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins []string
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := open(t, b, "w")
			body := fmt.Sprintf("writer %d", i)
			if _, err := o.PublishIndex(ctx, []byte(body), v0); err == nil {
				mu.Lock()
				wins = append(wins, body)
				mu.Unlock()
			} else if !errors.Is(err, store.ErrPrecondition) {
				t.Errorf("writer %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if len(wins) != 1 {
		t.Fatalf("%d writers won the same version: %v", len(wins), wins)
	}
	data, _, _ := s.ReadIndex(ctx)
	if string(data) != wins[0] {
		t.Fatalf("index %q, winner %q", data, wins[0])
	}
}

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
	if err := st.PutFile(ctx, "files/f", f, func(stp store.Stamp) { mu.Lock(); got = &stp; mu.Unlock() }); err != nil {
		t.Fatal(err)
	}
	put(t, st, "manifest.json", "{}")
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(ctx); err != nil {
		t.Fatal(err)
	}
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
	if err := st.Reuse(ctx, "files/a", "revisions/r1/files/a", tempFile(t, "kept bytes"), func(stp *store.Stamp) {
		called = true
		if stp != nil {
			t.Error("a reused object reported bytes written from the tree")
		}
	}); err != nil {
		t.Fatal(err)
	}
	put(t, st, "manifest.json", "{}")
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(ctx); err != nil {
		t.Fatal(err)
	}
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
	if err := st.Reuse(ctx, "files/a", "revisions/r1/files/a", tempFile(t, "from the tree"), func(stp *store.Stamp) { mu.Lock(); got = stp; mu.Unlock() }); err != nil {
		t.Fatal(err)
	}
	put(t, st, "manifest.json", "{}")
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(ctx); err != nil {
		t.Fatal(err)
	}
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
	err = st.Reuse(ctx, "files/b", "revisions/r1/files/b", nil, func(*store.Stamp) {})
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
	if err := st.Reuse(ctx, "files/a", key, nil, func(*store.Stamp) {}); err != nil {
		t.Fatal(err)
	}
	put(t, st, "manifest.json", "{}")
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(ctx); err != nil {
		t.Fatal(err)
	}
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

// testHostileKeys: names that leave the artifact are refused, and nothing
// lands outside the store.
func testHostileKeys(t *testing.T, b Base) {
	s := open(t, b, "w")
	st, err := s.Stage(ctx, "revisions/r1/")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Abort(ctx)
	for _, name := range []string{"../escape", "files/../../escape", "/abs", "files/a\x00b", "", "files//a", "./files/a", "files/./a"} {
		if err := st.Put(ctx, name, bytes.NewReader([]byte("x")), 1); err == nil {
			t.Errorf("put %q accepted", name)
		}
	}
	for _, key := range []string{"../../escape", "revisions/../../escape", "/etc/passwd", "revisions/r1/../../../x"} {
		if data, err := read(t, s, key); err == nil {
			t.Errorf("read %q: %q", key, data)
		}
	}
	if b.Root != "" {
		for _, p := range []string{"escape", "../escape", "abs"} {
			if _, err := os.Lstat(filepath.Join(b.Root, p)); err == nil {
				t.Errorf("%s was written", p)
			}
		}
	}
}

// testHostileIDs: any id maps to one segment of its own: no id reaches
// another's root or the base's parent.
func testHostileIDs(t *testing.T, b Base) {
	ids := []string{"a", "a/b", "a b", ".", "..", "..x", "é", "a%2Fb", "A", "a\x00"}
	for i, id := range ids {
		s := open(t, b, id)
		if _, err := s.PublishIndex(ctx, []byte(fmt.Sprint(i)), ""); err != nil {
			t.Fatalf("%q: %v", id, err)
		}
	}
	for i, id := range ids {
		data, _, err := open(t, b, id).ReadIndex(ctx)
		if err != nil || string(data) != fmt.Sprint(i) {
			t.Errorf("%q reads %q, %v", id, data, err)
		}
	}
	for _, id := range []string{"", " a", "a\n", "\xff"} {
		if _, err := b.Open(id); err == nil {
			t.Errorf("id %q accepted", id)
		}
	}
}

func testLease(t *testing.T, b Base) {
	s := open(t, b, "w")
	l, err := s.Lock(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Holder() == "" {
		t.Error("a lease with no holder name")
	}
	if _, err := open(t, b, "w").Lock(ctx, nil, nil); !amlerr.Has(err, amlerr.WorkspaceConflict) {
		t.Fatalf("second lock: %v", err)
	}
	// Another workspace's lease is its own.
	o, err := open(t, b, "other").Lock(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Release(ctx)
	if err := l.Lost(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := open(t, b, "w").Lock(ctx, nil, nil)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	if l2.Holder() == l.Holder() {
		t.Error("a later holding has the same name")
	}
	l2.Release(ctx)
}

// testLeaseTakeover: a fresh lease whose holder is reported dead is taken
// over; the old holder finds out, at its heartbeat or at release.
func testLeaseTakeover(t *testing.T, b Base) {
	s := open(t, b, "w")
	b.Tune(s, 50*time.Millisecond, time.Hour)
	lost := make(chan error, 1)
	l1, err := s.Lock(ctx, func(err error) { lost <- err }, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2 := open(t, b, "w")
	b.Tune(s2, time.Hour, time.Hour)
	if _, err := s2.Lock(ctx, nil, func(string) bool { return false }); !amlerr.Has(err, amlerr.WorkspaceConflict) {
		t.Fatalf("lock of a live holder: %v", err)
	}
	var asked string
	l2, err := s2.Lock(ctx, nil, func(h string) bool { asked = h; return true })
	if err != nil {
		t.Fatalf("takeover from a dead holder: %v", err)
	}
	defer l2.Release(ctx)
	if asked != l1.Holder() {
		t.Errorf("dead was asked about %q, the holder is %q", asked, l1.Holder())
	}
	select {
	case err := <-lost:
		if !amlerr.Has(err, amlerr.LockLost) {
			t.Errorf("lost with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the heartbeat did not notice the takeover")
	}
	if err := l1.Release(ctx); !amlerr.Has(err, amlerr.LockLost) {
		t.Errorf("release of a lost lease: %v", err)
	}
	if err := l2.Lost(); err != nil {
		t.Errorf("the new holder lost its lease to the old one's release: %v", err)
	}
}

// testLeaseStale: a lease not refreshed within the stale time is taken
// over without asking anyone.
func testLeaseStale(t *testing.T, b Base) {
	s := open(t, b, "w")
	b.Tune(s, time.Hour, time.Hour) // no heartbeat within the test
	l1, err := s.Lock(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Release(ctx)
	s2 := open(t, b, "w")
	b.Tune(s2, time.Hour, time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		l2, err := s2.Lock(ctx, nil, nil)
		if err == nil {
			l2.Release(ctx)
			break
		}
		if !amlerr.Has(err, amlerr.WorkspaceConflict) || time.Now().After(deadline) {
			t.Fatalf("stale lease not taken over: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := l1.Lost(); !amlerr.Has(err, amlerr.LockLost) {
		t.Errorf("the stale holder still believes it holds the lease: %v", err)
	}
	if l1.LostErr() == nil {
		t.Error("a loss Lost found is not remembered (LostErr)")
	}
}

func testDestroy(t *testing.T, b Base) {
	s := open(t, b, "w")
	o := open(t, b, "wx")
	for _, x := range []store.Store{s, o} {
		if _, err := x.PublishIndex(ctx, []byte("i"), ""); err != nil {
			t.Fatal(err)
		}
		stage(t, x, "revisions/r1/", map[string]string{"files/a": "a"})
	}
	if err := s.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ReadIndex(ctx); !errors.Is(err, store.ErrNotExist) {
		t.Fatalf("index after destroy: %v", err)
	}
	mustNotExist(t, s, "revisions/r1/files/a")
	if got := revisions(t, s); len(got) != 0 {
		t.Fatalf("artifacts after destroy: %v", got)
	}
	// A sibling whose id shares a prefix keeps everything.
	mustRead(t, o, "revisions/r1/files/a", "a")
	if _, _, err := o.ReadIndex(ctx); err != nil {
		t.Fatal(err)
	}
}

func testProbe(t *testing.T, b Base) {
	if p := open(t, b, "w").Probe(ctx); !p.Safe() {
		t.Fatalf("probe: %+v", p)
	}
}

// testFaults: a store that fails never reports success, and publishes
// nothing half-made.
func testFaults(t *testing.T, b Base) {
	if b.Break == nil {
		t.Skip("this store cannot be broken on demand")
	}
	s := open(t, b, "w")
	v, err := s.PublishIndex(ctx, []byte("good"), "")
	if err != nil {
		t.Fatal(err)
	}
	broken := errors.New("injected fault")
	b.Break(broken)
	if _, err := s.PublishIndex(ctx, []byte("bad"), v); err == nil {
		t.Error("publish on a broken store succeeded")
	}
	if _, _, err := s.ReadIndex(ctx); err == nil {
		t.Error("read on a broken store succeeded")
	}
	if _, err := s.Lock(ctx, nil, nil); err == nil {
		t.Error("lock on a broken store succeeded")
	}
	st, err := s.Stage(ctx, "revisions/r1/")
	if err == nil {
		err = st.Put(ctx, "files/a", bytes.NewReader([]byte("a")), 1)
		if err == nil {
			err = st.Flush(ctx)
		}
		if err == nil {
			err = st.Commit(ctx)
		}
		st.Abort(ctx)
	}
	if err == nil {
		t.Error("a save on a broken store succeeded")
	}
	b.Break(nil)
	data, v2, err := s.ReadIndex(ctx)
	if err != nil || string(data) != "good" || v2 != v {
		t.Fatalf("index after the fault: %q %v", data, err)
	}
	mustNotExist(t, s, "revisions/r1/files/a")
}
