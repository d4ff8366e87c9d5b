package format

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/amlfs/amlfs/amlerr"
)

// composeSample writes a composable archive of small files, a large one,
// directories and a symlink.
func composeSample(t testing.TB) ([]byte, *ArchiveIndex, map[string]string) {
	var buf bytes.Buffer
	c, err := NewComposeWriter(&buf, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Dir(TreeEntry{Path: "d", Mode: 0o755}))
	for i := range 40 {
		p := fmt.Sprintf("d/f%02d.txt", i)
		files[p] = strings.Repeat(fmt.Sprint(i), 1000*(i%7)+1)
		must(c.File(TreeEntry{Path: p, Mode: 0o644, Size: int64(len(files[p])), Mtime: 1796418000123456789}, strings.NewReader(files[p])))
	}
	big := strings.Repeat("large file, a member of its own. ", MemberTarget/16)
	files["big.bin"] = big
	must(c.File(TreeEntry{Path: "big.bin", Mode: 0o600, Size: int64(len(big))}, strings.NewReader(big)))
	files["after.txt"] = "after the large one"
	must(c.File(TreeEntry{Path: "after.txt", Mode: 0o644, Size: int64(len(files["after.txt"]))}, strings.NewReader(files["after.txt"])))
	must(c.Symlink(TreeEntry{Path: "link", Target: "d/f01.txt", Mode: 0o777}))
	n, x, err := c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("Close says %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes(), x, files
}

// TestComposeRoundTrip: a composable archive reads as any archive, its
// index is found from its last bytes, and each file reads alone from its
// member.
func TestComposeRoundTrip(t *testing.T) {
	data, wrote, files := composeSample(t)
	// An ordinary reader: every file, the directories, no symlink.
	got := map[string]string{}
	entries, err := ReadArchive(bytes.NewReader(data), "x.tar.gz", DefaultLimits, func(e TreeEntry, r io.Reader) error {
		if r != nil {
			b, _ := io.ReadAll(r)
			got[e.Path] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(files)+1 || len(got) != len(files) {
		t.Fatalf("%d entries, %d files", len(entries), len(got))
	}
	for p, want := range files {
		if got[p] != want {
			t.Errorf("%s differs", p)
		}
	}
	// The index from the tail alone.
	off, n, err := IndexRange(data[len(data)-TailBytes:], int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	x, err := ParseIndexMember(data[off:off+n], int64(len(data)), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Entries) != len(wrote.Entries) || len(x.Symlinks) != 1 || x.Symlinks[0].Target != "d/f01.txt" {
		t.Fatalf("index read back: %d entries, symlinks %+v", len(x.Entries), x.Symlinks)
	}
	members := map[int64]bool{}
	for _, e := range x.Entries {
		members[e.Member] = true
		if e.Type != TypeFile {
			continue
		}
		r, err := OpenEntry(bytes.NewReader(data), e)
		if err != nil {
			t.Fatalf("%s: %v", e.Path, err)
		}
		b, _ := io.ReadAll(r)
		if string(b) != files[e.Path] {
			t.Errorf("%s read alone differs", e.Path)
		}
		if e.Path == "d/f00.txt" && e.Mtime != 1796418000123456789 {
			t.Errorf("nanosecond mtime lost: %v", e.Mtime)
		}
	}
	if len(members) < 3 {
		t.Errorf("%d members: small files were not batched apart from the large one", len(members))
	}
	// GNU tar reads it too.
	if _, err := exec.LookPath("tar"); err == nil {
		f := t.TempDir() + "/x.tar.gz"
		os.WriteFile(f, data, 0o644)
		out, err := exec.Command("tar", "-tzf", f).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "./big.bin") || !strings.Contains(string(out), "./d/f39.txt") {
			t.Errorf("tar -t: %v\n%.300s", err, out)
		}
	}
}

// TestComposeHostileIndex: an index that lies gives an error, never
// another file's bytes.
func TestComposeHostileIndex(t *testing.T) {
	data, x, _ := composeSample(t)
	var f1, f2 ArchiveEntry
	for _, e := range x.Entries {
		switch e.Path {
		case "d/f01.txt":
			f1 = e
		case "d/f02.txt":
			f2 = e
		}
	}
	for name, e := range map[string]ArchiveEntry{
		"offset of another file": func() ArchiveEntry { e := f1; e.Data = f2.Data; return e }(),
		"wrong size":             func() ArchiveEntry { e := f1; e.Size++; return e }(),
		"wrong member":           func() ArchiveEntry { e := f1; e.Member++; return e }(),
		"renamed":                func() ArchiveEntry { e := f2; e.Path = "d/f01.txt"; return e }(),
	} {
		r, err := OpenEntry(bytes.NewReader(data), e)
		if err == nil {
			b, _ := io.ReadAll(r)
			t.Errorf("%s: read %q", name, b)
		} else if amlerr.Code(err) != amlerr.InvalidStore {
			t.Errorf("%s: %v", name, err)
		}
	}
	spoil := func(f func(*ArchiveIndex)) error {
		y := *x
		y.Entries = append([]ArchiveEntry(nil), x.Entries...)
		f(&y)
		var buf bytes.Buffer
		at := x.End + x.EndLen
		if err := WriteIndexMember(&buf, &y, at); err != nil {
			return err
		}
		whole := append(data[:at:at], buf.Bytes()...)
		off, n, err := IndexRange(whole[len(whole)-TailBytes:], int64(len(whole)))
		if err != nil {
			return err
		}
		_, err = ParseIndexMember(whole[off:off+n], int64(len(whole)), DefaultLimits)
		return err
	}
	for name, f := range map[string]func(*ArchiveIndex){
		"member past the end": func(y *ArchiveIndex) { y.Entries[3].MemberLen = y.End },
		"overlapping members": func(y *ArchiveIndex) {
			last := len(y.Entries) - 1
			y.Entries[last].Member = y.Entries[1].Member + 1
		},
		"traversal":     func(y *ArchiveIndex) { y.Entries[2].Path = "../x" },
		"version 2":     func(y *ArchiveIndex) { y.Version = 2 },
		"end moved":     func(y *ArchiveIndex) { y.End-- },
		"symlink entry": func(y *ArchiveIndex) { y.Entries[2].Type = TypeSymlink },
	} {
		if err := spoil(f); amlerr.Code(err) != amlerr.InvalidStore {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := spoil(func(*ArchiveIndex) {}); err != nil {
		t.Errorf("an unspoiled index: %v", err)
	}
}

func FuzzArchiveIndex(f *testing.F) {
	data, x, _ := composeSample(f)
	off, n, _ := IndexRange(data[len(data)-TailBytes:], int64(len(data)))
	f.Add(data[off:off+n], int64(len(data)))
	var buf bytes.Buffer
	WriteIndexMember(&buf, &ArchiveIndex{Version: 1, End: 0, EndLen: 10}, 10)
	f.Add(buf.Bytes()[:buf.Len()-TailBytes], int64(buf.Len()+10))
	_ = x
	f.Fuzz(func(t *testing.T, member []byte, size int64) {
		if size < int64(len(member)) {
			return
		}
		if _, _, err := IndexRange(member, size); err != nil && amlerr.Code(err) == "" {
			t.Fatalf("IndexRange without a code: %v", err)
		}
		y, err := ParseIndexMember(member, size, Limits{Entries: 1000, ExtractedBytes: 1 << 30, ArchiveBytes: 1 << 30})
		if err != nil {
			if amlerr.Code(err) == "" {
				t.Fatalf("rejection without a code: %v", err)
			}
			return
		}
		for _, e := range y.Entries {
			if e.Member < 0 || e.Member+e.MemberLen > y.End || ValidPath(e.Path) != nil {
				t.Fatalf("accepted %+v", e)
			}
		}
	})
}

// rangeCopier is a Copier over archives held in memory.
type rangeCopier struct {
	bytes.Buffer
	objects map[string][]byte
}

func (c *rangeCopier) CopyRange(key string, off, n int64) error {
	src, ok := c.objects[key]
	if !ok || off+n > int64(len(src)) {
		return fmt.Errorf("no range [%d, +%d) of %q", off, n, key)
	}
	c.Write(src[off : off+n])
	return nil
}

// TestComposeReuse: an archive made of an earlier one's members (by
// range), a changed file, and the unchanged files of that file's member
// rewritten, reads as the tree it should be, and its own index holds.
func TestComposeReuse(t *testing.T) {
	data, x, files := composeSample(t)
	out := &rangeCopier{objects: map[string][]byte{"a": data}}
	c, err := NewComposeWriter(out, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	const changed = "d/f05.txt"
	files[changed] = "changed"
	var dirs []TreeEntry
	var touched *Member
	var run []ArchiveEntry
	var runOff, runEnd int64
	flush := func() {
		if len(run) > 0 {
			if err := c.Reuse("a", runOff, runEnd-runOff, run); err != nil {
				t.Fatal(err)
			}
		}
		run = nil
	}
	for _, m := range x.Members() {
		if m.Entries[0].Type == TypeDir {
			for _, e := range m.Entries {
				dirs = append(dirs, e.TreeEntry)
			}
			continue
		}
		hit := false
		for _, e := range m.Entries {
			hit = hit || e.Path == changed
		}
		if hit {
			touched = &m
			continue
		}
		if len(run) == 0 || runEnd != m.Off {
			flush()
			runOff = m.Off
		}
		run = append(run, m.Entries...)
		runEnd = m.Off + m.Len
	}
	flush()
	if touched == nil || len(touched.Entries) < 2 {
		t.Fatalf("the changed file's member: %+v", touched)
	}
	// Its siblings, from the old member; then the changed file.
	err = MemberEntries(bytes.NewReader(data[touched.Off:touched.Off+touched.Len]), touched.Entries, func(e ArchiveEntry, r io.Reader) error {
		if e.Path == changed {
			return nil
		}
		return c.File(e.TreeEntry, r)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.File(TreeEntry{Path: changed, Mode: 0o644, Size: 7}, strings.NewReader("changed")); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if err := c.Dir(d); err != nil {
			t.Fatal(err)
		}
	}
	c.Symlink(x.Symlinks[0])
	n, y, err := c.Close()
	if err != nil {
		t.Fatal(err)
	}
	got := out.Bytes()
	if n != int64(len(got)) {
		t.Fatalf("Close says %d, wrote %d", n, len(got))
	}
	read := map[string]string{}
	if _, err := ReadArchive(bytes.NewReader(got), "b.tar.gz", DefaultLimits, func(e TreeEntry, r io.Reader) error {
		if r != nil {
			b, _ := io.ReadAll(r)
			read[e.Path] = string(b)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	off, k, err := IndexRange(got[len(got)-TailBytes:], int64(len(got)))
	if err != nil {
		t.Fatal(err)
	}
	z, err := ParseIndexMember(got[off:off+k], int64(len(got)), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if len(z.Entries) != len(y.Entries) || len(z.Entries) != len(x.Entries) {
		t.Fatalf("%d entries, wrote %d, had %d", len(z.Entries), len(y.Entries), len(x.Entries))
	}
	for _, e := range z.Entries {
		if e.Type != TypeFile {
			continue
		}
		r, err := OpenEntry(bytes.NewReader(got), e)
		if err != nil {
			t.Fatalf("%s: %v", e.Path, err)
		}
		b, _ := io.ReadAll(r)
		if string(b) != files[e.Path] || read[e.Path] != files[e.Path] {
			t.Errorf("%s differs", e.Path)
		}
	}
	if len(read) != len(files) {
		t.Errorf("%d files read, want %d", len(read), len(files))
	}
}

// TestIndexJSONAsEncodingJSON: the hand-written index encoding is
// encoding/json's, byte for byte, whatever the names hold.
func TestIndexJSONAsEncodingJSON(t *testing.T) {
	names := []string{"a.txt", "dir/b", "x<y>&z", "quote\"d", "back\\slash", "tab\there", "é", "\u2028", "bad\xffutf8", "del\x7f", ""}
	for _, x := range []*ArchiveIndex{
		{Version: 1},
		{Version: 1, Entries: []ArchiveEntry{}},
		{Version: 1, End: 10, EndLen: 20, Fork: &ForkOrigin{}, Symlinks: []TreeEntry{{Path: "l", Type: TypeSymlink, Target: "t<", Mode: 0o777}}},
	} {
		want, _ := json.Marshal(x)
		if got, err := x.appendJSON(nil); err != nil || string(got) != string(want) {
			t.Errorf("got  %s (%v)\nwant %s", got, err, want)
		}
	}
	x := &ArchiveIndex{Version: 1, End: 1 << 40, EndLen: 31}
	for i, n := range names {
		e := ArchiveEntry{TreeEntry: TreeEntry{Path: n, Type: TypeFile, Mode: uint32(i * 73), Size: int64(i) << 20, Target: names[(i+3)%len(names)]},
			Member: int64(i) * 1000, MemberLen: int64(i), Data: int64(i * 512)}
		if i%2 == 0 {
			e.Mtime = Mtime(int64(i)*1e9 - 7)
			e.Stat = EntryStat{Ctime: Mtime(i * 3), Ino: uint64(i), Uid: 1000, Gid: uint32(i)}
		}
		x.Entries = append(x.Entries, e)
	}
	want, _ := json.Marshal(x)
	got, err := x.appendJSON(nil)
	if err != nil || string(got) != string(want) {
		t.Fatalf("got  %s (%v)\nwant %s", got, err, want)
	}
}
