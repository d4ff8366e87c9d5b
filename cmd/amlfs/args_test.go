package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestInterspersed(t *testing.T) {
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	for _, tc := range []struct{ in, want string }{
		{"amlfs mount /ws --store file:///s --id x", "amlfs mount --store file:///s --id x /ws"},
		{"amlfs mount --daemon /ws --no-lock", "amlfs mount --daemon --no-lock /ws"},
		{"amlfs --log-level debug status /ws --json", "amlfs --log-level debug status --json /ws"},
		{"amlfs revisions show REV --store file:///s --id x", "amlfs revisions show --store file:///s --id x REV"},
		{"amlfs mount /ws --id=x -o allow_other", "amlfs mount --id=x -o allow_other /ws"},
	} {
		got := strings.Join(interspersed(app, strings.Fields(tc.in)), " ")
		if got != tc.want {
			t.Errorf("%s\n got  %s\n want %s", tc.in, got, tc.want)
		}
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"amlfs", "mount", "--bogus-flag", "/ws"},
		{"amlfs", "mount"},
		{"amlfs", "status", "a", "b"},
		{"amlfs", "mount", "/ws", "--format", "zip"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, stderr %s", args, code, errb.String())
		}
	}
}

func TestProgressQuietOffTTY(t *testing.T) {
	if ttyProgress(&bytes.Buffer{}) != nil {
		t.Error("progress would draw into a non-terminal")
	}
}
