package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/amlfs/amlfs/revision/format"
)

// checkAMLStore verifies a workspace root against AML's published format
// and returns its index.
func checkAMLStore(t *testing.T, root string) *format.Index {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "workspace.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^\{"current":"[^"]+","revisions":\[(\{"createdAt":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z","format":"(folder|archive)","id":"[^"]+","path":"revisions/[^"]+"\},?)+\],"version":1\}$`).Match(data) {
		t.Errorf("workspace.json is not in AML's layout: %s", data)
	}
	idx, err := format.ParseIndex(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range idx.Revisions {
		if e.Format != format.FormatFolder {
			continue
		}
		mdata, err := os.ReadFile(filepath.Join(root, e.Path, "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		m, err := format.ParseManifest(e.Path, mdata, format.DefaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		sorted := append([]format.TreeEntry(nil), m.Entries...)
		format.SortEntries(sorted)
		if !reflect.DeepEqual(sorted, m.Entries) {
			t.Errorf("manifest of %s is not ordered by depth, then name", e.ID)
		}
		files := 0
		for _, te := range m.Entries {
			if te.Type != format.TypeFile {
				continue
			}
			files++
			fi, err := os.Stat(filepath.Join(root, e.Path, "files", te.Path))
			if err != nil || fi.Size() != te.Size {
				t.Errorf("files/%s: %v (size %d, manifest %d)", te.Path, err, fi.Size(), te.Size)
			}
		}
		// files/ holds exactly the manifest's files.
		n := 0
		filepath.Walk(filepath.Join(root, e.Path, "files"), func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				n++
			}
			return nil
		})
		if n != files {
			t.Errorf("files/ holds %d files, manifest %d", n, files)
		}
		checkAMLManifest(t, e.Path, mdata)
	}
	return idx
}

// checkAMLManifest holds a manifest to AML's parser: version 1, and
// entries of type file or directory only, each with mode, path, size and
// type. Any other key (amlfs's "amlfs" extension, "mtime" on entries) is
// one AML ignores.
func checkAMLManifest(t *testing.T, what string, data []byte) {
	t.Helper()
	var raw struct {
		Entries []map[string]any `json:"entries"`
		Version any              `json:"version"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if raw.Version != float64(1) {
		t.Errorf("%s: version %v", what, raw.Version)
	}
	for _, e := range raw.Entries {
		if e["type"] != "file" && e["type"] != "directory" {
			t.Errorf("%s: AML's parser refuses entry %v", what, e)
		}
		for _, k := range []string{"mode", "path", "size", "type"} {
			if _, ok := e[k]; !ok {
				t.Errorf("%s: entry %v lacks %s", what, e, k)
			}
		}
	}
}

func TestRoundTrip(t *testing.T) { forEachStore(t, testRoundTrip) }

func testRoundTrip(t *testing.T, newEnv func(*testing.T) *env) {
	for _, format := range []string{"folder", "archive"} {
		t.Run(format, func(t *testing.T) {
			e := newEnv(t)
			mp := e.mount("rt", "--format", format)
			// 100 MB through the folder format; the archive format gzips
			// everything, so 20 MB keeps it quick under -race.
			big := map[string]string{"folder": "100000000", "archive": "20000000"}[format]
			sh(t, mp, "BIG="+big+"\n"+`
mkdir -p src/pkg/deep/er empty build/obj
printf 'package main\n' > src/main.go
printf '#!/bin/sh\necho hi\n' > run.sh && chmod 755 run.sh
chmod 700 src/pkg
printf 'secret' > src/pkg/deep/er/f.txt && chmod 600 src/pkg/deep/er/f.txt
printf 'build/\n' > .gitignore
head -c 1000000 /dev/urandom > build/obj/junk.o
head -c $BIG /dev/urandom > big.bin
`)
			want := treeDigest(t, mp, func(rel string) bool { return rel == "build" })
			if r := e.unmount(mp); r.code != 0 {
				t.Fatalf("unmount: %s", r)
			}
			if isMounted(mp) {
				t.Fatal("still mounted after unmount")
			}
			idx := checkAMLStore(t, filepath.Join(e.storeD, "rt"))
			if len(idx.Revisions) != 1 || idx.Revisions[0].Format != format {
				t.Fatalf("index: %+v", idx)
			}
			if format == "folder" {
				if _, err := os.Stat(filepath.Join(e.storeD, "rt", idx.Revisions[0].Path, "files", "build")); !os.IsNotExist(err) {
					t.Errorf("ignored build/ was saved: %v", err)
				}
			}
			// The lock is released.
			if e.lockExists("rt") {
				t.Error("lock left behind")
			}
			mp2 := e.mount("rt")
			got := treeDigest(t, mp2, nil)
			if d := diffDigests(want, got); len(d) > 0 {
				t.Errorf("remounted tree differs:\n%s", strings.Join(d, "\n"))
			}
			if _, err := os.Stat(filepath.Join(mp2, "build")); !os.IsNotExist(err) {
				t.Errorf("build/ came back: %v", err)
			}
			r := e.amlfs(append([]string{"revisions", "list", "--json"}, e.storeFlags("rt")...)...)
			if r.code != 0 || !strings.Contains(r.stdout, idx.Current) || !strings.Contains(r.stdout, `"bytes": `+big[:3]) {
				t.Errorf("revisions list: %s", r)
			}
		})
	}
}

// An unchanged workspace is not saved again: the revision stays current.
func TestUnchangedUnmountKeepsRevision(t *testing.T) {
	e := newEnv(t)
	mp := e.mount("same")
	sh(t, mp, "echo a > a")
	r := e.unmount(mp)
	first := strings.TrimSpace(r.stdout)
	mp = e.mount("same")
	sh(t, mp, "cat a >/dev/null; ls -la >/dev/null")
	r = e.unmount(mp)
	if strings.TrimSpace(r.stdout) != first {
		t.Errorf("unchanged remount saved %q, want %q kept", r.stdout, first)
	}
	idx := checkAMLStore(t, filepath.Join(e.storeD, "same"))
	if idx.Current != first {
		t.Errorf("current = %s", idx.Current)
	}
}
