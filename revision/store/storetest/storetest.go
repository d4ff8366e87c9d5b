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
		{"ReadRange", testReadRange},
		{"Compose", testCompose},
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
	flushCommit(t, st, key)
}

// flushCommit waits for everything st wrote, then commits the artifact
// at key, failing the test on any error.
func flushCommit(t *testing.T, st store.Stager, key string) {
	t.Helper()
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
