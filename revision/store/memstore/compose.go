package memstore

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/store"
)

// PartRules sets the multipart rules Compose follows, as S3's
// (store.MinPart, MaxPart, MaxParts) by default; tests make them small.
func (b *Base) PartRules(minPart, maxPart int64, maxParts int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.minPart, b.maxPart, b.maxParts = minPart, maxPart, maxParts
}

func (b *Base) rules() (int64, int64, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.minPart == 0 {
		return store.MinPart, store.MaxPart, store.MaxParts
	}
	return b.minPart, b.maxPart, b.maxParts
}

// ReadRange reads a range of an object (store.Store); the fault hook sees
// it as "read".
func (s *Store) ReadRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, int64, error) {
	data, err := s.object(ctx, "read", key)
	if err != nil {
		return nil, 0, err
	}
	size := int64(len(data))
	if off < 0 {
		off = max(0, size-n)
	}
	off = min(off, size)
	n = max(0, min(n, size-off))
	return io.NopCloser(bytes.NewReader(data[off : off+n])), size, nil
}

// object returns the bytes of key, after the fault hook's say for op.
func (s *Store) object(ctx context.Context, op, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	full, ok := s.full(key)
	if !ok {
		return nil, amlerr.New(amlerr.InvalidStore, key, "not a key of this store")
	}
	b := s.base
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failed(op, key); err != nil {
		return nil, err
	}
	data, ok := b.objects[full]
	if !ok {
		return nil, fmt.Errorf("%w: %s", store.ErrNotExist, full)
	}
	return data, nil
}

// Compose plays a multipart upload as S3 would (store.PlanParts): the
// fault hook sees each part as "copy-part" (a server-side copy of its
// key) or "put-part", and each piece of an existing object read for an
// uploaded part as "read".
func (st *stager) Compose(ctx context.Context, pieces []store.Piece) error {
	if err := st.name(""); err != nil {
		return err
	}
	if err := store.CheckPieces(pieces); err != nil {
		return err
	}
	minPart, maxPart, maxParts := st.s.base.rules()
	parts, err := store.PlanParts(pieces, minPart, maxPart, maxParts)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	get := func(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
		r, _, err := st.s.ReadRange(ctx, key, off, n)
		return r, err
	}
	for _, p := range parts {
		if p.Copy {
			pc := p.Pieces[0]
			data, err := st.s.object(ctx, "copy-part", pc.Key)
			if err != nil {
				return err
			}
			if pc.Off+pc.N > int64(len(data)) {
				return amlerr.New(amlerr.InvalidStore, pc.Key, "%d bytes at %d: the object is shorter", pc.N, pc.Off)
			}
			out.Write(data[pc.Off : pc.Off+pc.N])
			continue
		}
		if err := st.s.base.fail("put-part", st.key); err != nil {
			return err
		}
		data, err := store.ReadPart(ctx, p, get)
		if err != nil {
			return err
		}
		out.Write(data)
	}
	return st.land("", out.Bytes(), int64(out.Len()))
}
