package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir, tmp := t.TempDir(), t.TempDir()
	p := filepath.Join(dir, "f.json")
	for _, tc := range []struct {
		tmpDir string
		data   string
		perm   os.FileMode
	}{{"", "one", 0o600}, {tmp, "two, longer", 0o644}} {
		if err := Write(p, tc.tmpDir, []byte(tc.data), tc.perm); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(p)
		fi, _ := os.Stat(p)
		if string(got) != tc.data || fi.Mode().Perm() != tc.perm {
			t.Errorf("got %q %v, want %q %v", got, fi.Mode().Perm(), tc.data, tc.perm)
		}
	}
	// No temporary file is left, in either directory.
	for _, d := range []string{dir, tmp} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.Name() != "f.json" {
				t.Errorf("left behind: %s", filepath.Join(d, e.Name()))
			}
		}
	}
	// A failure (the target is a directory) leaves the temporary file gone.
	if err := Write(tmp, dir, []byte("x"), 0o600); err == nil {
		t.Fatal("replacing a directory succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("a failed write left %d entries", len(ents))
	}
}
