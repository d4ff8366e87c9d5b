package storetest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// testHostileKeys: names that leave the artifact are refused, and nothing
// lands outside the store.
func testHostileKeys(t *testing.T, b Base) {
	s := open(t, b, "w")
	st, err := s.Stage(ctx, "revisions/r1/")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Abort(ctx)
	for _, name := range []string{"../escape", "files/../../escape", "/abs", "files/a\x00b", "", "files//a", "./files/a", "files/./a"} {
		if err := st.Put(ctx, name, bytes.NewReader([]byte("x")), 1); err == nil {
			t.Errorf("put %q accepted", name)
		}
	}
	for _, key := range []string{"../../escape", "revisions/../../escape", "/etc/passwd", "revisions/r1/../../../x"} {
		if data, err := read(t, s, key); err == nil {
			t.Errorf("read %q: %q", key, data)
		}
	}
	if b.Root != "" {
		for _, p := range []string{"escape", "../escape", "abs"} {
			if _, err := os.Lstat(filepath.Join(b.Root, p)); err == nil {
				t.Errorf("%s was written", p)
			}
		}
	}
}

// testHostileIDs: any id maps to one segment of its own: no id reaches
// another's root or the base's parent.
func testHostileIDs(t *testing.T, b Base) {
	ids := []string{"a", "a/b", "a b", ".", "..", "..x", "é", "a%2Fb", "A", "a\x00"}
	for i, id := range ids {
		s := open(t, b, id)
		if _, err := s.PublishIndex(ctx, []byte(fmt.Sprint(i)), ""); err != nil {
			t.Fatalf("%q: %v", id, err)
		}
	}
	for i, id := range ids {
		data, _, err := open(t, b, id).ReadIndex(ctx)
		if err != nil || string(data) != fmt.Sprint(i) {
			t.Errorf("%q reads %q, %v", id, data, err)
		}
	}
	for _, id := range []string{"", " a", "a\n", "\xff"} {
		if _, err := b.Open(id); err == nil {
			t.Errorf("id %q accepted", id)
		}
	}
}
