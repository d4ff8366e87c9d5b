package native

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestSharedWritable(t *testing.T) {
	dev := unix.Mkdev(0xfd, 0x01)
	for _, c := range []struct {
		line string
		ino  uint64
		ok   bool
	}{
		{"7f0000-7f1000 rw-s 00000000 fd:01 1234 /w/db", 1234, true},
		{"7f0000-7f1000 rw-s 00000000 fd:01 1234 /w/a name with spaces", 1234, true},
		{"7f0000-7f1000 rw-p 00000000 fd:01 1234 /w/db", 0, false}, // private: a copy
		{"7f0000-7f1000 r--s 00000000 fd:01 1234 /w/db", 0, false}, // read-only
		{"7f0000-7f1000 rw-s 00000000 fd:02 1234 /other", 0, false},
		{"7f0000-7f1000 rw-s 00000000 00:00 0 ", 0, false}, // anonymous
		{"7ffd-7ffe rw-p 0 00:00 0 [stack]", 0, false},
		{"garbage", 0, false},
		{"a b c zz:01 5", 0, false},
	} {
		ino, ok := sharedWritable(c.line, dev)
		if ino != c.ino || ok != c.ok {
			t.Errorf("%q: %d %v, want %d %v", c.line, ino, ok, c.ino, c.ok)
		}
	}
}

func TestWritableFlags(t *testing.T) {
	for _, c := range []struct {
		info string
		want bool
	}{
		{"pos:\t0\nflags:\t0100002\nmnt_id:\t30\nino:\t5\n", true}, // O_RDWR|O_LARGEFILE
		{"pos:\t0\nflags:\t0100001\nmnt_id:\t30\n", true},          // O_WRONLY
		{"pos:\t0\nflags:\t0100000\nmnt_id:\t30\n", false},         // O_RDONLY
		{"pos:\t0\nmnt_id:\t30\n", false},
		{"flags:\tzz\n", false},
	} {
		if got := writableFlags([]byte(c.info)); got != c.want {
			t.Errorf("%q: %v", c.info, got)
		}
	}
}
