package shown

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/format"

	"golang.org/x/sys/unix"
)

func TestShown(t *testing.T) {
	dir := t.TempDir()
	st := func(p string) *unix.Statx_t {
		t.Helper()
		var s unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, filepath.Join(dir, p), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &s); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	for _, p := range []string{"a", "b", "c"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, b, c := st("a"), st("b"), st("c")
	saved := format.Mtime(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC).UnixNano())
	entries := []format.TreeEntry{
		{Path: "a", Type: format.TypeFile, Stat: format.EntryStat{Ino: 7, Ctime: saved}},
		{Path: "b", Type: format.TypeFile, Stat: format.EntryStat{Ino: c.Ino, Ctime: saved}}, // shows c's own number
		{Path: "dup", Type: format.TypeFile, Stat: format.EntryStat{Ino: 7, Ctime: saved}},   // a's number again: dropped
		{Path: "big", Type: format.TypeFile, Stat: format.EntryStat{Ino: format.MaxShownIno + 1, Ctime: saved}},
	}
	s := New()
	s.Reset(entries)
	if entries[2].Stat.Ino != 0 || entries[3].Stat.Ino != 0 {
		t.Fatalf("a duplicate or out-of-range number was kept: %+v", entries)
	}
	s.Restored(a, entries[0])
	s.Restored(b, entries[1])

	wantCtime := unix.StatxTimestamp{Sec: int64(saved) / 1e9, Nsec: uint32(int64(saved) % 1e9)}
	if ino, ct := s.Show(a.Ino, birth(a), a.Ctime); ino != 7 || ct != wantCtime {
		t.Errorf("untouched a shows %d %v, want 7 %v", ino, ct, wantCtime)
	}
	if ino := s.DirIno(a.Ino); ino != 7 {
		t.Errorf("a lists as %d, want 7", ino)
	}
	// c is not restored, but b shows its number: c shows another one.
	cIno, ct := s.Show(c.Ino, birth(c), c.Ctime)
	if cIno == c.Ino || cIno == 7 || ct != c.Ctime || cIno != c.Ino^1<<32 {
		t.Errorf("c shows %d %v; its own number %d is b's", cIno, ct, c.Ino)
	}
	if s.DirIno(c.Ino) != cIno {
		t.Errorf("c lists as %d, shows as %d", s.DirIno(c.Ino), cIno)
	}
	if ino, ct := s.Saved(c.Ino, nsOf(c.Ctime)); ino != cIno || ct != nsOf(c.Ctime) {
		t.Errorf("c saves as %d %d", ino, ct)
	}
	if ino, ct := s.Saved(a.Ino, nsOf(a.Ctime)); ino != 7 || ct != int64(saved) {
		t.Errorf("untouched a saves as %d %d", ino, ct)
	}

	// A change moves the real ctime: it shows from then on, the number stays.
	time.Sleep(10 * time.Millisecond)
	if err := os.Chmod(filepath.Join(dir, "a"), 0o600); err != nil {
		t.Fatal(err)
	}
	a2 := st("a")
	if ino, ct := s.Show(a2.Ino, birth(a2), a2.Ctime); ino != 7 || ct != a2.Ctime {
		t.Errorf("changed a shows %d %v, want 7 and its real ctime %v", ino, ct, a2.Ctime)
	}
	if ino, ct := s.Saved(a2.Ino, nsOf(a2.Ctime)); ino != 7 || ct != nsOf(a2.Ctime) {
		t.Errorf("changed a saves as %d %d", ino, ct)
	}
	// Fetching bytes in place is not a change.
	bOld := nsOf(b.Ctime)
	s.Filled(b.Ino, bOld+5)
	if ino, ct := s.Show(b.Ino, birth(b), unix.StatxTimestamp{Sec: (bOld + 5) / 1e9, Nsec: uint32((bOld + 5) % 1e9)}); ino != c.Ino || ct != wantCtime {
		t.Errorf("filled b shows %d %v", ino, ct)
	}
	// Another inode born under a's number is not a.
	if ino, _ := s.Show(a.Ino, birth(a)+1, a.Ctime); ino == 7 {
		t.Errorf("a new inode with a's backing number shows a's saved number")
	}
	if ino := s.DirIno(a.Ino); ino == 7 {
		t.Errorf("a's record outlived its inode")
	}
}

// TestShownUnique: however restored numbers and new files' backing numbers
// fall, no two inodes show one number.
func TestShownUnique(t *testing.T) {
	s := New()
	var entries []format.TreeEntry
	for i := range 64 {
		// Saved numbers that collide with backing numbers 1..64 and
		// with their first remaps.
		ino := uint64(i/2 + 1)
		if i%2 == 1 {
			ino ^= 1 << 32
		}
		entries = append(entries, format.TreeEntry{Path: fmt.Sprint(i), Type: format.TypeFile, Stat: format.EntryStat{Ino: ino, Ctime: 1}})
	}
	s.Reset(entries)
	seen := map[uint64]string{}
	for i, e := range entries {
		// Restored files have backing numbers 1000+.
		st := &unix.Statx_t{Ino: uint64(1000 + i), Mask: unix.STATX_BTIME}
		s.Restored(st, e)
		ino, _ := s.Show(st.Ino, birth(st), st.Ctime)
		if o, dup := seen[ino]; dup {
			t.Fatalf("restored %d shows %d, as %s does", i, ino, o)
		}
		seen[ino] = e.Path
	}
	for raw := uint64(1); raw <= 200; raw++ {
		ino, _ := s.Show(raw, 1, unix.StatxTimestamp{})
		if o, dup := seen[ino]; dup {
			t.Fatalf("new file with backing number %d shows %d, as %s does", raw, ino, o)
		}
		seen[ino] = fmt.Sprint("new ", raw)
	}
}
