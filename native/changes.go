package native

import (
	"encoding/binary"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Changed directories. Each event of the notification group names the
// directory it happened in (FAN_REPORT_DIR_FID), which is then known as
// changed until the next Mark, and its mark removed: a directory costs the
// sandbox one event per save, however much changes in it. The daemon's
// own changes do not count: a fill writes the bytes the file had as a
// placeholder (a save that listed the placeholder reuses them), and a tool
// call counts as changing every directory (Touch).
//
// A save that holds the writers asks which directories did not change
// since its Mark (Clean): it reads only the others again.
type dirChanges struct {
	mu      sync.Mutex
	marked  map[uint64]bool // the directories the last Mark marked
	changed map[uint64]bool // since then
	// lost is set when a change's directory cannot be known (the queue
	// overflowed, a handle that does not open): every directory counts as
	// changed until the next Mark.
	lost bool
}

// reset starts a Mark's interval.
func (c *dirChanges) reset() {
	c.mu.Lock()
	c.marked, c.changed, c.lost = map[uint64]bool{}, map[uint64]bool{}, false
	c.mu.Unlock()
}

func (c *dirChanges) addMarked(ino uint64) {
	c.mu.Lock()
	if c.marked != nil {
		c.marked[ino] = true
	}
	c.mu.Unlock()
}

// dirHandle returns the file handle of the directory an event names, from
// its information records: the DFID record, or for an event on a
// directory itself, its FID.
func dirHandle(info []byte) (htype int32, handle []byte, ok bool) {
	var fid []byte
	for len(info) >= 4 {
		typ, n := info[0], int(binary.NativeEndian.Uint16(info[2:4]))
		if n < 4 || n > len(info) {
			return 0, nil, false
		}
		rec := info[:n]
		info = info[n:]
		switch typ {
		case unix.FAN_EVENT_INFO_TYPE_DFID, unix.FAN_EVENT_INFO_TYPE_DFID_NAME:
			return fileHandle(rec)
		case unix.FAN_EVENT_INFO_TYPE_FID:
			fid = rec
		}
	}
	if fid != nil {
		return fileHandle(fid)
	}
	return 0, nil, false
}

// fileHandle reads the struct file_handle of a FID record: its header (4
// bytes), the fsid (8), then handle_bytes, handle_type and the handle.
func fileHandle(rec []byte) (int32, []byte, bool) {
	const at = 4 + 8
	if len(rec) < at+8 {
		return 0, nil, false
	}
	n := int(binary.NativeEndian.Uint32(rec[at:]))
	htype := int32(binary.NativeEndian.Uint32(rec[at+4:]))
	if n > len(rec)-at-8 {
		return 0, nil, false
	}
	return htype, rec[at+8 : at+8+n], true
}

// noteChange records the directory of one change event of the sandbox's
// (info: its records), and removes the directory's mark.
func (s *Server) noteChange(info []byte) {
	c := &s.dirs
	htype, h, ok := dirHandle(info)
	if !ok {
		s.log.Debug("a change event names no directory; every directory counts as changed", "op", "fanotify", "info", len(info))
		c.setLost()
		return
	}
	fd, err := unix.OpenByHandleAt(s.root, unix.NewFileHandle(htype, h), unix.O_PATH|unix.O_CLOEXEC)
	if err == unix.ESTALE || err == unix.ENOENT {
		return // removed since: its parent's change says so
	}
	if err != nil {
		s.log.Debug("open a changed directory by its handle; every directory counts as changed", "op", "fanotify", "err", err)
		c.setLost()
		return
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		c.setLost()
		return
	}
	c.mu.Lock()
	c.changed[st.Ino] = true
	c.mu.Unlock()
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		// Known changed until the next Mark: no more of its events. It
		// may be gone already (an event of it still queued).
		unix.FanotifyMark(s.notify, unix.FAN_MARK_REMOVE|unix.FAN_MARK_INODE, dirMask, unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd))
	}
}

// setLost makes every directory count as changed until the next Mark.
func (c *dirChanges) setLost() {
	c.mu.Lock()
	c.lost = true
	c.mu.Unlock()
}

// Clean returns what says whether a directory (by inode) is unchanged
// since the last Mark: marked then, and no event of it since. It reads
// every event queued so far first, so that a caller who holds the
// writers (a frozen cgroup) is told of all their changes. nil when that
// cannot be known: the tree was never marked, or changes were lost.
func (s *Server) Clean() func(ino uint64) bool {
	s.emu.Lock()
	s.drain()
	s.emu.Unlock()
	c := &s.dirs
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost || c.marked == nil {
		return nil
	}
	marked, changed := c.marked, make(map[uint64]bool, len(c.changed))
	for ino := range c.changed {
		changed[ino] = true
	}
	return func(ino uint64) bool { return marked[ino] && !changed[ino] }
}

// drain takes every change event queued so far. Must hold emu.
func (s *Server) drain() {
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(s.notify, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		eachEvent(buf[:n], s.notifyEvent)
		s.notifyEvent(nil, nil)
	}
}
