package s3live

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/amlfs/amlfs/cache"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// handle is an open file: it tracks sequential reads for readahead.
type handle struct {
	n *node
	// pt is the cache file the kernel uses directly (passthrough), held
	// until release; ptWrite if it may write it.
	pt      *cache.File
	ptWrite bool

	mu     sync.Mutex
	next   int64 // GUARDED_BY(mu): the end of the furthest read so far
	window int64 // GUARDED_BY(mu): readahead, grown while reads are sequential
}

var (
	_ = (gofs.FileReader)((*handle)(nil))
	_ = (gofs.FileWriter)((*handle)(nil))
	_ = (gofs.FileReleaser)((*handle)(nil))
	_ = (gofs.FileFsyncer)((*handle)(nil))
	_ = (gofs.FileGetattrer)((*handle)(nil))
)

const (
	maxReadahead = 128 << 20
	seqSlack     = 4 << 20
)

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	l, e := h.n.l, h.n.e
	end := off + int64(len(dest))
	// The kernel reads ahead several requests at once, so they arrive
	// a little out of order: near the furthest read so far counts as
	// sequential.
	h.mu.Lock()
	if d := off - h.next; h.next > 0 && d > -seqSlack && d < seqSlack {
		h.window = min(max(h.window*2, 2*cache.ChunkSize), maxReadahead)
	} else if off != 0 {
		h.window = 0
	}
	h.next = max(h.next, end)
	if off == 0 {
		h.next = end
	}
	window := h.window
	h.mu.Unlock()
	for try := range 4 {
		l.mu.Lock()
		f, errno := l.dataLocked(e)
		l.mu.Unlock()
		if errno != 0 {
			return nil, errno
		}
		size := f.Size()
		n, ok, err := f.ReadAt(dest, off)
		if errors.Is(err, cache.ErrDropped) {
			continue // the object changed: read the new one
		}
		if err != nil {
			return nil, l.errno("read", l.keyOf(e), err)
		}
		ra := min(end+window, size)
		if try == 0 {
			if ok {
				l.hits.Add(1)
			} else {
				l.misses.Add(1)
			}
		}
		if ok {
			if window > 0 && ra > end {
				l.readahead(ctx, e, f, end, ra)
			}
			return fuse.ReadResultData(dest[:n]), 0
		}
		if window > 0 && ra > off {
			// Ask for the readahead along with what is needed now.
			l.readahead(ctx, e, f, off, ra)
		}
		if err := l.fill(ctx, e, f, off/cache.ChunkSize, (min(end, size)-1)/cache.ChunkSize, true); err != nil {
			return nil, l.errno("read", l.keyOf(e), err)
		}
	}
	return nil, syscall.EIO
}

// readahead starts fetching [off, end) of e in the background, in whole
// maxFetch-aligned blocks, so that a growing window asks for a few large
// ranges rather than many small ones.
func (l *Live) readahead(ctx context.Context, e *ent, f *cache.File, off, end int64) {
	const blk = maxFetch / cache.ChunkSize
	first, last := off/cache.ChunkSize, (end-1)/cache.ChunkSize
	first -= first % blk
	last += blk - 1 - last%blk
	if n := (f.Size() + cache.ChunkSize - 1) / cache.ChunkSize; last >= n {
		last = n - 1
	}
	l.fill(ctx, e, f, first, last, false)
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	l, e := h.n.l, h.n.e
	// An fsync while the file is open uploads it and makes it clean:
	// writing again needs it dirty again.
	if errno := l.writable(ctx, e, false); errno != 0 {
		return 0, errno
	}
	l.mu.Lock()
	f := e.data
	l.mu.Unlock()
	n, err := f.WriteAt(data, off)
	l.mu.Lock()
	e.gen++
	e.ctime = time.Now()
	l.mu.Unlock()
	if err != nil {
		return uint32(n), l.errno("write", "", err)
	}
	return uint32(n), 0
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.n.Getattr(ctx, nil, out)
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.n.l.fsync(ctx, h.n.e)
}

// Release queues the upload of a changed file once its last handle closes.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.n.l.q.touch()
	l, e := h.n.l, h.n.e
	l.mu.Lock()
	e.opens--
	if h.pt != nil {
		h.pt.Unhold()
		e.ptOpens--
		if h.ptWrite {
			// The kernel wrote the cache file directly.
			e.ptWriters--
			e.gen++
		}
		if e.ptOpens == 0 {
			if e.ptData != e.data {
				e.ptData.Drop() // replaced while open (the object changed)
			}
			e.ptData = nil
		}
	}
	upload := e.opens == 0 && (e.dirty || e.metaDirty) && !e.gone
	if e.opens == 0 && e.gone && e.data != nil {
		e.data.Drop()
		e.data = nil
	}
	l.mu.Unlock()
	if upload {
		l.enqueuePut(e, l.o.WriteBack)
	}
	return 0
}
