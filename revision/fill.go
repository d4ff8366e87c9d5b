package revision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"golang.org/x/sys/unix"
)

// fetchWith is fetch with the fill to run: into a file named path, or
// into a descriptor already open (FillFile).
func (w *Workspace) fetchWith(ctx context.Context, l *lazyState, id fileID, path string, fill func(context.Context, pendingFile) error) error {
	var pf pendingFile
	ino := id.ino
	return shareCall(ctx, w.fetchCtx, w.opts.FetchTimeout, &l.mu, l.inflight, ino,
		func() (ok bool) { pf, ok = l.file(id); return ok },
		func(ctx context.Context) error {
			err := fill(ctx, pf)
			if err != nil {
				l.mu.Lock()
				_, logged := l.gone[ino]
				l.mu.Unlock()
				if !logged {
					w.log.Error("fetch file bytes", "op", "fetch", "path", path, "key", pf.key, "err", err)
				}
			}
			return err
		},
		func(err error) {
			if _, ok := l.file(id); !ok {
				return // made again meanwhile
			}
			switch {
			case err == nil:
				delete(l.pending, ino)
				delete(l.gone, ino)
				l.bytes -= pf.size
			case amlerr.Code(err) == amlerr.BaseRevisionGone:
				l.gone[ino] = path
			}
		})
}

// FillFile gives the placeholder open as f its bytes, in place, through f
// itself (native serving: f is a pre-content event's descriptor, whose
// writes raise no further event). It returns nil at once if f is not a
// pending placeholder of this tree.
func (w *Workspace) fillOpen(ctx context.Context, f *os.File) error {
	return w.fillVia(ctx, int(f.Fd()), func(ctx context.Context, pf pendingFile, id fileID) error {
		return w.fillFile(ctx, pf, id, f, nil)
	})
}

// fillVia runs fill for the pending placeholder of this tree that fd
// refers to, through the fetches' one singleflight; it returns nil at once
// if fd is anything else.
func (w *Workspace) fillVia(ctx context.Context, fd int, fill func(ctx context.Context, pf pendingFile, id fileID) error) error {
	l := w.lazyState()
	if l == nil {
		return nil
	}
	var st unix.Stat_t
	var dir syscall.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil
	}
	if err := syscall.Stat(l.dir, &dir); err != nil || st.Dev != dir.Dev {
		return err
	}
	l.mu.Lock()
	_, maybe := l.pending[st.Ino]
	l.mu.Unlock()
	if !maybe {
		return nil // no handle to read for a file that is no placeholder
	}
	id, err := idOf(fd, &st)
	if err != nil {
		return err
	}
	proc := fmt.Sprintf("/proc/self/fd/%d", fd)
	name, err := os.Readlink(proc)
	if err != nil {
		name = proc
	}
	return w.fetchWith(ctx, l, id, name, func(ctx context.Context, pf pendingFile) error { return fill(ctx, pf, id) })
}

// Fill gives the placeholder that fd refers to (any descriptor of it; an
// O_PATH one will do: the FUSE node's) its bytes, in place: a no-op
// unless it is a pending placeholder of this tree. The file is opened
// for writing through fd itself, never by a path, and only when there is
// something to fill (an open for writing fails on a running executable).
func (w *Workspace) fillFd(ctx context.Context, fd int) error {
	return w.fillVia(ctx, fd, func(ctx context.Context, pf pendingFile, id fileID) error {
		f, restore, err := reopenForFill(fd)
		if err != nil {
			return err
		}
		defer f.Close()
		return w.fillFile(ctx, pf, id, f, restore)
	})
}

// reopenForFill opens the inode fd refers to for writing, through the
// magic link /proc/self/fd/N. A daemon that is not root cannot open its
// own read-only file (a restored git object is 0444) for writing: it then
// adds the owner's write bit for the fill, and restore puts the mode back
// (nil when nothing needs restoring). Root's opens ignore the mode.
func reopenForFill(fd int) (f *os.File, restore func() error, err error) {
	proc := fmt.Sprintf("/proc/self/fd/%d", fd)
	f, err = os.OpenFile(proc, os.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err == nil || !errors.Is(err, syscall.EACCES) {
		return f, nil, err
	}
	var st syscall.Stat_t
	if serr := syscall.Fstat(fd, &st); serr != nil || int(st.Uid) != os.Geteuid() || st.Mode&0o200 != 0 {
		return nil, nil, err
	}
	mode := st.Mode & 0o7777
	if cerr := syscall.Chmod(proc, mode|0o200); cerr != nil {
		return nil, nil, err
	}
	f, err = os.OpenFile(proc, os.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		syscall.Chmod(proc, mode)
		return nil, nil, err
	}
	return f, func() error { return syscall.Fchmod(int(f.Fd()), mode) }, nil
}

// OnFilled registers fn, called with each placeholder whose bytes were
// just written, while it is open.
func (w *Workspace) setOnFilled(fn func(f *os.File)) {
	w.lmu.Lock()
	w.onFilled = fn
	w.lmu.Unlock()
}

// shareCall runs work for ino once for all concurrent callers: a caller
// that finds a run in flight waits for its result instead. Under mu, todo
// reports whether there is anything to do, and done records a run's
// outcome. The run is not cancelled with its caller, since others may wait
// on it; an interrupted run is simply redone by the next caller. It runs
// under base, which bounds it (the fetch timeout) and which StopFetches
// cancels, so that no run outlives the daemon's stop.
func shareCall(ctx, base context.Context, limit time.Duration, mu *sync.Mutex, calls map[uint64]*fetchCall, ino uint64,
	todo func() bool, work func(context.Context) error, done func(error)) error {
	mu.Lock()
	if !todo() {
		mu.Unlock()
		return nil
	}
	if c, ok := calls[ino]; ok {
		mu.Unlock()
		select {
		case <-c.done:
			return c.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c := &fetchCall{done: make(chan struct{})}
	calls[ino] = c
	mu.Unlock()

	wctx, cancel := context.WithTimeoutCause(base, limit, fmt.Errorf("the fetch took over %s (--fetch-timeout)", limit))
	c.err = work(wctx)
	if c.err != nil && wctx.Err() != nil {
		// Our own bound or stop, not the caller's interruption: the
		// reader gets EIO, not EINTR (on which it would only retry).
		c.err = fmt.Errorf("%v (%v)", context.Cause(wctx), c.err)
	}
	cancel()
	mu.Lock()
	delete(calls, ino)
	done(c.err)
	mu.Unlock()
	close(c.done)
	return c.err
}

// fill writes a placeholder's bytes in place, finding it by path
// (lazyState.open) and opening it for writing through that descriptor.
func (w *Workspace) fill(ctx context.Context, l *lazyState, pf pendingFile, id fileID, path string) error {
	p, err := l.open(path, unix.O_PATH)
	if err != nil {
		return err
	}
	defer p.Close()
	f, restore, err := reopenForFill(int(p.Fd()))
	if err != nil {
		return err
	}
	defer f.Close()
	return w.fillFile(ctx, pf, id, f, restore)
}

// open opens path, below the working directory, with no symlink followed
// (a user of a natively served tree can swap any directory for one).
func (l *lazyState) open(path string, flags int) (*os.File, error) {
	rel, err := relTo(l.dir, path)
	if err != nil {
		return nil, err
	}
	return openBeneath(l.dir, rel, flags)
}

// isPlaceholder checks that f is still the placeholder id, whose bytes
// pf names: a regular file with that handle, and a marker of bytes of that
// artifact (a file of a file system that gives no handles is known by its
// marker alone), not whatever was put at its path, or took its inode
// number, since. It returns f's stat.
func (l *lazyState) isPlaceholder(f *os.File, id fileID, pf pendingFile) (syscall.Stat_t, error) {
	var st syscall.Stat_t
	fd := int(f.Fd())
	got, err := idOfFd(fd)
	if err != nil {
		return st, err
	}
	if err := syscall.Fstat(fd, &st); err != nil {
		return st, err
	}
	if got != id || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return st, fmt.Errorf("%s is no longer the placeholder %v: it is %v", f.Name(), id, got)
	}
	buf := make([]byte, 4096)
	n, err := unix.Fgetxattr(fd, PendingXattr(), buf)
	if errors.Is(err, unix.ENODATA) && PendingXattr() != PendingUserXattr {
		n, err = unix.Fgetxattr(fd, PendingUserXattr, buf) // an older amlfs's marker
	}
	if err != nil {
		return st, fmt.Errorf("%s is no longer the placeholder of %s: its marker: %w", f.Name(), pf.key, err)
	}
	// A short marker reads back as its archive's entry number, which
	// the record may name by its member: their archives must agree.
	key, ok := l.revs.key(string(buf[:n]))
	if !ok || artifactOf(key) != artifactOf(pf.key) {
		return st, fmt.Errorf("%s is no longer the placeholder of %s: it is marked %q", f.Name(), pf.key, buf[:n])
	}
	return st, nil
}

// goneErr is the error of a placeholder whose bytes another writer pruned.
func (w *Workspace) goneErr(pf pendingFile) error {
	rev := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(artifactOf(pf.key), "revisions/"), "/"), format.ArchiveExt)
	return amlerr.New(amlerr.BaseRevisionGone, pf.key, "the bytes of %s are gone from %s: revision %s was pruned, most likely by another writer, before this lazily restored file was fetched", pf.origPath, w.store, rev)
}

// fillFile writes a placeholder's bytes into f, checks their count, makes
// them durable, then clears the marker. restore, if not nil, puts back the
// mode reopenForFill changed, before the file's stat data are recorded.
func (w *Workspace) fillFile(ctx context.Context, pf pendingFile, id fileID, f *os.File, restore func() error) error {
	defer func() {
		if restore != nil { // not restored yet: the fill failed
			restore()
		}
	}()
	l := w.lazyState()
	if l == nil {
		return nil
	}
	before, err := l.isPlaceholder(f, id, pf)
	if err != nil {
		return err
	}
	ino := id.ino
	r, err := w.openFileBytes(ctx, pf.key)
	if errors.Is(err, store.ErrNotExist) {
		return w.goneErr(pf)
	}
	if err != nil {
		return err
	}
	defer r.Close()
	n, err := io.Copy(io.NewOffsetWriter(f, 0), io.LimitReader(r, pf.size+1))
	if err != nil {
		return err
	}
	if n != pf.size {
		return amlerr.New(amlerr.InvalidStore, pf.key, "object holds %d bytes, the manifest says %d", n, pf.size)
	}
	// Keep the placeholder's mtime: fetching is not a modification.
	ts := []unix.Timespec{unix.NsecToTimespec(before.Atim.Nano()), unix.NsecToTimespec(before.Mtim.Nano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), ts, 0); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := unix.Fremovexattr(int(f.Fd()), PendingXattr()); err != nil && !errors.Is(err, unix.ENODATA) {
		return err
	}
	unix.Fremovexattr(int(f.Fd()), PendingUserXattr) // an older amlfs's marker, if any
	if restore != nil {
		err := restore()
		restore = nil
		if err != nil {
			return err
		}
	}
	// The base tree knew the placeholder's stamp; it now holds the real
	// bytes of the same object, so it stays reusable.
	if after, err := store.FileStamp(f); err == nil {
		w.noteFill(pf.origPath, ino, stampOfStat(&before), after)
		w.view.Filled(ino, after.Ctime.Nano())
	}
	w.lmu.Lock()
	fn := w.onFilled
	w.lmu.Unlock()
	if fn != nil {
		fn(f)
	}
	return nil
}
