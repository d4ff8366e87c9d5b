// Package native serves a working directory to the sandbox without FUSE:
// the mountpoint is a bind mount of the directory, so every system call
// the sandbox makes there is the disk's own, at the disk's speed.
//
// What the daemon still has to see, it sees through fanotify:
//   - Lazy restore: every placeholder (a file of unwritten extents whose
//     bytes are still in the store) carries an inode mark for
//     FAN_OPEN_PERM and FAN_PRE_ACCESS in a FAN_CLASS_PRE_CONTENT group
//     (Linux 6.14 and later). The kernel blocks the first open (and so
//     every read, write, truncate, mmap, SEEK_DATA or copy_file_range
//     after it) until the daemon has written the bytes in place through
//     the event's own descriptor, or answers EIO. The mark is removed
//     once the file holds its bytes, so a fetched file costs nothing
//     afterwards.
//   - Changes: every directory carries an inode mark in a notification
//     group for the changes of its entries (FAN_REPORT_FID), which only
//     count, so the daemon knows whether the tree changed since a save.
//
// An external umount is noticed by the mount's id leaving
// /proc/self/mountinfo, which signals every change of the mount table
// with POLLPRI; a mount moved, or whose parent was renamed, is still
// served.
package native

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/mount/mountpoint"
)

// Content fills placeholders. Its own fetches (a prefetch) must reach a
// placeholder by reading it, so that the event they raise is the one
// that fills it: a pre-content event is raised for the daemon's own
// accesses too, and none is let through unfilled.
type Content interface {
	// FillFile writes the bytes of the placeholder open as f in place;
	// it returns nil at once if f is not a placeholder (any more).
	FillFile(ctx context.Context, f *os.File) error
	// OnFilled registers fn, called with every placeholder whose bytes
	// were just written by any means (a prefetch, a save), while it is
	// still open.
	OnFilled(fn func(f *os.File))
}

// Options configure a native mount.
type Options struct {
	// Dir is the working directory; At, the mountpoint resolved once,
	// gets a bind mount of it. Mountpoint is At's path, for messages.
	Dir, Mountpoint string
	At              *mountpoint.Dir
	// Pending is the extended attribute that marks a placeholder.
	Pending string
	// Content fills placeholders; nil if the tree has none.
	Content Content
	// ReadOnly mounts read-only.
	ReadOnly bool
	// Keeper is the amlfs binary, run as the keeper (keeper.go); "" runs
	// none. KeeperPID is the file its pid is kept in, where the next
	// mount finds a keeper a dead daemon left.
	Keeper, KeeperPID string
	Log               *slog.Logger
}

// Server is a mounted working directory.
type Server struct {
	opts    Options
	log     *slog.Logger
	hsm     int // FAN_CLASS_PRE_CONTENT group: placeholders
	notify  int // notification group: changes
	changes atomic.Int64
	mnt     *mountpoint.Mount // the bind mount
	stop    [2]int            // a pipe: closing stop[1] ends the loops
	wg      sync.WaitGroup
	gone    chan struct{} // closed when the mount went away
	once    sync.Once
	ctx     context.Context
	cancel  context.CancelFunc
	marked  atomic.Int64 // placeholders still marked
	self    int32        // this process, whose own changes are not counted
	keeper  *keeper
	serving bool // ServePlaceholders ran
	closed  sync.Once
	// dirs knows which directories changed since the last Mark
	// (changes.go); emu orders the reading of change events, by the loop
	// or by Clean, and guards counted: a batch's first change is
	// counted, once.
	dirs    dirChanges
	emu     sync.Mutex
	counted bool
	root    int    // the working directory: changed directories are opened by handle on its disk
	dev     uint64 // the working directory's device (Writers, after Close too)
	// detached is set once Unmount had to detach a busy mount: processes
	// may still hold placeholders open.
	detached atomic.Bool
	// unmounting is set once Unmount runs: the mount going away is then
	// this server's own doing, not a detach watchMounts must assume.
	unmounting atomic.Bool
}

// The first Linux with fanotify pre-content events.
const minMajor, minMinor = 6, 14

// Supported says whether native serving can run here for a working
// directory in dir, and why: what rules it out, or what it found.
func Supported(dir string) (bool, string) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false, "uname: " + err.Error()
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var maj, min int
	fmt.Sscanf(rel, "%d.%d", &maj, &min)
	if maj < minMajor || (maj == minMajor && min < minMinor) {
		return false, fmt.Sprintf("Linux %s has no fanotify pre-content events (%d.%d and later have)", rel, minMajor, minMinor)
	}
	if os.Geteuid() != 0 {
		return false, "a bind mount and fanotify pre-content events need root (CAP_SYS_ADMIN)"
	}
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_PRE_CONTENT|unix.FAN_CLOEXEC, unix.O_RDONLY)
	if err != nil {
		return false, "fanotify_init(FAN_CLASS_PRE_CONTENT): " + err.Error() + " (a container without CAP_SYS_ADMIN, or a kernel built without CONFIG_FANOTIFY_ACCESS_PERMISSIONS)"
	}
	defer unix.Close(fd)
	// A scratch file on the cache disk: the file system must take the
	// marks placeholders get.
	if err := os.MkdirAll(dir, 0o700); err != nil { // the cache dir: private
		return false, err.Error()
	}
	f, err := os.CreateTemp(dir, ".amlfs-probe-")
	if err != nil {
		return false, err.Error()
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_INODE, placeholderMask, int(f.Fd()), ""); err != nil {
		var st unix.Statfs_t
		unix.Fstatfs(int(f.Fd()), &st)
		return false, fmt.Sprintf("the cache disk's file system (magic %#x) refuses pre-content marks: %v", st.Type, err)
	}
	return true, fmt.Sprintf("root, Linux %s, and a cache disk that takes pre-content marks", rel)
}

// Mount marks the tree's placeholders and directories, then bind-mounts
// opts.Dir at opts.Mountpoint.
func Mount(opts Options) (*Server, error) {
	s, err := New(opts)
	if err != nil {
		return nil, err
	}
	if err := s.Start(false); err != nil {
		s.Abandon()
		return nil, err
	}
	return s, nil
}

// New makes the server's fanotify groups, so that placeholders can be
// marked as they are made (MarkPlaceholder), before Start. A server not
// started is given up with Abandon.
func New(opts Options) (*Server, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, log: opts.Log, hsm: -1, notify: -1, root: -1, stop: [2]int{-1, -1}, gone: make(chan struct{}), self: int32(os.Getpid())}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	var err error
	if s.hsm, err = unix.FanotifyInit(unix.FAN_CLASS_PRE_CONTENT|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|unix.FAN_UNLIMITED_QUEUE|unix.FAN_UNLIMITED_MARKS,
		unix.O_RDWR|unix.O_LARGEFILE|unix.O_CLOEXEC); err != nil {
		s.closeFDs()
		return nil, fmt.Errorf("fanotify_init(FAN_CLASS_PRE_CONTENT): %w", err)
	}
	if s.notify, err = unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|unix.FAN_UNLIMITED_QUEUE|unix.FAN_UNLIMITED_MARKS|unix.FAN_REPORT_FID|unix.FAN_REPORT_DIR_FID,
		unix.O_RDONLY|unix.O_CLOEXEC); err != nil {
		s.closeFDs()
		return nil, fmt.Errorf("fanotify_init(FAN_REPORT_DIR_FID): %w", err)
	}
	if s.root, err = unix.Open(opts.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		s.closeFDs()
		return nil, &os.PathError{Op: "open", Path: opts.Dir, Err: err}
	}
	var rst unix.Stat_t
	if err := unix.Fstat(s.root, &rst); err != nil {
		s.closeFDs()
		return nil, &os.PathError{Op: "stat", Path: opts.Dir, Err: err}
	}
	s.dev = rst.Dev
	if err := unix.Pipe2(s.stop[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		s.closeFDs()
		return nil, err
	}
	return s, nil
}

// MarkPlaceholder marks the placeholder open as fd (any descriptor of it)
// for pre-content events: for a placeholder made after New, before Start.
func (s *Server) MarkPlaceholder(fd int) error {
	err := unix.FanotifyMark(s.hsm, unix.FAN_MARK_ADD|unix.FAN_MARK_INODE, placeholderMask, fd, "")
	if errors.Is(err, unix.EBADF) { // an O_PATH descriptor: through its magic link
		err = unix.FanotifyMark(s.hsm, unix.FAN_MARK_ADD|unix.FAN_MARK_INODE, placeholderMask, unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd))
	}
	if err != nil {
		return fmt.Errorf("mark a placeholder: %w", err)
	}
	s.marked.Add(1)
	return nil
}

// ServePlaceholders answers pre-content events from now on, before Start:
// the daemon's own reads of placeholders marked as they were made
// (MarkPlaceholder) are filled, not held forever.
func (s *Server) ServePlaceholders() {
	if s.serving {
		return
	}
	s.serving = true
	if s.opts.Content != nil {
		s.opts.Content.OnFilled(s.unmark)
	}
	s.wg.Add(1)
	go s.serveHSM()
}

// Abandon ends a server New made and Start never started, or that failed.
func (s *Server) Abandon() { s.Close() }

// Start marks the tree's directories and, unless premarked (every
// placeholder in the tree was made after New and marked then), its
// placeholders; then bind-mounts opts.Dir at opts.Mountpoint and serves.
// On an error the server is to be abandoned.
func (s *Server) Start(premarked bool) error {
	opts := s.opts
	ok := false
	defer func() {
		if !ok && s.mnt != nil {
			s.mnt.Unmount(true)
		}
	}()
	s.ServePlaceholders()
	start := time.Now()
	s.dirs.reset()
	dirs, files, err := s.markTree(opts.Content != nil && !premarked)
	if err != nil {
		return err
	}
	s.log.Debug("marked the tree", "dirs", dirs, "placeholders", files, "premarked", premarked, "seconds", time.Since(start).Seconds())
	// A keeper a dead daemon left answers EIO for these same inodes:
	// stopped now that this group marks them.
	if opts.KeeperPID != "" {
		StopKeeper(opts.KeeperPID)
	}
	if err := s.bind(); err != nil {
		return err
	}
	if opts.Content == nil {
		// No placeholders (--store none): nothing for a keeper to answer.
	} else if opts.Keeper == "" {
		s.log.Warn("no keeper: if the daemon dies, files not fetched yet read as zeros until the mount is cleaned", "op", "mount", "path", opts.Mountpoint)
	} else if s.keeper, err = startKeeper(opts.Keeper, s.hsm, s.mnt); err != nil {
		return fmt.Errorf("start the keeper: %w", err)
	} else if opts.KeeperPID != "" {
		os.WriteFile(opts.KeeperPID, []byte(strconv.Itoa(s.keeper.cmd.Process.Pid)), 0o600)
	}
	ok = true
	s.wg.Add(2)
	go s.serveNotify()
	go s.watchMounts()
	return nil
}

// dirMask is what a directory's mark counts as a change.
// A file closed after writing counts: it may have been written through a
// shared mapping, which raises no FAN_MODIFY (its close comes after the
// last unmap).
const dirMask = unix.FAN_MODIFY | unix.FAN_ATTRIB | unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO |
	unix.FAN_CLOSE_WRITE | unix.FAN_DELETE_SELF | unix.FAN_MOVE_SELF | unix.FAN_ONDIR | unix.FAN_EVENT_ON_CHILD

// markTree marks every directory for changes and, with placeholders,
// every placeholder for pre-content events, opening each below the root
// with no symlink followed. Directories are marked markWorkers at once:
// on a lazily restored tree of 100k files this is a getxattr and a mark
// per file.
func (s *Server) markTree(placeholders bool) (dirs, files int, err error) {
	root, err := unix.Open(s.opts.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, 0, &os.PathError{Op: "open", Path: s.opts.Dir, Err: err}
	}
	m := &treeMarker{s: s, placeholders: placeholders}
	m.g.SetLimit(markWorkers)
	m.g.Go(func() error { return m.dir(root, s.opts.Dir) })
	err = m.g.Wait()
	return int(m.dirs.Load()), int(m.files.Load()), err
}

// markWorkers is how many directories markTree marks at once.
const markWorkers = 4

// treeMarker is one markTree's walk.
type treeMarker struct {
	s            *Server
	placeholders bool
	g            errgroup.Group
	dirs, files  atomic.Int64
}

// dir marks the directory open as fd (and closes it) and what is below
// it: its subdirectories on another worker when one is free, else here.
func (m *treeMarker) dir(fd int, name string) error {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if err := unix.FanotifyMark(m.s.notify, unix.FAN_MARK_ADD|unix.FAN_MARK_INODE, dirMask, fd, ""); err != nil {
		return fmt.Errorf("mark %s: %w", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: name, Err: err}
	}
	m.s.dirs.addMarked(st.Ino)
	m.dirs.Add(1)
	ents, err := f.ReadDir(-1)
	if err != nil {
		return err
	}
	for _, e := range ents {
		switch {
		case e.IsDir():
			cfd, err := unix.Openat(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
			if err != nil {
				if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
					continue
				}
				return &os.PathError{Op: "open", Path: filepath.Join(name, e.Name()), Err: err}
			}
			sub := filepath.Join(name, e.Name())
			if !m.g.TryGo(func() error { return m.dir(cfd, sub) }) {
				if err := m.dir(cfd, sub); err != nil {
					return err
				}
			}
		case e.Type().IsRegular() && m.placeholders:
			// O_PATH, and the mark and the marker read through its
			// magic link: no open of the placeholder itself, which
			// would raise FAN_OPEN_PERM, to the keeper a dead daemon
			// left (which would deny it) or to this very group.
			cfd, err := unix.Openat(fd, e.Name(), unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
			if err != nil {
				continue
			}
			marked, err := m.s.markPlaceholder(cfd)
			unix.Close(cfd)
			if err != nil {
				return fmt.Errorf("mark %s: %w", filepath.Join(name, e.Name()), err)
			}
			if marked {
				m.files.Add(1)
			}
		}
	}
	return nil
}

// placeholderMask is what a placeholder's mark holds back until it is
// filled: every access of its bytes (FAN_PRE_ACCESS), and before that
// every open (FAN_OPEN_PERM), so that no descriptor of a placeholder ever
// sees its holes. Without the open, lseek(SEEK_DATA), FIEMAP,
// copy_file_range and FICLONE read no byte, raise no pre-content event,
// and cp, tar --sparse or mv to another file system would copy zeros.
const placeholderMask = unix.FAN_PRE_ACCESS | unix.FAN_OPEN_PERM

// markPlaceholder marks the file open as fd (O_PATH) if it is a
// placeholder.
func (s *Server) markPlaceholder(fd int) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, nil
	}
	at := "/proc/self/fd/" + strconv.Itoa(fd)
	if _, err := unix.Getxattr(at, s.opts.Pending, nil); err != nil {
		return false, nil
	}
	if err := unix.FanotifyMark(s.hsm, unix.FAN_MARK_ADD|unix.FAN_MARK_INODE, placeholderMask, unix.AT_FDCWD, at); err != nil {
		return false, err
	}
	s.marked.Add(1)
	return true, nil
}

// unmark drops the pre-content mark of a file that now holds its bytes.
func (s *Server) unmark(f *os.File) {
	if err := unix.FanotifyMark(s.hsm, unix.FAN_MARK_REMOVE|unix.FAN_MARK_INODE, placeholderMask, int(f.Fd()), ""); err == nil {
		s.marked.Add(-1)
	}
}

// bind bind-mounts the directory on the mountpoint's descriptor, private
// (so that the live mounts mounted inside it never propagate back to the
// working directory), nosuid and nodev as a FUSE mount is. The mount is
// whole (flags and all) before it is attached.
func (s *Server) bind() error {
	fd, err := mountpoint.BindTree(s.opts.Dir, s.opts.ReadOnly)
	if err != nil {
		return fmt.Errorf("bind-mount %s: %w", s.opts.Dir, err)
	}
	if s.mnt, err = s.opts.At.Attach(fd); err != nil {
		return fmt.Errorf("bind-mount %s: %w", s.opts.Dir, err)
	}
	return nil
}

// Mount is the bind mount, known by its id and held by descriptor.
func (s *Server) Mount() *mountpoint.Mount { return s.mnt }

// waitReadable polls fd and the stop pipe, for up to timeout ms (-1: no
// bound); false once stopped.
func (s *Server) waitReadable(fd int, events int16, timeout int) (int16, bool) {
	for {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: events}, {Fd: int32(s.stop[0]), Events: unix.POLLIN}}
		_, err := unix.Poll(pfd, timeout)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pfd[1].Revents != 0 {
			return 0, false
		}
		return pfd[0].Revents, true
	}
}

const metaLen = int(unsafe.Sizeof(unix.FanotifyEventMetadata{}))

// serveHSM answers pre-content events: a placeholder's first access waits
// here until its bytes are written.
func (s *Server) serveHSM() {
	defer s.wg.Done()
	s.events(s.hsm, nil, func(m *unix.FanotifyEventMetadata, _ []byte) {
		if m == nil || m.Fd < 0 {
			return // a batch's end, or an event with no file
		}
		s.wg.Add(1)
		go s.fill(m.Fd)
	})
}

// events reads the events of group fd until the server stops, handing
// each batch's events to fn in order, with their information records;
// fn is told of each batch's end by a nil event. lock, if not nil, is
// held while a batch is read and handed over.
func (s *Server) events(fd int, lock sync.Locker, fn func(*unix.FanotifyEventMetadata, []byte)) {
	buf := make([]byte, 64<<10)
	for {
		if _, ok := s.waitReadable(fd, unix.POLLIN, -1); !ok {
			return
		}
		if lock != nil {
			lock.Lock()
		}
		n, err := unix.Read(fd, buf)
		if err == nil {
			eachEvent(buf[:n], fn)
			fn(nil, nil)
		}
		if lock != nil {
			lock.Unlock()
		}
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			s.log.Error("read fanotify events", "op", "fanotify", "path", s.opts.Mountpoint, "err", err)
			return
		}
	}
}

// eachEvent calls fn with each event in buf and its information records.
func eachEvent(buf []byte, fn func(*unix.FanotifyEventMetadata, []byte)) {
	for off := 0; off+metaLen <= len(buf); {
		m := *(*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[off]))
		if m.Event_len < uint32(metaLen) || off+int(m.Event_len) > len(buf) {
			return
		}
		info := buf[off+int(m.Metadata_len) : off+int(m.Event_len)]
		off += int(m.Event_len)
		fn(&m, info)
	}
}

// fill fetches the bytes of the placeholder open as fd and answers.
func (s *Server) fill(fd int32) {
	defer s.wg.Done()
	f := os.NewFile(uintptr(fd), "placeholder")
	resp := uint32(unix.FAN_ALLOW)
	if err := s.opts.Content.FillFile(s.ctx, f); err != nil {
		// FAN_DENY with EIO: the reader gets EIO, never zeros.
		resp = unix.FAN_DENY | uint32(unix.EIO)<<unix.FAN_ERRNO_SHIFT
	} else {
		s.unmark(f)
	}
	s.respond(fd, resp)
	f.Close()
}

func (s *Server) respond(fd int32, resp uint32) {
	r := unix.FanotifyResponse{Fd: fd, Response: resp}
	if _, err := unix.Write(s.hsm, (*[unsafe.Sizeof(r)]byte)(unsafe.Pointer(&r))[:]); err != nil {
		s.log.Error("answer a fanotify event", "op", "fanotify", "path", s.opts.Mountpoint, "err", err)
	}
}

// serveNotify counts the tree's changes. After the first since a Mark,
// the marks are dropped until the next Mark, which a save starts with.
// New directories get their mark by the next Mark too; a change in one
// made before that is a change anyway, since making the directory was.
func (s *Server) serveNotify() {
	defer s.wg.Done()
	s.events(s.notify, &s.emu, s.notifyEvent)
}

// notifyEvent takes one change event (nil: a batch's end). Must hold emu.
func (s *Server) notifyEvent(m *unix.FanotifyEventMetadata, info []byte) {
	if m == nil {
		s.counted = false // the next batch
		return
	}
	if m.Fd >= 0 {
		unix.Close(int(m.Fd))
	}
	if m.Mask&unix.FAN_Q_OVERFLOW != 0 {
		s.dirs.setLost()
	} else if m.Pid == s.self {
		return // the daemon's own: a fetch, a lease
	} else {
		s.noteChange(info)
	}
	if s.counted {
		return
	}
	s.counted = true
	s.changes.Add(1)
}

// watchMounts notices the mount going away (an external umount, lazy or
// not). A mount moved elsewhere, or whose mountpoint's parent was renamed,
// is still this mount: it is known by its id, not by its path. A mount
// detached while files of it are open is still served, as after a lazy
// detach of the daemon's own: Close leaves the keeper while placeholders
// may still be read through it.
func (s *Server) watchMounts() {
	defer s.wg.Done()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		s.log.Error("watch the mount table", "op", "mountinfo", "path", s.opts.Mountpoint, "err", err)
		return
	}
	defer f.Close()
	for {
		if !s.mounted() {
			// Gone by someone else's umount, which may have been a lazy
			// detach: files may still be open through it. Unmount says
			// itself whether its own had to detach.
			if !s.unmounting.Load() {
				s.detached.Store(true)
			}
			s.once.Do(func() { close(s.gone) })
			return
		}
		// The kernel signals the change as the umount starts, and a
		// check made at once may still find the mount: the wait is
		// bounded, so that such a change is seen a second later anyway.
		if _, ok := s.waitReadable(int(f.Fd()), unix.POLLPRI, 1000); !ok {
			return
		}
		// Reading to the end re-arms the POLLPRI signal.
		f.Seek(0, 0)
		io.Copy(io.Discard, f)
	}
}

// mounted reports whether the bind mount is still in the namespace.
func (s *Server) mounted() bool { return s.mnt.Attached() }

// Changes returns the number of changes seen so far: after the first
// since a Mark, further ones are not seen until the next, so it counts
// one per save interval with changes, not every change.
//
// The events queued so far are taken first: a change a process has made
// is counted by the time it asks, however far behind the loop is.
func (s *Server) Changes() int64 {
	s.emu.Lock()
	s.drain()
	s.emu.Unlock()
	return s.changes.Load()
}

// Touch counts a change the daemon made itself through the mount (a tool
// call), which the change marks leave out as the daemon's own.
// Which directories it changed is not known: all count as changed.
func (s *Server) Touch() {
	s.changes.Add(1)
	s.dirs.setLost()
}

// Mark marks every directory again and returns the count a save starts
// from: every change after it is seen. A directory that cannot be marked
// (gone, swapped for a symlink) is passed over.
//
// The events queued before it are taken first, and the loop takes none
// while it marks: an event of a change made before the Mark would
// otherwise remove the mark it has just put back on its directory, and
// the directory's changes after it would go unseen.
func (s *Server) Mark() int64 {
	s.emu.Lock()
	defer s.emu.Unlock()
	s.drain()
	s.dirs.reset()
	if _, _, err := s.markTree(false); err != nil {
		s.log.Warn("mark the tree's directories; the tree counts as changed", "op", "fanotify", "path", s.opts.Dir, "err", err)
		s.changes.Add(1)
		s.dirs.setLost()
	}
	return s.changes.Load()
}

// Pending is the number of placeholders still marked.
func (s *Server) Pending() int64 { return s.marked.Load() }

// Freeze cannot hold the sandbox's writes back: they never reach the
// daemon. A save reads each file consistently (readStable), but the tree
// is not frozen as a whole.
func (s *Server) Freeze() (thaw func()) { return func() {} }

// Passthrough is false: there is nothing to pass through.
func (s *Server) Passthrough() bool { return false }

// Wait blocks until the mount went away.
func (s *Server) Wait() { <-s.gone }

// Unmount unmounts, retrying while the mount is busy for up to wait; then,
// if lazy, detaches it. The loops stop and pending events are answered.
func (s *Server) Unmount(wait time.Duration, lazy bool) error {
	defer s.shutdown()
	s.unmounting.Store(true)
	detached, err := s.mnt.UnmountWithin(wait, lazy)
	if detached && err == nil {
		s.detached.Store(true)
		s.log.Warn("mount was busy; detached it lazily", "op", "unmount", "path", s.opts.Mountpoint)
	}
	return err
}

// shutdown makes Wait return. The loops and the groups stay until Close,
// so a file a process still holds open after a lazy detach is still
// filled on access.
func (s *Server) shutdown() {
	s.once.Do(func() { close(s.gone) })
}

// Close ends the event loops and closes the groups. The keeper goes too,
// unless a lazy detach left placeholders that processes may still read:
// then the keeper stays, answering their reads with EIO, until no process
// holds a file of the mount open.
func (s *Server) Close() { s.closed.Do(s.close) }

func (s *Server) close() {
	s.cancel()
	if s.stop[1] >= 0 {
		unix.Close(s.stop[1])
		s.stop[1] = -1
	}
	s.wg.Wait()
	if s.keeper != nil {
		if s.detached.Load() && s.marked.Load() > 0 {
			// A process may still read a placeholder through the
			// detached mount: the keeper answers it EIO, as if the
			// daemon had died, until the next mount of the workspace.
			s.log.Warn("placeholders not fetched are still open through the detached mount; the keeper answers their reads with EIO", "op", "unmount", "path", s.opts.Mountpoint, "files", s.marked.Load())
			s.keeper.bye.Close()
		} else {
			s.keeper.stop()
			if s.opts.KeeperPID != "" {
				os.Remove(s.opts.KeeperPID)
			}
		}
	}
	s.closeFDs()
}

// Detached reports whether Unmount had to detach a busy mount.
func (s *Server) Detached() bool { return s.detached.Load() }

// Stranded reports a detached mount that still has placeholders: processes
// holding it open could read them once the daemon is gone.
func (s *Server) Stranded() bool { return s.Detached() && s.Pending() > 0 }

func (s *Server) closeFDs() {
	for _, fd := range []*int{&s.hsm, &s.notify, &s.root, &s.stop[0], &s.stop[1]} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}
