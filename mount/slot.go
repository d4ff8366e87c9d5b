package mount

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// claimSlot claims a working-directory slot under base: base/0, base/1, ...
// Each slot holds one mount's working tree and state file, and is claimed
// with an flock on its "owner" file. The kernel drops the flock when the
// daemon dies, so a crashed run's slot (and its unsaved tree) is claimed,
// and resumed, by the next mount of the same workspace and cache dir, while
// a concurrent --no-lock mount on this host gets a slot of its own.
func claimSlot(base string) (*os.File, error) {
	for i := 0; i < 1000; i++ {
		dir := filepath.Join(base, fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(filepath.Join(dir, "owner"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			f.Truncate(0)
			fmt.Fprintf(f, "%d\n", os.Getpid())
			return f, nil
		}
		f.Close()
		if err != unix.EWOULDBLOCK {
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
	}
	return nil, fmt.Errorf("no free working-directory slot under %s", base)
}
