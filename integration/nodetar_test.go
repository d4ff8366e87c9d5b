package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/amlfs/amlfs/revision/format"
)

// nodeTar installs node-tar at the version AML pins, once, into the tool
// cache, and returns the directory to run scripts in.
func nodeTar(t *testing.T) string {
	t.Helper()
	needTools(t, "nodejs npm", "node", "npm")
	home, _ := os.UserHomeDir()
	dir := filepath.Join(home, ".cache", "amlfs-tools", "node-tar-7.5.22")
	if !fileExists(filepath.Join(dir, "node_modules", "tar", "package.json")) {
		must(t, os.MkdirAll(dir, 0o755))
		install := exec.Command("npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", dir, "tar@7.5.22")
		install.Env = append(os.Environ(), "AWS_CA_BUNDLE=")
		if out, err := install.CombinedOutput(); err != nil {
			t.Fatalf("npm install tar@7.5.22: %v\n%s", err, out)
		}
	}
	script, err := os.ReadFile(filepath.Join("testdata", "nodetar-read.mjs"))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, "read.mjs"), script, 0o644))
	return dir
}

// TestArchiveReadByNodeTar: an archive revision amlfs writes (composable:
// gzip members of whole tar entries, and amlfs's index in the extra
// fields of empty members at its end), and the next one it composes from
// it, are read by node-tar 7.5.22 with AML's options, list then extract,
// byte for byte, with no entry AML's reader refuses; and the index is
// found from its end.
func TestArchiveReadByNodeTar(t *testing.T) {
	dir := nodeTar(t)
	e := newEnv(t)
	mp := e.mount("nodetar", "--format", "archive")
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string][]byte{}
	for i := range 200 {
		// Text-like bytes: compressible, but within AML's ratio of 100.
		b := make([]byte, rng.IntN(8<<10))
		for j := range b {
			b[j] = 'a' + byte(rng.IntN(26))
		}
		want[fmt.Sprintf("src/d%d/f%03d.txt", i%7, i)] = b
	}
	big := make([]byte, 3<<20)
	for j := range big {
		big[j] = byte(rng.IntN(256))
	}
	want["big.bin"] = big
	want["empty"] = nil
	for p, b := range want {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(mp, p)), 0o755))
		must(t, os.WriteFile(filepath.Join(mp, p), b, 0o644))
	}
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	// The next save composes: one file changed, a symlink added (kept in
	// the index only).
	want["src/d5/f005.txt"] = []byte("changed since the first save")
	must(t, os.WriteFile(filepath.Join(mp, "src/d5/f005.txt"), want["src/d5/f005.txt"], 0o644))
	must(t, os.Symlink("big.bin", filepath.Join(mp, "link")))
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	e.unmount(mp)
	idx, err := format.ParseIndex(mustRead(t, filepath.Join(e.storeD, "nodetar", "workspace.json")))
	must(t, err)
	cur, ok := idx.Find(idx.Current)
	if !ok {
		t.Fatalf("index: %+v", idx)
	}
	archive := filepath.Join(e.storeD, "nodetar", cur.Path)
	out := t.TempDir()
	cmd := exec.Command("node", filepath.Join(dir, "read.mjs"), archive, out)
	cmd.Dir = dir
	listed, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node-tar: %v\n%s", err, stderr)
	}
	var entries []struct{ Path, Type string }
	must(t, json.Unmarshal(listed, &entries))
	files := 0
	for _, en := range entries {
		switch en.Type {
		case "File":
			files++
		case "Directory":
		default: // AML's reader throws on anything else
			t.Errorf("node-tar listed %s of type %s", en.Path, en.Type)
		}
	}
	if files != len(want) {
		t.Errorf("node-tar listed %d files, want %d", files, len(want))
	}
	for p, b := range want {
		got, err := os.ReadFile(filepath.Join(out, p))
		if err != nil || string(got) != string(b) {
			t.Errorf("%s as node-tar extracted it: %d bytes, %v", p, len(got), err)
		}
	}
	data := mustRead(t, archive)
	off, n, err := format.IndexRange(data[len(data)-format.TailBytes:], int64(len(data)))
	must(t, err)
	x, err := format.ParseIndexMember(data[off:off+n], int64(len(data)), format.DefaultLimits)
	must(t, err)
	if len(x.Entries) < len(want) || len(x.Symlinks) != 1 || x.Symlinks[0].Target != "big.bin" {
		t.Errorf("the index names %d entries, symlinks %+v", len(x.Entries), x.Symlinks)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	must(t, err)
	return b
}
