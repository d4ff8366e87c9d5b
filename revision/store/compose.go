package store

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/amlfs/amlfs/amlerr"
)

// A Piece is N bytes of an artifact being composed (Stager.Compose): the
// bytes at Off of the existing object Key (this store's, or a foreign
// key), or, with Key empty, the bytes at Off of Data.
type Piece struct {
	Key    string
	Data   io.ReaderAt
	Off, N int64
}

// head and tail cut p at n bytes.
func (p Piece) head(n int64) Piece { p.N = n; return p }
func (p Piece) tail(n int64) Piece { p.Off, p.N = p.Off+n, p.N-n; return p }

// S3's rules for the parts of a multipart upload.
const (
	MinPart  = 5 << 20 // every part but the last
	MaxPart  = 5 << 30
	MaxParts = 10000
	// LiteralPart is the size an uploaded part grows to before the next
	// one starts.
	LiteralPart = 16 << 20
)

// ErrTooManyParts is returned by PlanParts when the pieces would need more
// parts than a multipart upload may have: the caller writes the artifact
// whole instead.
var ErrTooManyParts = errors.New("the composition needs more parts than a multipart upload allows")

// A Part is one part of a multipart upload: with Copy, one ranged
// server-side copy of Pieces[0]; else an upload of its pieces' bytes, in
// order (an existing object's bytes read with a ranged GET).
type Part struct {
	Copy   bool
	Pieces []Piece
	N      int64
}

// PlanParts cuts pieces into the parts of a multipart upload under rules
// (MinPart, MaxPart, MaxParts, or smaller ones for tests): a piece of an
// existing object at least minPart long is copied on the server, in
// parts of at most maxPart; shorter ones, and the bytes next to literal
// data that would leave a part under minPart, are read and uploaded with
// the literal data, in parts of about LiteralPart (or minPart if larger).
// Only the last part may be short.
func PlanParts(pieces []Piece, minPart, maxPart int64, maxParts int) ([]Part, error) {
	if minPart <= 0 || maxPart < 2*minPart {
		return nil, fmt.Errorf("part rules: min %d, max %d", minPart, maxPart)
	}
	lit := min(max(int64(LiteralPart), minPart), maxPart)
	var (
		parts []Part
		cur   Part
	)
	flush := func() {
		if cur.N > 0 {
			parts = append(parts, cur)
			cur = Part{}
		}
	}
	add := func(p Piece) {
		for p.N > 0 {
			n := min(p.N, lit-cur.N)
			cur.Pieces = append(cur.Pieces, p.head(n))
			cur.N += n
			p = p.tail(n)
			if cur.N >= lit {
				flush()
			}
		}
	}
	for _, p := range pieces {
		if p.N < 0 {
			return nil, fmt.Errorf("piece of %d bytes", p.N)
		}
		if p.Key == "" || p.N < minPart {
			add(p)
			continue
		}
		if cur.N > 0 && cur.N < minPart {
			// Fill the open part up to minPart from this piece's start,
			// if what is left can still be copied.
			need := minPart - cur.N
			if p.N-need < minPart {
				add(p)
				continue
			}
			add(p.head(need))
			p = p.tail(need)
		}
		flush()
		k := (p.N + maxPart - 1) / maxPart
		for i := range k {
			// Even cuts: each at least p.N/k >= minPart.
			from, to := p.N*i/k, p.N*(i+1)/k
			parts = append(parts, Part{Copy: true, Pieces: []Piece{p.tail(from).head(to - from)}, N: to - from})
		}
	}
	flush()
	if len(parts) > maxParts {
		return nil, fmt.Errorf("%w: %d parts", ErrTooManyParts, len(parts))
	}
	return parts, nil
}

// ReadPart reads a part's bytes: its literal pieces from their data, its
// pieces of existing objects with get (a ranged read).
func ReadPart(ctx context.Context, p Part, get func(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)) ([]byte, error) {
	buf := make([]byte, 0, p.N)
	for _, pc := range p.Pieces {
		var r io.Reader
		if pc.Key == "" {
			r = io.NewSectionReader(pc.Data, pc.Off, pc.N)
		} else {
			rc, err := get(ctx, pc.Key, pc.Off, pc.N)
			if err != nil {
				return nil, err
			}
			defer rc.Close()
			r = rc
		}
		n, err := io.ReadFull(r, buf[len(buf):len(buf)+int(pc.N)])
		if err != nil {
			if pc.Key != "" && errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, amlerr.New(amlerr.InvalidStore, pc.Key, "%d bytes at %d: the object is shorter", pc.N, pc.Off)
			}
			return nil, err
		}
		buf = buf[:len(buf)+n]
	}
	return buf, nil
}

// CheckPieces refuses pieces with a negative size or offset, or a key
// that is neither this workspace's nor another's revision object.
func CheckPieces(pieces []Piece) error {
	for _, p := range pieces {
		if p.N < 0 || p.Off < 0 {
			return fmt.Errorf("piece [%d, +%d)", p.Off, p.N)
		}
		if p.Key == "" {
			if p.Data == nil {
				return errors.New("a piece with neither key nor data")
			}
			continue
		}
		if err := CheckKey(p.Key); err != nil {
			return err
		}
	}
	return nil
}
