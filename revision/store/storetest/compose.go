package storetest

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/amlfs/amlfs/revision/store"
)

// testReadRange: ranged reads, a suffix with the object's size, and a
// range cut at the end.
func testReadRange(t *testing.T, b Base) {
	s := open(t, b, "w")
	st, _ := s.Stage(ctx, "revisions/a.tar.gz")
	put(t, st, "", "0123456789")
	flushCommit(t, st, "revisions/a.tar.gz")
	for _, tc := range []struct {
		off, n int64
		want   string
	}{{0, 10, "0123456789"}, {3, 4, "3456"}, {-1, 3, "789"}, {-1, 50, "0123456789"}, {8, 10, "89"}} {
		r, size, err := s.ReadRange(ctx, "revisions/a.tar.gz", tc.off, tc.n)
		if err != nil {
			t.Fatalf("ReadRange(%d, %d): %v", tc.off, tc.n, err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(got) != tc.want || size != 10 {
			t.Errorf("ReadRange(%d, %d) = %q, size %d, %v; want %q, 10", tc.off, tc.n, got, size, err, tc.want)
		}
	}
	if _, _, err := s.ReadRange(ctx, "revisions/b.tar.gz", 0, 1); !errors.Is(err, store.ErrNotExist) {
		t.Errorf("ReadRange of a missing object: %v", err)
	}
	if _, _, err := s.ReadRange(ctx, "revisions/../../x", 0, 1); err == nil {
		t.Error("ReadRange of a key leaving the root")
	}
}

// testCompose: an archive made of ranges of existing objects (this
// workspace's and another's, large enough to be copied by the server,
// and small ones) and new bytes holds exactly those bytes; a vanished
// source is ErrNotExist and lands nothing; a composed artifact is still
// written once.
func testCompose(t *testing.T, b Base) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return p
	}
	src, other := random(13<<20), random(6<<20)
	s, o := open(t, b, "w"), open(t, b, "src")
	for _, x := range []struct {
		s    store.Store
		data []byte
	}{{s, src}, {o, other}} {
		st, _ := x.s.Stage(ctx, "revisions/base.tar.gz")
		if err := st.Put(ctx, "", bytes.NewReader(x.data), int64(len(x.data))); err != nil {
			t.Fatal(err)
		}
		flushCommit(t, st, "revisions/base.tar.gz")
	}
	lit := random(3 << 20)
	litAt := func(off, n int64) store.Piece { return store.Piece{Data: bytes.NewReader(lit), Off: off, N: n} }
	of := func(key string, off, n int64) store.Piece { return store.Piece{Key: key, Off: off, N: n} }
	foreign := "../" + foreignSeg(t, o) + "/revisions/base.tar.gz"
	pieces := []store.Piece{
		of("revisions/base.tar.gz", 0, 6<<20), // a copied part
		litAt(0, 100),                         // new bytes, then a range that fills their part up
		of("revisions/base.tar.gz", 7<<20, 6<<20),
		of("revisions/base.tar.gz", 100, 1000), // a small range: read and uploaded
		litAt(100, 3<<20-100),
		of(foreign, 0, 6<<20), // another workspace's
		litAt(0, 7),           // a short last part
	}
	var want []byte
	for _, p := range pieces {
		switch {
		case p.Key == "":
			want = append(want, lit[p.Off:p.Off+p.N]...)
		case p.Key == foreign:
			want = append(want, other[p.Off:p.Off+p.N]...)
		default:
			want = append(want, src[p.Off:p.Off+p.N]...)
		}
	}
	st, err := s.Stage(ctx, "revisions/c.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Compose(ctx, pieces); err != nil {
		t.Fatalf("Compose: %v", err)
	}
	flushCommit(t, st, "revisions/c.tar.gz")
	got, err := read(t, s, "revisions/c.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("composed %d bytes, want %d (equal: %v)", len(got), len(want), bytes.Equal(got, want))
	}
	// Written once.
	st, _ = s.Stage(ctx, "revisions/c.tar.gz")
	if err := st.Compose(ctx, []store.Piece{litAt(0, 10)}); err == nil {
		err = st.Commit(ctx)
		if !errors.Is(err, store.ErrExist) {
			t.Errorf("a second composition at the same key: %v", err)
		}
	} else if !errors.Is(err, store.ErrExist) {
		t.Errorf("a second composition at the same key: %v", err)
	}
	mustRead(t, s, "revisions/c.tar.gz", string(want))
	// A pruned source.
	if err := s.Remove(ctx, "revisions/base.tar.gz"); err != nil {
		t.Fatal(err)
	}
	st, _ = s.Stage(ctx, "revisions/d.tar.gz")
	err = st.Compose(ctx, []store.Piece{of("revisions/base.tar.gz", 0, 6<<20), litAt(0, 10)})
	if err == nil {
		err = st.Commit(ctx)
	}
	if !errors.Is(err, store.ErrNotExist) {
		t.Errorf("composing from a removed object: %v, want ErrNotExist", err)
	}
	st.Abort(ctx)
	mustNotExist(t, s, "revisions/d.tar.gz")
	// A range past a source's end is an error, never short bytes.
	st, _ = s.Stage(ctx, "revisions/e.tar.gz")
	err = st.Compose(ctx, []store.Piece{of("revisions/c.tar.gz", int64(len(want))-10, 6<<20)})
	if err == nil {
		err = st.Commit(ctx)
	}
	if err == nil {
		t.Error("composing a range past the source's end")
	}
	st.Abort(ctx)
	mustNotExist(t, s, "revisions/e.tar.gz")
}

// foreignSeg is o's segment, as its foreign keys name it.
func foreignSeg(t *testing.T, o store.Family) string {
	seg, _, ok := store.SplitForeign(o.Foreign("revisions/x"))
	if !ok {
		t.Fatal("no foreign key")
	}
	return seg
}
