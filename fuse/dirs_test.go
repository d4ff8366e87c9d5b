package fuse

import "testing"

// TestDirChanges: which directories a held save may take as it read them.
func TestDirChanges(t *testing.T) {
	for _, tc := range []struct {
		name  string
		run   func(c *dirChanges)
		clean []uint64 // vouched for
		dirty []uint64 // not
		none  bool     // nothing vouched for
	}{
		{"never marked", func(c *dirChanges) {}, nil, nil, true},
		{"marked, nothing since", func(c *dirChanges) { c.mark() }, []uint64{1, 2}, nil, false},
		{"a change", func(c *dirChanges) { c.mark(); c.touch(2) }, []uint64{1}, []uint64{2}, false},
		{"a change before the mark", func(c *dirChanges) { c.touch(2); c.mark() }, []uint64{1, 2}, nil, false},
		{"a change of a directory not known", func(c *dirChanges) { c.mark(); c.touch(0) }, nil, nil, true},
		{"a tool call on the tree", func(c *dirChanges) { c.mark(); c.lose() }, nil, nil, true},
		{"lost, then marked", func(c *dirChanges) { c.lose(); c.mark() }, []uint64{1}, nil, false},
		{"a writer open across the mark", func(c *dirChanges) { c.writers(3, 1); c.mark() }, []uint64{1}, []uint64{3}, false},
		{"a writer closed since the mark", func(c *dirChanges) { c.writers(3, 1); c.mark(); c.writers(3, -1) }, []uint64{1}, []uint64{3}, false},
		{"a writer closed before the mark", func(c *dirChanges) { c.writers(3, 1); c.writers(3, -1); c.mark() }, []uint64{1, 3}, nil, false},
		{"a writer of no known directory", func(c *dirChanges) { c.writers(0, 1); c.mark() }, nil, nil, true},
		{"it closed", func(c *dirChanges) { c.writers(0, 1); c.writers(0, -1); c.mark() }, []uint64{1}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c dirChanges
			tc.run(&c)
			clean := c.clean()
			if tc.none {
				if clean != nil {
					t.Fatal("directories vouched for")
				}
				return
			}
			if clean == nil {
				t.Fatal("nothing vouched for")
			}
			for _, d := range tc.clean {
				if !clean(d) {
					t.Errorf("%d not clean", d)
				}
			}
			for _, d := range tc.dirty {
				if clean(d) {
					t.Errorf("%d clean", d)
				}
			}
		})
	}
}
