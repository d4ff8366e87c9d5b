package store

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// flatten is the byte ranges parts cover, in order, merged where adjacent.
func flatten(ps []Piece) []Piece {
	var out []Piece
	for _, p := range ps {
		if p.N == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Key == p.Key && out[n-1].Data == p.Data && out[n-1].Off+out[n-1].N == p.Off {
			out[n-1].N += p.N
			continue
		}
		out = append(out, p)
	}
	return out
}

func checkPlan(t *testing.T, pieces []Piece, parts []Part, minPart, maxPart int64) {
	t.Helper()
	var got []Piece
	for i, p := range parts {
		var n int64
		for _, pc := range p.Pieces {
			n += pc.N
		}
		if n != p.N {
			t.Fatalf("part %d says %d bytes, holds %d", i, p.N, n)
		}
		if i < len(parts)-1 && p.N < minPart {
			t.Fatalf("part %d of %d bytes is not the last and under %d", i, p.N, minPart)
		}
		if p.N > maxPart {
			t.Fatalf("part %d of %d bytes over %d", i, p.N, maxPart)
		}
		if p.Copy && (len(p.Pieces) != 1 || p.Pieces[0].Key == "") {
			t.Fatalf("copy part %d is not one range of an object: %+v", i, p.Pieces)
		}
		got = append(got, p.Pieces...)
	}
	a, b := flatten(got), flatten(pieces)
	if len(a) != len(b) {
		t.Fatalf("parts cover %+v, want %+v", a, b)
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("parts cover %+v, want %+v", a, b)
		}
	}
}

func TestPlanParts(t *testing.T) {
	lit := bytes.NewReader(nil)
	const mb = 1 << 20
	of := func(off, n int64) Piece { return Piece{Key: "revisions/a.tar.gz", Off: off, N: n} }
	new := func(n int64) Piece { return Piece{Data: lit, N: n} }
	tests := []struct {
		name          string
		pieces        []Piece
		copies, parts int
	}{
		// One changed file: the ranges on either side are copied, the
		// new member and the index go up as the last part.
		{"one change", []Piece{of(0, 200*mb), of(201*mb, 300*mb), new(2 * mb)}, 2, 3},
		{"small archive", []Piece{of(0, 3*mb), new(mb)}, 0, 1},
		// New bytes first: the next range fills their part up to 5 MiB.
		{"fill up", []Piece{new(mb), of(0, 100*mb), new(mb)}, 1, 3},
		// A range too short to fill and still be copied is read.
		{"fill all", []Piece{new(mb), of(0, 8*mb), new(mb)}, 0, 1},
		{"huge range", []Piece{of(0, 12<<30), new(10)}, 3, 4},
		{"huge literal", []Piece{new(100 * mb)}, 0, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parts, err := PlanParts(tc.pieces, MinPart, MaxPart, MaxParts)
			if err != nil {
				t.Fatal(err)
			}
			checkPlan(t, tc.pieces, parts, MinPart, MaxPart)
			copies := 0
			for _, p := range parts {
				if p.Copy {
					copies++
				}
			}
			if copies != tc.copies || len(parts) != tc.parts {
				t.Errorf("%d parts, %d copies; want %d, %d", len(parts), copies, tc.parts, tc.copies)
			}
		})
	}
	if _, err := PlanParts([]Piece{of(0, 10*mb), new(mb), of(0, 10*mb)}, MinPart, MaxPart, 2); !errors.Is(err, ErrTooManyParts) {
		t.Errorf("over the part count: %v", err)
	}
}

// TestPlanPartsRandom checks the rules on random compositions.
func TestPlanPartsRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	lit := bytes.NewReader(nil)
	for range 2000 {
		var pieces []Piece
		for range rng.IntN(12) {
			n := rng.Int64N(40)
			if rng.IntN(2) == 0 {
				pieces = append(pieces, Piece{Data: lit, Off: rng.Int64N(100), N: n})
			} else {
				pieces = append(pieces, Piece{Key: "revisions/k.tar.gz", Off: rng.Int64N(100), N: n})
			}
		}
		parts, err := PlanParts(pieces, 5, 12, 10000)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, pieces, parts, 5, 12)
	}
}
