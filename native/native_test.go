package native

import (
	"encoding/binary"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func event(fd int32, pid int32, extra int) []byte {
	m := unix.FanotifyEventMetadata{Event_len: uint32(metaLen + extra), Vers: unix.FANOTIFY_METADATA_VERSION, Metadata_len: uint16(metaLen), Fd: fd, Pid: pid}
	b := make([]byte, metaLen+extra)
	copy(b, (*[1 << 10]byte)(unsafe.Pointer(&m))[:metaLen])
	return b
}

func TestEachEvent(t *testing.T) {
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	bad := event(9, 1, 0)
	bad[0], bad[1], bad[2], bad[3] = 4, 0, 0, 0 // Event_len shorter than the metadata
	for _, tc := range []struct {
		name string
		buf  []byte
		fds  []int32
	}{
		{"none", nil, nil},
		{"one", event(5, 1, 0), []int32{5}},
		{"with info records", cat(event(5, 1, 24), event(6, 2, 0)), []int32{5, 6}},
		{"a truncated tail is left", cat(event(5, 1, 0), event(6, 2, 0)[:metaLen-1]), []int32{5}},
		{"a bad length stops the batch", cat(event(5, 1, 0), bad, event(7, 3, 0)), []int32{5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int32
			eachEvent(tc.buf, func(m *unix.FanotifyEventMetadata, info []byte) {
				got = append(got, m.Fd)
				if len(info) != int(m.Event_len)-metaLen {
					t.Errorf("event %d: %d bytes of information records, want %d", m.Fd, len(info), int(m.Event_len)-metaLen)
				}
			})
			if len(got) != len(tc.fds) {
				t.Fatalf("events %v, want %v", got, tc.fds)
			}
			for i := range got {
				if got[i] != tc.fds[i] {
					t.Fatalf("events %v, want %v", got, tc.fds)
				}
			}
		})
	}
}

func TestContainsArg(t *testing.T) {
	for _, tc := range []struct {
		cmdline string
		want    bool
	}{
		{"/usr/bin/amlfs\x00" + KeeperArg + "\x00/mnt\x0044\x00", true},
		{"/usr/bin/amlfs\x00mount\x00/mnt\x00", false},
		{"/usr/bin/amlfs\x00" + KeeperArg + "x\x00", false},
		{"", false},
	} {
		if got := containsArg([]byte(tc.cmdline), KeeperArg); got != tc.want {
			t.Errorf("containsArg(%q) = %v, want %v", tc.cmdline, got, tc.want)
		}
	}
}

// fidRecord is a FID information record of type typ for a handle.
func fidRecord(typ byte, htype int32, handle []byte) []byte {
	n := 4 + 8 + 8 + len(handle)
	b := make([]byte, n)
	b[0] = typ
	binary.NativeEndian.PutUint16(b[2:], uint16(n))
	binary.NativeEndian.PutUint32(b[12:], uint32(len(handle)))
	binary.NativeEndian.PutUint32(b[16:], uint32(htype))
	copy(b[20:], handle)
	return b
}

func TestDirHandle(t *testing.T) {
	dir, child := []byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{9, 9, 9, 9}
	short := fidRecord(unix.FAN_EVENT_INFO_TYPE_DFID, 1, dir)
	binary.NativeEndian.PutUint32(short[12:], 200) // handle_bytes past the record
	for _, tc := range []struct {
		name string
		info []byte
		want []byte // nil: none
	}{
		{"none", nil, nil},
		{"the directory's, before the child's", append(fidRecord(unix.FAN_EVENT_INFO_TYPE_DFID, 1, dir), fidRecord(unix.FAN_EVENT_INFO_TYPE_FID, 1, child)...), dir},
		{"the directory's, after the child's", append(fidRecord(unix.FAN_EVENT_INFO_TYPE_FID, 1, child), fidRecord(unix.FAN_EVENT_INFO_TYPE_DFID, 1, dir)...), dir},
		{"only an object's: the directory itself", fidRecord(unix.FAN_EVENT_INFO_TYPE_FID, 1, dir), dir},
		{"a handle past its record", short, nil},
		{"a record past the buffer", fidRecord(unix.FAN_EVENT_INFO_TYPE_DFID, 1, dir)[:10], nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			htype, h, ok := dirHandle(tc.info)
			if ok != (tc.want != nil) || string(h) != string(tc.want) || (ok && htype != 1) {
				t.Errorf("dirHandle = %d %v %v, want %v", htype, h, ok, tc.want)
			}
		})
	}
}

// TestCleanKnowsChangedDirectories: after a Mark, Clean vouches for every
// directory marked then that no other process changed anything in since
// (the daemon's own changes are fills, or tool calls, which Touch), and
// for no directory made after it; a Mark starts over.
func TestCleanKnowsChangedDirectories(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fanotify needs CAP_SYS_ADMIN")
	}
	dir := t.TempDir()
	for _, d := range []string{"a", "b", "c/d", "e"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(Options{Dir: dir, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Skipf("fanotify: %v", err)
	}
	defer s.Close()
	s.wg.Add(1)
	go s.serveNotify()
	s.Mark()
	ino := func(rel string) uint64 {
		fi, err := os.Stat(filepath.Join(dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	sh := func(script string) {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", script, err, out)
		}
	}
	check := func(when string, want map[string]bool) {
		t.Helper()
		clean := s.Clean()
		if clean == nil {
			t.Fatalf("%s: changes not known", when)
		}
		for rel, w := range want {
			if got := clean(ino(rel)); got != w {
				t.Errorf("%s: %s clean = %v, want %v", when, rel, got, w)
			}
		}
	}
	check("nothing changed", map[string]bool{".": true, "a": true, "b": true, "c": true, "c/d": true, "e": true})
	sh("echo x > a/f; touch c/d/g; mkdir new")
	os.WriteFile(filepath.Join(dir, "e", "own"), []byte("the daemon's own"), 0o644)
	check("changed", map[string]bool{".": false, "a": false, "b": true, "c": true, "c/d": false, "e": true, "new": false})
	sh("echo y > a/f2; echo z >> b/../b/h")
	check("changed again", map[string]bool{"a": false, "b": false, "c": true})
	if n := s.Changes(); n == 0 {
		t.Errorf("no change counted")
	}
	s.Mark()
	check("after a Mark", map[string]bool{".": true, "a": true, "b": true, "new": true})
	// The directory itself (its parent's listing states it again).
	sh("chmod 700 c/d")
	check("a subdirectory's mode", map[string]bool{"c/d": false, "a": true})
	sh("mv c/d c/d2")
	check("a subdirectory moved", map[string]bool{"c": false, "a": true})
	// A tool call: which directories it changed is not known.
	s.Touch()
	if s.Clean() != nil {
		t.Errorf("after Touch, directories are vouched for")
	}
	s.Mark()
	check("after a Mark again", map[string]bool{".": true, "c": true})
}
