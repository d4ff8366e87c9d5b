package format

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
)

func TestEntryStatJSON(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`"1764882000.123456789 1234 1000 1001"`, true},
		{`"1764882000.123456789 281474976710655 0 0"`, true},
		{`"1764882000.123456789 281474976710656 0 0"`, false}, // over MaxShownIno
		{`"1764882000.123456789 1234 1000"`, false},
		{`"1764882000.1 1234 1000 1001"`, false},
		{`"1764882000.123456789 -1 1000 1001"`, false},
		{`"1764882000.123456789 1 4294967296 1"`, false},
		{`1234`, false},
	} {
		var s EntryStat
		err := s.UnmarshalJSON([]byte(tc.in))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v", tc.in, err)
		}
		if err == nil {
			out, _ := s.MarshalJSON()
			if string(out) != tc.in {
				t.Errorf("%s round-trips as %s", tc.in, out)
			}
		}
	}
}

// TestManifestStatDroppedOverLimit: stat data never make a tree that fits
// AML's manifest bound unsavable.
func TestManifestStatDroppedOverLimit(t *testing.T) {
	var es []TreeEntry
	for i := range 50000 {
		es = append(es, TreeEntry{Path: fmt.Sprintf("d/f%06d", i), Type: TypeFile, Mode: 0o644, Size: 1,
			Stat: EntryStat{Ctime: 1764882000123456789, Ino: uint64(1e6 + i), Uid: 1000, Gid: 1000}})
	}
	lim := DefaultLimits
	bare := NewManifest(append([]TreeEntry(nil), es...))
	bare.DropStat()
	plain, err := bare.Marshal(lim)
	if err != nil {
		t.Fatal(err)
	}
	full, err := NewManifest(append([]TreeEntry(nil), es...)).Marshal(Limits{Entries: lim.Entries * 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(full) <= MaxManifestBytes || len(plain) > MaxManifestBytes {
		t.Fatalf("the test tree does not straddle the bound: %d and %d bytes", len(full), len(plain))
	}
	data, err := NewManifest(es).Marshal(lim)
	if err != nil {
		t.Fatalf("a tree that fits without stat data failed: %v", err)
	}
	if strings.Contains(string(data), `"amlfs":"`) || len(data) != len(plain) {
		t.Errorf("stat data kept over the bound: %d bytes", len(data))
	}
}

// TestMtimeJSON: the hand-written encoding is the one fmt wrote, and
// reads back exactly, escapes included.
func TestMtimeJSON(t *testing.T) {
	for _, m := range []Mtime{0, 1, -1, 999999999, 1e9, 1764882000123456789, -1500000001, -1e9} {
		sec, nsec := int64(m)/1e9, int64(m)%1e9
		if nsec < 0 {
			sec, nsec = sec-1, nsec+1e9
		}
		want := fmt.Sprintf("%q", fmt.Sprintf("%d.%09d", sec, nsec))
		b, _ := m.MarshalJSON()
		if string(b) != want {
			t.Errorf("%d encodes as %s, want %s", int64(m), b, want)
		}
		var back Mtime
		if err := back.UnmarshalJSON(b); err != nil || back != m {
			t.Errorf("%s reads back as %d (%v)", b, int64(back), err)
		}
	}
	var m Mtime
	if err := m.UnmarshalJSON([]byte(`"1764882000\u002e123456789"`)); err != nil || m != 1764882000123456789 {
		t.Errorf("an escaped dot: %d, %v", int64(m), err)
	}
}

// TestSortEntries: the keyed sort gives the order of the plain definition
// (depth, then JavaScript's string order), for ASCII and other names.
func TestSortEntries(t *testing.T) {
	names := []string{"a", "B", "b", "é", "z", "\U0001F600", "\uff5e", "a.b", "a-b", "_"}
	var es []TreeEntry
	for i := 0; i < 400; i++ {
		p := names[(i*7)%len(names)]
		for d := 0; d < i%4; d++ {
			p = names[(i*3+d)%len(names)] + "/" + p
		}
		es = append(es, TreeEntry{Path: fmt.Sprintf("%s%d", p, i%13)})
	}
	want := slices.Clone(es)
	sort.SliceStable(want, func(i, j int) bool {
		if di, dj := Depth(want[i].Path), Depth(want[j].Path); di != dj {
			return di < dj
		}
		return jsLess(want[i].Path, want[j].Path)
	})
	SortEntries(es)
	for i := range es {
		if es[i].Path != want[i].Path {
			t.Fatalf("at %d: %q, want %q", i, es[i].Path, want[i].Path)
		}
	}
	SortEntries(es) // sorted already: unchanged
	if !slices.Equal(es, want) {
		t.Fatal("a sorted list changed")
	}
}
