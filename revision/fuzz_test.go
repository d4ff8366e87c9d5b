package revision

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/amlfs/amlfs/revision/format"

	"github.com/amlfs/amlfs/amlerr"
)

func FuzzExtractArchive(f *testing.F) {
	seed := func(hdrs ...*tar.Header) []byte {
		return tarGz(f, hdrs, func(h *tar.Header) []byte { return make([]byte, h.Size) })
	}
	f.Add(seed(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}, &tar.Header{Name: "./a.txt", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644}))
	f.Add(seed(&tar.Header{Name: "/abs", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(seed(&tar.Header{Name: "./l", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}))
	f.Add([]byte("not gzip"))
	f.Fuzz(func(t *testing.T, data []byte) {
		lim := format.Limits{Entries: 100, ExtractedBytes: 1 << 20, ArchiveBytes: 1 << 20}
		dir := t.TempDir()
		parent := filepath.Dir(dir)
		before, _ := os.ReadDir(parent)
		entries, err := readArchive(bytes.NewReader(data), dir, "x.tar.gz", lim, nil)
		if err != nil {
			if c := amlerr.Code(err); c == "" {
				// Local I/O errors are possible only for odd but valid
				// archives (a file under a file is rejected earlier).
				t.Logf("uncoded error: %v", err)
			}
		} else {
			for _, e := range entries {
				if err := format.ValidPath(e.Path); err != nil {
					t.Fatalf("accepted %q: %v", e.Path, err)
				}
			}
		}
		// Nothing escapes the target directory.
		after, _ := os.ReadDir(parent)
		if len(after) != len(before) {
			t.Fatalf("archive wrote outside its directory")
		}
	})
}

// FuzzGitignore snapshots a small tree under an arbitrary .gitignore: the
// snapshot never fails because of the file's content, names only paths
// that exist and are valid, and always keeps what an explicit include
// names.
func FuzzGitignore(f *testing.F) {
	for _, s := range []string{"*.log\n", "!keep.log\n*.log\n", "/a/\n", "**/b\n", "\\#x\n[\n", "a/**/c\n!a/b/\n", "\x00\n/\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ignore string) {
		dir := t.TempDir()
		for _, p := range []string{"a/b/c.txt", "a/keep.log", "x.log", "top.txt"} {
			os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
			os.WriteFile(filepath.Join(dir, p), []byte(p), 0o644)
		}
		os.WriteFile(filepath.Join(dir, ".gitignore"), []byte(ignore), 0o644)
		os.WriteFile(filepath.Join(dir, "a", ".gitignore"), []byte(ignore), 0o644)
		es, _, err := Snapshot(dir, format.Selection{Include: []string{"top.txt"}})
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		top := false
		for _, e := range es {
			if err := format.ValidPath(e.Path); err != nil {
				t.Fatalf("invalid path %q: %v", e.Path, err)
			}
			if _, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(e.Path))); err != nil {
				t.Fatalf("snapshot names %q: %v", e.Path, err)
			}
			top = top || e.Path == "top.txt"
		}
		if !top {
			t.Fatalf("an explicit include was ignored: %v", es)
		}
	})
}
