package format

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/amlfs/amlfs/amlerr"
)

// TestManifestRejects holds a manifest to AML's parser rules and to what
// an amlfs extension may say.
func TestManifestRejects(t *testing.T) {
	for name, data := range map[string]string{
		"symlink among entries":   `{"entries":[{"mode":511,"path":"l","size":0,"type":"symlink"}],"version":1}`,
		"target on a file":        `{"entries":[{"mode":420,"path":"f","size":0,"type":"file","target":"x"}],"version":1}`,
		"file beneath a symlink":  `{"entries":[{"mode":420,"path":"l/f","size":0,"type":"file"}],"amlfs":{"symlinks":[{"path":"l","target":"d","type":"symlink"}]},"version":1}`,
		"symlink and file clash":  `{"entries":[{"mode":420,"path":"l","size":0,"type":"file"}],"amlfs":{"symlinks":[{"path":"l","target":"d","type":"symlink"}]},"version":1}`,
		"empty target":            `{"entries":[],"amlfs":{"symlinks":[{"path":"l","target":"","type":"symlink"}]},"version":1}`,
		"extension of wrong type": `{"entries":[],"amlfs":{"symlinks":[{"path":"l","target":"d","type":"file"}]},"version":1}`,
		"traversing symlink path": `{"entries":[],"amlfs":{"symlinks":[{"path":"../l","target":"d","type":"symlink"}]},"version":1}`,
		"bad mtime":               `{"entries":[{"mode":420,"mtime":12,"path":"f","size":0,"type":"file"}],"version":1}`,
	} {
		if _, err := ParseManifest("m", []byte(data), DefaultLimits); err == nil {
			t.Errorf("%s: accepted %s", name, data)
		}
	}
	// Unknown keys anywhere are ignored, as AML's parser does.
	if _, err := ParseManifest("m", []byte(`{"entries":[{"mode":420,"path":"f","size":0,"type":"file","x":1}],"other":{},"version":1}`), DefaultLimits); err != nil {
		t.Error(err)
	}
}

func TestIndexValidation(t *testing.T) {
	ok := `{"current":"r1","revisions":[{"createdAt":"2026-12-02T18:00:00.000Z","format":"folder","id":"r1","path":"revisions/r1/"}],"version":1}`
	if _, err := ParseIndex([]byte(ok)); err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"version 2":    strings.Replace(ok, `"version":1`, `"version":2`, 1),
		"bad path":     strings.Replace(ok, `revisions/r1/`, `revisions/r2/`, 1),
		"archive path": strings.Replace(ok, `"format":"folder"`, `"format":"archive"`, 1),
		"no millis":    strings.Replace(ok, `18:00:00.000Z`, `18:00:00Z`, 1),
		"padded id":    strings.Replace(strings.Replace(ok, `"id":"r1"`, `"id":" r1"`, 1), `"current":"r1"`, `"current":" r1"`, 1),
		"dup":          `{"current":"r1","revisions":[{"createdAt":"2026-12-02T18:00:00.000Z","format":"folder","id":"r1","path":"revisions/r1/"},{"createdAt":"2026-12-02T18:00:00.000Z","format":"folder","id":"r1","path":"revisions/r1/"}],"version":1}`,
		"trailing":     ok + "{}",
		"not json":     "hello",
		"empty":        "",
	}
	for name, data := range bad {
		if _, err := ParseIndex([]byte(data)); amlerr.Code(err) != amlerr.InvalidStore {
			t.Errorf("%s: got %v", name, err)
		}
	}
	// Round trip through Marshal is byte-exact.
	idx, _ := ParseIndex([]byte(ok))
	out, _ := idx.Marshal()
	if string(out) != ok {
		t.Errorf("marshal %s", out)
	}
	var v map[string]any
	if json.Unmarshal(out, &v) != nil {
		t.Error("invalid json")
	}
}

func TestHostileArchives(t *testing.T) {
	small := Limits{Entries: 10, ExtractedBytes: 1000, ArchiveBytes: 1 << 20}
	zero := func(h *tar.Header) []byte { return make([]byte, h.Size) }
	cases := []struct {
		name string
		hdrs []*tar.Header
		code string
	}{
		{"absolute", []*tar.Header{{Name: "/etc/passwd", Typeflag: tar.TypeReg, Size: 1}}, amlerr.InvalidStore},
		{"dotdot", []*tar.Header{{Name: "./../x", Typeflag: tar.TypeReg, Size: 1}}, amlerr.InvalidStore},
		{"symlink", []*tar.Header{{Name: "./l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}}, amlerr.InvalidStore},
		{"hardlink", []*tar.Header{{Name: "./l", Typeflag: tar.TypeLink, Linkname: "x"}}, amlerr.InvalidStore},
		{"bomb bytes", []*tar.Header{{Name: "./big", Typeflag: tar.TypeReg, Size: 5000}}, amlerr.LimitExceeded},
		{"bomb entries", func() []*tar.Header {
			var hs []*tar.Header
			for i := 0; i < 20; i++ {
				hs = append(hs, &tar.Header{Name: "./f" + string(rune('a'+i)), Typeflag: tar.TypeReg})
			}
			return hs
		}(), amlerr.LimitExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := tarGz(t, tc.hdrs, zero)
			dir := t.TempDir()
			_, err := ReadArchive(bytes.NewReader(data), "x.tar.gz", small, nil)
			if amlerr.Code(err) != tc.code {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
			ents, _ := os.ReadDir(dir)
			if len(ents) != 0 {
				t.Errorf("extracted %d entries", len(ents))
			}
		})
	}
	// The compressed size limit holds too.
	data := tarGz(t, []*tar.Header{{Name: "./r", Typeflag: tar.TypeReg, Size: 900}}, func(h *tar.Header) []byte {
		b := make([]byte, h.Size)
		for i := range b {
			b[i] = byte(i * 7919 >> 3)
		}
		return b
	})
	if _, err := ReadArchive(bytes.NewReader(data), "x", Limits{ArchiveBytes: 100}, nil); amlerr.Code(err) != amlerr.LimitExceeded {
		t.Errorf("archive byte limit: %v", err)
	}
}

func tarGz(t testing.TB, hdrs []*tar.Header, body func(*tar.Header) []byte) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if b := body(h); b != nil {
			tw.Write(b)
		}
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}
