package dirstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/revision/store"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
)

// The filesystem lease follows the proper-lockfile convention AML uses: a
// directory Base/seg(id).lock created atomically with mkdir, kept fresh by
// touching its mtime every LockRefresh, and stale after LockStale without a
// touch. A stale lease is taken over under an flock on Base, so that two
// contenders on this host cannot both win.

func (s *Store) lockPath() string { return filepath.Join(s.Base, s.Seg+".lock") }

func (s *Store) conflict(detail string) error {
	return amlerr.New(amlerr.WorkspaceConflict, s.ID, "workspace %q is locked by another writer (%s); wait for it, choose another --id, or pass --no-lock", s.ID, detail)
}

// Lock takes the lease.
func (s *Store) Lock(ctx context.Context, onLost func(error), dead func(holder string) bool) (store.Lease, error) {
	if err := os.MkdirAll(s.Base, 0o700); err != nil {
		return nil, err
	}
	lp := s.lockPath()
	err := os.Mkdir(lp, 0o755)
	if errors.Is(err, fs.ErrExist) {
		err = s.takeOver(lp, dead)
	}
	if err != nil {
		return nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(lp, &st); err != nil {
		return nil, err
	}
	holder, err := lockHolder(lp)
	if err != nil {
		return nil, err
	}
	l := &fsLease{Heartbeat: store.NewHeartbeat(onLost), path: lp, holder: holder, ino: st.Ino, mtime: st.Mtim}
	l.Start(s.LockRefresh, func() error {
		if err := l.check(); err != nil {
			return err
		}
		return l.touch()
	})
	return l, nil
}

// lockHolder names the lock directory at lp: its inode and birth time,
// which a removed and re-made directory does not share.
func lockHolder(lp string) (string, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, lp, 0, unix.STATX_INO|unix.STATX_BTIME, &stx); err != nil {
		return "", fmt.Errorf("stat %s: %w", lp, err)
	}
	if stx.Mask&unix.STATX_BTIME == 0 {
		return fmt.Sprintf("ino:%d", stx.Ino), nil
	}
	return fmt.Sprintf("ino:%d@%d.%09d", stx.Ino, stx.Btime.Sec, stx.Btime.Nsec), nil
}

func (s *Store) takeOver(lp string, dead func(string) bool) error {
	unlock, err := flockDir(s.Base)
	if err != nil {
		return err
	}
	defer unlock()
	fi, err := os.Stat(lp)
	if errors.Is(err, fs.ErrNotExist) {
		return os.Mkdir(lp, 0o755)
	}
	if err != nil {
		return err
	}
	age := time.Since(fi.ModTime())
	if age < s.LockStale {
		holder, err := lockHolder(lp)
		if err != nil || dead == nil || !dead(holder) {
			return s.conflict(fmt.Sprintf("lock %s refreshed %s ago", lp, age.Truncate(time.Second)))
		}
	}
	if err := os.Remove(lp); err != nil {
		return fmt.Errorf("remove stale lock %s: %w", lp, err)
	}
	if err := os.Mkdir(lp, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return s.conflict("another writer took over the stale lock first")
		}
		return err
	}
	return nil
}

type fsLease struct {
	*store.Heartbeat
	path   string
	holder string

	mu    sync.Mutex
	ino   uint64           // GUARDED_BY(mu)
	mtime syscall.Timespec // GUARDED_BY(mu): the mtime we last set; a recreated lock differs
}

// check verifies the lock directory is still the one we created.
func (l *fsLease) check() error {
	var st syscall.Stat_t
	if err := syscall.Stat(l.path, &st); err != nil {
		return amlerr.New(amlerr.LockLost, l.path, "lock directory is gone: %v", err)
	}
	l.mu.Lock()
	ino, mtime := l.ino, l.mtime
	l.mu.Unlock()
	if st.Ino != ino || st.Mtim != mtime {
		return amlerr.New(amlerr.LockLost, l.path, "lock was taken over by another writer")
	}
	return nil
}

// touch refreshes the lock's mtime and remembers it.
func (l *fsLease) touch() error {
	now := time.Now()
	if err := os.Chtimes(l.path, now, now); err != nil {
		return err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(l.path, &st); err != nil {
		return err
	}
	// Remember the mtime as the filesystem stored it (its granularity may
	// be coarser than ours), but only if it is the one just set: a foreign
	// touch between our write and this read must not be adopted as ours.
	if d := time.Unix(st.Mtim.Unix()).Sub(now); d > 2*time.Second || d < -2*time.Second {
		return amlerr.New(amlerr.LockLost, l.path, "lock was touched by another writer while refreshing")
	}
	l.mu.Lock()
	l.mtime = st.Mtim
	l.mu.Unlock()
	return nil
}

func (l *fsLease) Holder() string { return l.holder }

func (l *fsLease) Lost() error {
	if err := l.LostErr(); err != nil {
		return err
	}
	if err := l.check(); err != nil {
		l.SetLost(err) // as the heartbeat would have at its next tick
		return err
	}
	return nil
}

func (l *fsLease) Release(ctx context.Context) error {
	l.Halt()
	if err := l.Lost(); err != nil {
		return err
	}
	return os.Remove(l.path)
}
