package cache

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// diskUsage is the bytes the files in dir take on disk (holes excluded).
func diskUsage(t *testing.T, c *Cache) int64 {
	t.Helper()
	var total int64
	// The files are unlinked: measure them through the open descriptors.
	c.mu.Lock()
	files := map[*File]bool{}
	for _, k := range c.lru.Keys() {
		files[k.f] = true
	}
	c.mu.Unlock()
	for f := range files {
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		total += st.Blocks * 512
	}
	return total
}

func chunkData(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestEvictionKeepsTheBound(t *testing.T) {
	const limit = 8 * ChunkSize
	c, err := New(filepath.Join(t.TempDir(), "c"), limit)
	if err != nil {
		t.Fatal(err)
	}
	// Three files of 6 chunks: 18 chunks through an 8-chunk cache.
	var files []*File
	for fi := range 3 {
		f, err := c.NewFile(6*ChunkSize - 100)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		for i := int64(0); i < 6; i++ {
			n := int(f.chunkLen(i))
			if err := f.Fill(i, chunkData(uint64(fi*10)+uint64(i), n)); err != nil {
				t.Fatal(err)
			}
			if st := c.Stats(); st.Clean+st.Pinned > limit {
				t.Fatalf("cache holds %d bytes, over its %d limit", st.Clean+st.Pinned, limit)
			}
			if du := diskUsage(t, c); du > limit+64<<10 {
				t.Fatalf("cache files take %d bytes on disk, over the %d limit", du, limit)
			}
		}
	}
	// The newest file is whole; the oldest lost its chunks, and reads of
	// them say so rather than return zeros.
	last := files[2]
	buf := make([]byte, 3*ChunkSize)
	n, ok, err := last.ReadAt(buf, 2*ChunkSize+7)
	if err != nil || !ok || n != len(buf) {
		t.Fatalf("read of cached chunks: n=%d ok=%v err=%v", n, ok, err)
	}
	var want []byte
	for i := range 4 {
		want = append(want, chunkData(uint64(22+i), int(last.chunkLen(int64(2+i))))...)
	}
	if !bytes.Equal(buf, want[7:7+len(buf)]) {
		t.Fatal("cached bytes differ from what was filled")
	}
	if _, ok, _ := files[0].ReadAt(buf[:10], 0); ok {
		t.Fatal("an evicted chunk reads as present")
	}
	if len(files[0].Missing(0, 6*ChunkSize)) != 6 {
		t.Fatalf("missing chunks of the oldest file: %v", files[0].Missing(0, 6*ChunkSize))
	}
}

func TestDirtyFilesAreNeverEvicted(t *testing.T) {
	const limit = 4 * ChunkSize
	c, err := New(filepath.Join(t.TempDir(), "c"), limit)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.NewDirty()
	if err != nil {
		t.Fatal(err)
	}
	data := chunkData(7, 6*ChunkSize)
	if _, err := d.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	// Clean data comes and goes around it.
	for i := range 10 {
		f, _ := c.NewFile(ChunkSize)
		if err := f.Fill(0, chunkData(uint64(100+i), ChunkSize)); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, len(data))
	if n, ok, err := d.ReadAt(got, 0); err != nil || !ok || n != len(data) || !bytes.Equal(got, data) {
		t.Fatalf("dirty file lost bytes: n=%d ok=%v err=%v", n, ok, err)
	}
	if st := c.Stats(); st.Pinned != int64(len(data)) || st.Clean != 0 {
		t.Fatalf("stats %+v: want every clean chunk evicted while dirty bytes exceed the limit", st)
	}
	// Uploaded: it becomes clean and the bound applies again.
	d.Unpin()
	if st := c.Stats(); st.Clean+st.Pinned > limit {
		t.Fatalf("after unpin: %+v over %d", st, limit)
	}
	if err := d.Truncate(10); err == nil {
		t.Fatal("truncate of a clean file succeeded")
	}
}

func TestPinNeedsEveryChunk(t *testing.T) {
	c, err := New(filepath.Join(t.TempDir(), "c"), 16*ChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := c.NewFile(2*ChunkSize + 1)
	f.Fill(0, chunkData(1, ChunkSize))
	if err := f.Pin(); err == nil {
		t.Fatal("pin of a partly cached file succeeded")
	}
	f.Fill(1, chunkData(2, ChunkSize))
	f.Fill(2, []byte{9})
	if err := f.Pin(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("xy"), 2*ChunkSize+1); err != nil {
		t.Fatal(err)
	}
	if f.Size() != 2*ChunkSize+3 {
		t.Fatalf("size %d after an append", f.Size())
	}
	f.Drop()
	if _, _, err := f.ReadAt(make([]byte, 1), 0); err != ErrDropped {
		t.Fatalf("read after drop: %v", err)
	}
	if st := c.Stats(); st.Clean != 0 || st.Pinned != 0 {
		t.Fatalf("stats after drop: %+v", st)
	}
}

func TestNewEmptiesTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c")
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "left-over"), []byte("x"), 0o600)
	if _, err := New(dir, ChunkSize); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("%d entries left", len(ents))
	}
	if _, err := New(dir, 10); err == nil {
		t.Fatal("a cache below one chunk was accepted")
	}
}

func TestHeldFilesAreNotEvicted(t *testing.T) {
	c, err := New(filepath.Join(t.TempDir(), "c"), 2*ChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := c.NewFile(2 * ChunkSize)
	if f.Hold() {
		t.Fatal("held a file with missing chunks")
	}
	f.Fill(0, chunkData(1, ChunkSize))
	f.Fill(1, chunkData(2, ChunkSize))
	if !f.Hold() {
		t.Fatal("could not hold a whole file")
	}
	// Other data pushes past the bound: f stays whole while held.
	g, _ := c.NewFile(ChunkSize)
	g.Fill(0, chunkData(3, ChunkSize))
	if !f.Complete() {
		t.Fatal("a held file lost chunks")
	}
	// Dirty and uploaded while held: still not evictable.
	if err := f.Pin(); err != nil {
		t.Fatal(err)
	}
	f.Unpin()
	h, _ := c.NewFile(ChunkSize)
	h.Fill(0, chunkData(4, ChunkSize))
	if !f.Complete() {
		t.Fatal("a held file lost chunks after an upload")
	}
	f.Unhold()
	if st := c.Stats(); st.Clean+st.Pinned > 2*ChunkSize {
		t.Fatalf("after unhold %+v is over the bound", st)
	}
}
