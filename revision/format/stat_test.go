package format

import (
	"fmt"
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
