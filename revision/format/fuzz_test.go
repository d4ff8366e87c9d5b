package format

import (
	"archive/tar"
	"bytes"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amlfs/amlfs/amlerr"
)

func FuzzParseIndex(f *testing.F) {
	f.Add([]byte(`{"current":"r1","revisions":[{"createdAt":"2026-12-02T18:00:00.000Z","format":"folder","id":"r1","path":"revisions/r1/"}],"version":1}`))
	f.Add([]byte(`{"current":"a","revisions":[{"createdAt":"2026-12-02T18:00:00.000Z","format":"archive","id":"a","path":"revisions/a.tar.gz"}],"version":1}`))
	f.Add([]byte(`{"current":"..","revisions":[{"createdAt":"x","format":"folder","id":"..","path":"revisions/../"}],"version":1}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, err := ParseIndex(data)
		if err != nil {
			if amlerr.Code(err) != amlerr.InvalidStore {
				t.Fatalf("rejection without INVALID_STORE: %v", err)
			}
			return
		}
		// Anything accepted is safe to use as paths and round-trips.
		for _, e := range idx.Revisions {
			if strings.HasPrefix(e.ID, ".") || strings.ContainsAny(e.ID, "/\x00") || e.Path != RevisionPath(e.ID, e.Format) {
				t.Fatalf("unsafe revision accepted: %+v", e)
			}
		}
		out, err := idx.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseIndex(out)
		if err != nil || again.Current != idx.Current || len(again.Revisions) != len(idx.Revisions) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(`{"entries":[{"mode":420,"path":"a/b.txt","size":3,"type":"file"},{"mode":493,"path":"a","size":0,"type":"directory"}],"version":1}`))
	f.Add([]byte(`{"entries":[{"mode":420,"path":"../x","size":3,"type":"file"}],"version":1}`))
	f.Add([]byte(`{"entries":[{"mode":420,"path":"a","size":1,"type":"file"},{"mode":420,"path":"a/b","size":1,"type":"file"}],"version":1}`))
	f.Add([]byte(`{"entries":[{"amlfs":"1764882000.123456789 1234 1000 1000","mode":420,"path":"a","size":1,"type":"file"}],"amlfs":{"fork":{"id":"main","revision":"r1"},"symlinks":[{"amlfs":"1764882000.000000001 7 0 0","mode":511,"path":"l","size":0,"target":"a","type":"symlink"}]},"version":1}`))
	f.Add([]byte(`{"entries":[],"amlfs":{"fork":{"id":" bad","revision":""}},"version":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest("m", data, Limits{Entries: 1000, ExtractedBytes: 1 << 20})
		if err != nil {
			if c := amlerr.Code(err); c != amlerr.InvalidStore && c != amlerr.LimitExceeded {
				t.Fatalf("rejection without a code: %v", err)
			}
			return
		}
		for _, e := range m.Tree() {
			if filepath.IsAbs(e.Path) || strings.Contains("/"+e.Path+"/", "/../") || e.Mode > 0o777 || e.Stat.Ino > MaxShownIno {
				t.Fatalf("unsafe entry accepted: %+v", e)
			}
		}
		if m.Ext != nil && m.Ext.Fork != nil && ValidateID(m.Ext.Fork.ID) != nil {
			t.Fatalf("a fork record with an id AML refuses: %+v", m.Ext.Fork)
		}
	})
}

func FuzzSelection(f *testing.F) {
	f.Add("src/**", "**/*.log", "a/b.log")
	f.Add("[", "", "x")
	f.Add("{a,b}/*", "b/**", "b/c")
	f.Fuzz(func(t *testing.T, include, exclude, p string) {
		s := Selection{}
		if include != "" {
			s.Include = []string{include}
		}
		if exclude != "" {
			s.Exclude = []string{exclude}
		}
		if err := s.Validate(); err != nil {
			if amlerr.Code(err) != amlerr.InvalidConfig {
				t.Fatalf("uncoded: %v", err)
			}
			return
		}
		if ValidPath(p) != nil {
			return
		}
		// An explicit exclude always wins.
		if exclude != "" && MatchAny(s.Exclude, p) && s.Takes(p) {
			t.Fatalf("excluded %q taken", p)
		}
	})
}

func FuzzSeg(f *testing.F) {
	for _, s := range []string{"a", ".", "..", "a/b", "é", "!'()*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		s, err := Seg(id)
		if err != nil {
			return
		}
		if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00!'()*") {
			t.Fatalf("Seg(%q) = %q is not a safe segment", id, s)
		}
	})
}

// FuzzReadArchive validates arbitrary bytes as an archive revision: a
// rejection carries a code, and every entry accepted has a valid path.
func FuzzReadArchive(f *testing.F) {
	seed := func(hdrs ...*tar.Header) []byte {
		return tarGz(f, hdrs, func(h *tar.Header) []byte { return make([]byte, h.Size) })
	}
	f.Add(seed(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}, &tar.Header{Name: "./a.txt", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644}))
	f.Add(seed(&tar.Header{Name: "/abs", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(seed(&tar.Header{Name: "./l", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}))
	f.Add([]byte("not gzip"))
	f.Fuzz(func(t *testing.T, data []byte) {
		lim := Limits{Entries: 100, ExtractedBytes: 1 << 20, ArchiveBytes: 1 << 20}
		var seen []TreeEntry
		entries, err := ReadArchive(bytes.NewReader(data), "x.tar.gz", lim, func(e TreeEntry, content io.Reader) error {
			seen = append(seen, e)
			if (content == nil) != (e.Type == TypeDir) {
				t.Fatalf("%q: content %v for a %s", e.Path, content != nil, e.Type)
			}
			return nil
		})
		if err != nil {
			if amlerr.Code(err) == "" {
				t.Fatalf("rejection without a code: %v", err)
			}
			return
		}
		if len(seen) != len(entries) {
			t.Fatalf("each saw %d entries of %d", len(seen), len(entries))
		}
		for _, e := range entries {
			if err := ValidPath(e.Path); err != nil {
				t.Fatalf("accepted %q: %v", e.Path, err)
			}
		}
	})
}
