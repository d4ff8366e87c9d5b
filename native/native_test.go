package native

import (
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
			eachEvent(tc.buf, func(m *unix.FanotifyEventMetadata) { got = append(got, m.Fd) })
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
