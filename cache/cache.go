// Package cache is the local data cache of the S3 live mounts: one sparse
// file per cached object under a directory, kept in fixed-size chunks.
//
// The cache is bounded in bytes. Clean chunks (bytes that equal the
// object) sit in an LRU list (golang-lru/v2); when the cache is over its
// size the least recently used chunks are evicted by punching holes in
// their files, so the directory's disk usage follows the bound. Dirty files
// (written locally and not yet uploaded) are pinned: none of their chunks is
// in the LRU list, so they are never evicted, though their bytes count
// toward the size. Memory is a bitmap and an LRU entry per chunk, bounded
// by the cache size over ChunkSize, however large the files are.
package cache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/sys/unix"
)

// ChunkSize is the unit of presence and eviction.
const ChunkSize = 1 << 20

// Cache is a bounded set of cached files in one directory.
type Cache struct {
	dir   string
	limit int64

	mu     sync.Mutex
	lru    *simplelru.LRU[chunk, struct{}] // GUARDED_BY(mu): clean chunks
	clean  int64                           // GUARDED_BY(mu): bytes of clean chunks
	pinned int64                           // GUARDED_BY(mu): bytes of dirty or held files
}

type chunk struct {
	f   *File
	idx int64
}

// New empties dir (a cache does not outlive its process) and returns a
// cache bounded to limit bytes.
func New(dir string, limit int64) (*Cache, error) {
	if limit < ChunkSize {
		return nil, fmt.Errorf("cache size %d is below the %d-byte minimum", limit, ChunkSize)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	l, err := simplelru.NewLRU[chunk, struct{}](int(limit/ChunkSize)+1, nil)
	if err != nil {
		return nil, err
	}
	return &Cache{dir: dir, limit: limit, lru: l}, nil
}

// Stats are the cache's byte counts.
type Stats struct {
	Limit int64 `json:"limit"`
	Clean int64 `json:"clean"`
	// Pinned are the bytes of files that may not be evicted: dirty, or
	// held open for the kernel to read directly.
	Pinned int64 `json:"pinned"`
}

// Stats returns the current byte counts.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Limit: c.limit, Clean: c.clean, Pinned: c.pinned}
}

// File is one cached object: a sparse file and the chunks present in it.
type File struct {
	c *Cache
	f *os.File

	mu      sync.RWMutex
	size    int64    // GUARDED_BY(mu)
	present []uint64 // GUARDED_BY(mu): bitmap of chunks holding real bytes
	dirty   bool     // GUARDED_BY(mu): pinned, every chunk present
	holds   int      // GUARDED_BY(mu): Hold calls not undone; pinned while > 0
	dropped bool     // GUARDED_BY(mu)
}

// ErrDropped is returned by a file that was dropped.
var ErrDropped = errors.New("cache file dropped")

// NewFile returns an empty cached file for an object of size bytes, with
// no chunk present.
func (c *Cache) NewFile(size int64) (*File, error) {
	// A file without a name (O_TMPFILE): it lives while it is open, and
	// making it costs no directory update.
	fd, err := unix.Open(c.dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	var f *os.File
	if err == nil {
		f = os.NewFile(uintptr(fd), filepath.Join(c.dir, "tmpfile"))
	} else {
		if f, err = os.CreateTemp(c.dir, "obj-"); err != nil {
			return nil, err
		}
		os.Remove(f.Name())
	}
	if size > 0 {
		if err := f.Truncate(size); err != nil {
			f.Close()
			return nil, err
		}
	}
	return &File{c: c, f: f, size: size}, nil
}

// NewDirty returns an empty dirty file (a new object).
func (c *Cache) NewDirty() (*File, error) {
	f, err := c.NewFile(0)
	if err != nil {
		return nil, err
	}
	f.dirty = true
	return f, nil
}

// pinnedLocked reports whether none of f's chunks is in the LRU list.
func (f *File) pinnedLocked() bool { return f.dirty || f.holds > 0 }

func chunks(size int64) int64 { return (size + ChunkSize - 1) / ChunkSize }

func (f *File) has(i int64) bool {
	w := int(i / 64)
	return w < len(f.present) && f.present[w]&(1<<(i%64)) != 0
}

func (f *File) set(i int64, on bool) {
	w := int(i / 64)
	for w >= len(f.present) {
		f.present = append(f.present, 0)
	}
	if on {
		f.present[w] |= 1 << (i % 64)
	} else {
		f.present[w] &^= 1 << (i % 64)
	}
}

func (f *File) chunkLen(i int64) int64 {
	return min(int64(ChunkSize), f.size-i*ChunkSize)
}

// Size is the file's current size.
func (f *File) Size() int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.size
}

// Missing returns the chunks in [off, end) that are not present, as a
// list of chunk indexes.
func (f *File) Missing(off, end int64) []int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	end = min(end, f.size)
	var out []int64
	for i := off / ChunkSize; i*ChunkSize < end; i++ {
		if !f.has(i) {
			out = append(out, i)
		}
	}
	return out
}

// ReadAt reads from the cached bytes. ok is false if a chunk in range is
// not present; nothing is read then. Reads past the end are short.
func (f *File) ReadAt(p []byte, off int64) (n int, ok bool, err error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.dropped {
		return 0, false, ErrDropped
	}
	end := min(off+int64(len(p)), f.size)
	if off >= end {
		return 0, true, nil
	}
	for i := off / ChunkSize; i*ChunkSize < end; i++ {
		if !f.has(i) {
			return 0, false, nil
		}
	}
	n, err = f.f.ReadAt(p[:end-off], off)
	if !f.pinnedLocked() {
		f.c.touch(f, off/ChunkSize, (end-1)/ChunkSize)
	}
	return n, true, err
}

// Fill stores chunk i's bytes, fetched from the object, unless it is
// present already. data must be the whole chunk (short only at the end).
func (f *File) Fill(i int64, data []byte) error {
	f.mu.Lock()
	if f.dropped || f.has(i) || i*ChunkSize >= f.size {
		f.mu.Unlock()
		return nil
	}
	if int64(len(data)) != f.chunkLen(i) {
		f.mu.Unlock()
		return fmt.Errorf("chunk %d: got %d bytes, want %d", i, len(data), f.chunkLen(i))
	}
	if _, err := f.f.WriteAt(data, i*ChunkSize); err != nil {
		f.mu.Unlock()
		return err
	}
	f.set(i, true)
	pinned := f.pinnedLocked()
	f.mu.Unlock()
	if pinned {
		// Filled while pinned (a write made it dirty first): it counts
		// with the file's pinned bytes already.
		return nil
	}
	f.c.add(f, i, int64(len(data)))
	return nil
}

// Complete reports whether every chunk is present.
func (f *File) Complete() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.completeLocked()
}

func (f *File) completeLocked() bool {
	for i := int64(0); i < chunks(f.size); i++ {
		if !f.has(i) {
			return false
		}
	}
	return true
}

// Pin makes the file dirty: its chunks leave the LRU list and are never
// evicted until Unpin. Every chunk must be present (a write needs the whole
// object to upload it).
func (f *File) Pin() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dropped {
		return ErrDropped
	}
	if f.dirty {
		return nil
	}
	if !f.completeLocked() {
		return errors.New("pin: the file is not wholly cached")
	}
	if !f.pinnedLocked() {
		f.c.pin(f, chunks(f.size), f.size)
	}
	f.dirty = true
	return nil
}

// Unpin makes a dirty file clean again (uploaded): its chunks join the LRU
// list and may be evicted, once nothing holds it.
func (f *File) Unpin() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dropped || !f.dirty {
		return
	}
	f.dirty = false
	if !f.pinnedLocked() {
		f.c.unpin(f, chunks(f.size), f.size)
	}
}

// Hold keeps a wholly cached file from eviction while the kernel reads or
// writes it directly (passthrough). It reports false, holding nothing, if
// a chunk is missing.
func (f *File) Hold() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dropped || !f.completeLocked() {
		return false
	}
	if !f.pinnedLocked() {
		f.c.pin(f, chunks(f.size), f.size)
	}
	f.holds++
	return true
}

// Unhold undoes one Hold.
func (f *File) Unhold() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holds == 0 {
		return
	}
	f.holds--
	if !f.dropped && !f.pinnedLocked() {
		f.c.unpin(f, chunks(f.size), f.size)
	}
}

// Fd is the descriptor of the file, for the kernel to use directly
// (passthrough) while the file is held.
func (f *File) Fd() int { return int(f.f.Fd()) }

// Stat returns a pinned file's size and mtime as the disk has them: the
// kernel may have written it directly. The cache's accounting follows.
func (f *File) Stat() (int64, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dropped {
		return 0, time.Time{}, ErrDropped
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.f.Fd()), &st); err != nil {
		return 0, time.Time{}, err
	}
	if f.pinnedLocked() && st.Size != f.size {
		f.resize(st.Size)
	}
	return f.size, time.Unix(st.Mtim.Unix()), nil
}

// SetMTime sets the file's mtime on disk (see Stat).
func (f *File) SetMTime(t time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", f.f.Fd()), ts, 0)
}

// WriteAt writes to a dirty file, growing it as needed.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.dirty {
		return 0, errors.New("write to a clean cache file")
	}
	n, err := f.f.WriteAt(p, off)
	if end := off + int64(n); end > f.size {
		f.resize(end)
	}
	return n, err
}

// Truncate resizes a dirty file.
func (f *File) Truncate(size int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.dirty {
		return errors.New("truncate of a clean cache file")
	}
	if err := f.f.Truncate(size); err != nil {
		return err
	}
	f.resize(size)
	return nil
}

// resize sets the size of a dirty file: every chunk is present (the bytes
// past the old end are zeros, as in the object to be written).
func (f *File) resize(size int64) {
	f.c.mu.Lock()
	f.c.pinned += size - f.size
	f.c.mu.Unlock()
	f.size = size
	for i := int64(0); i < chunks(size); i++ {
		f.set(i, true)
	}
}

// Reader returns the file's bytes for an upload. It reads the file as it
// is when read; the caller keeps writers out or re-uploads.
func (f *File) Reader() *os.File { return f.f }

// Drop forgets the file and frees its space.
func (f *File) Drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dropped {
		return
	}
	f.dropped = true
	n := chunks(f.size)
	if f.pinnedLocked() {
		f.c.mu.Lock()
		f.c.pinned -= f.size
		f.c.mu.Unlock()
	} else {
		f.c.mu.Lock()
		for i := int64(0); i < n; i++ {
			if f.has(i) && f.c.lru.Remove(chunk{f, i}) {
				f.c.clean -= f.chunkLen(i)
			}
		}
		f.c.mu.Unlock()
	}
	f.present = nil
	f.f.Close()
}

func (c *Cache) touch(f *File, first, last int64) {
	c.mu.Lock()
	for i := first; i <= last; i++ {
		c.lru.Get(chunk{f, i})
	}
	c.mu.Unlock()
}

// add records a clean chunk and evicts the oldest ones past the limit.
func (c *Cache) add(f *File, i, n int64) {
	c.mu.Lock()
	if !c.lru.Contains(chunk{f, i}) {
		c.lru.Add(chunk{f, i}, struct{}{})
		c.clean += n
	}
	victims := c.overLocked()
	c.mu.Unlock()
	evict(victims)
}

func (c *Cache) pin(f *File, n, size int64) {
	c.mu.Lock()
	for i := int64(0); i < n; i++ {
		if c.lru.Remove(chunk{f, i}) {
			c.clean -= min(int64(ChunkSize), size-i*ChunkSize)
		}
	}
	c.pinned += size
	c.mu.Unlock()
}

func (c *Cache) unpin(f *File, n, size int64) {
	c.mu.Lock()
	c.pinned -= size
	for i := int64(0); i < n; i++ {
		c.lru.Add(chunk{f, i}, struct{}{})
		c.clean += min(int64(ChunkSize), size-i*ChunkSize)
	}
	victims := c.overLocked()
	c.mu.Unlock()
	// The caller holds f.mu: chunks of f itself are evicted in place.
	var others []chunk
	for _, v := range victims {
		if v.f == f {
			f.punch(v.idx)
		} else {
			others = append(others, v)
		}
	}
	go evict(others)
}

// overLocked takes the least recently used clean chunks off the list until
// the cache is within its limit, and returns them to be punched out.
func (c *Cache) overLocked() []chunk {
	var victims []chunk
	for c.clean+c.pinned > c.limit && c.lru.Len() > 0 {
		k, _, _ := c.lru.RemoveOldest()
		// Without k.f.mu: a file whose chunks are in the list is
		// clean, and a clean file's size does not change.
		c.clean -= k.f.chunkLen(k.idx)
		victims = append(victims, k)
	}
	return victims
}

func evict(victims []chunk) {
	for _, v := range victims {
		v.f.mu.Lock()
		v.f.punch(v.idx)
		v.f.mu.Unlock()
	}
}

// punch frees chunk i's disk space. The caller holds f.mu.
func (f *File) punch(i int64) {
	if f.dropped || f.pinnedLocked() || !f.has(i) {
		return
	}
	f.set(i, false)
	n := f.chunkLen(i)
	if err := unix.Fallocate(int(f.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, i*ChunkSize, n); err != nil {
		// Without hole punching the space stays used until the file is
		// dropped; the bytes are still correct, and the chunk reads as
		// missing so it is fetched again.
		return
	}
}
