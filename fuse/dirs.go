package fuse

import "sync"

// Changed directories. Every change through the mount is a request the
// daemon serves, so it knows the directory each one is in: a held save
// (revision Options.Freeze) reads again only those changed since the last
// Mark, instead of every directory. A handle open for writing can write
// with no request (passthrough, a shared mapping's pages written back
// later), so its directory counts as changed while it is open, and until
// the next Mark after. A change made on the working directory itself (a
// tool call on the tree, Hold) is not known by directory: until the next
// Mark, every directory counts as changed.
type dirChanges struct {
	mu      sync.Mutex
	known   bool            // a Mark began the interval, and nothing was lost since
	changed map[uint64]bool // directories by backing inode
	writing map[uint64]int  // directories with handles open for writing, by count
}

// mark begins an interval: the directories with writers open count as
// changed in it from the start. It reports whether any writer is open.
func (c *dirChanges) mark() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.known, c.changed = true, map[uint64]bool{}
	if c.writing[0] > 0 {
		c.known = false // a writer whose directory is not known
	}
	return len(c.writing) > 0
}

// touch records changes in the directories dirs (0: not known).
func (c *dirChanges) touch(dirs ...uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range dirs {
		if d == 0 {
			c.known = false
		} else if c.changed != nil {
			c.changed[d] = true
		}
	}
}

// lose makes every directory count as changed until the next mark.
func (c *dirChanges) lose() {
	c.mu.Lock()
	c.known = false
	c.mu.Unlock()
}

// writers counts a handle that may write, opened in directory dir, as it
// opens (delta 1) and closes (-1); either way its directory changed.
func (c *dirChanges) writers(dir uint64, delta int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writing == nil {
		c.writing = map[uint64]int{}
	}
	if c.writing[dir] += delta; c.writing[dir] <= 0 {
		delete(c.writing, dir)
	}
	if dir == 0 {
		c.known = false
	} else if c.changed != nil {
		c.changed[dir] = true
	}
}

// clean returns what says whether a directory is unchanged since the
// last mark, or nil when that is not known.
func (c *dirChanges) clean() func(ino uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.known || c.writing[0] > 0 {
		return nil
	}
	changed := make(map[uint64]bool, len(c.changed)+len(c.writing))
	for d := range c.changed {
		changed[d] = true
	}
	for d := range c.writing {
		changed[d] = true
	}
	return func(ino uint64) bool { return !changed[ino] }
}
