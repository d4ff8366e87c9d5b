package mount

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision"
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

// slotsDir is where a workspace's working-directory slots live.
func slotsDir(cacheDir string, store revision.Store, id string) string {
	seg, _ := revision.Seg(id)
	return filepath.Join(cacheDir, "workspaces", seg+"@"+mountKey(store.String()))
}

// PurgeCache removes a workspace's working trees and recovery state under
// cacheDir. It refuses, with AML_WORKSPACE_CONFLICT, while a mount on this
// host holds one of the slots.
func PurgeCache(cacheDir string, store revision.Store, id string) error {
	base := slotsDir(cacheDir, store, id)
	ents, err := os.ReadDir(base)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	for _, e := range ents {
		f, err := os.OpenFile(filepath.Join(base, e.Name(), "owner"), os.O_RDWR, 0)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			return amlerr.New(amlerr.WorkspaceConflict, id, "a mount on this host is using %s", filepath.Join(base, e.Name()))
		}
		held = append(held, f)
	}
	return os.RemoveAll(base)
}
