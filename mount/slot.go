package mount

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/atomicfile"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

// A slot holds its working tree in workDirName, and stateFile while that
// tree may hold unsaved work.
const (
	workDirName = "work"
	stateFile   = "state.json"
)

// claimSlot claims a working-directory slot under base: base/0, base/1, ...
// Each slot holds one mount's working tree and state file, and is claimed
// with an flock on its "owner" file. The kernel drops the flock when the
// daemon dies, so a crashed run's slot (and its unsaved tree) is claimed,
// and resumed, by the next mount of the same workspace and cache dir, while
// a concurrent --no-lock mount on this host gets a slot of its own. A free
// slot with unsaved work is preferred over an empty one.
func claimSlot(base string) (*os.File, error) {
	var spare *os.File // the first free slot without unsaved work
	for i := 0; i < 1000; i++ {
		dir := filepath.Join(base, fmt.Sprint(i))
		if _, err := os.Stat(dir); os.IsNotExist(err) && spare != nil {
			break // past the slots in use: settle for the spare
		}
		f, err := tryClaim(dir)
		if err != nil {
			if spare != nil {
				spare.Close()
			}
			return nil, err
		}
		if f == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, stateFile)); err == nil {
			if spare != nil {
				spare.Close()
			}
			return stampOwner(f), nil
		}
		if spare == nil {
			spare = f
		} else {
			f.Close()
		}
	}
	if spare == nil {
		return nil, fmt.Errorf("no free working-directory slot under %s", base)
	}
	return stampOwner(spare), nil
}

// tryClaim flocks dir's owner file, making both if needed. It returns nil
// and no error if another process holds the slot.
func tryClaim(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "owner"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return f, nil
	}
	f.Close()
	if err != unix.EWOULDBLOCK {
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return nil, nil
}

func stampOwner(f *os.File) *os.File {
	f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return f
}

// leaseRecord notes, in the workspace's slots directory, which mount on
// this host holds the workspace's lease. After a crash it lets the next
// mount take over a lease that is not stale yet: the holder is dead when
// the record names it, on this host, and the flock on its slot is free,
// which the kernel guarantees only once the process is gone.
type leaseRecord struct {
	Holder string `json:"holder"`
	Slot   string `json:"slot"`
	PID    int    `json:"pid"`
	Host   string `json:"host"`
}

func leaseRecordPath(base string) string { return filepath.Join(base, "lease.json") }

// writeLeaseRecord records that this process, in slot, holds the lease
// named holder.
func writeLeaseRecord(base string, slot *os.File, holder string) error {
	host, _ := os.Hostname()
	data, _ := json.Marshal(leaseRecord{Holder: holder, Slot: filepath.Base(filepath.Dir(slot.Name())), PID: os.Getpid(), Host: host})
	return atomicfile.Write(leaseRecordPath(base), "", data, 0o600)
}

// deadHolder returns the test revision.Options.DeadHolder wants for the
// workspace whose slots are under base. own is the slot this process holds,
// or nil. notify, if set, is told of a takeover.
func deadHolder(base string, own *os.File, notify func(string, ...any)) func(string) bool {
	return func(holder string) bool {
		data, err := os.ReadFile(leaseRecordPath(base))
		if err != nil {
			return false
		}
		var rec leaseRecord
		host, _ := os.Hostname()
		if json.Unmarshal(data, &rec) != nil || rec.Holder != holder || rec.Host != host || !validSlot(rec.Slot) {
			return false
		}
		dir := filepath.Join(base, rec.Slot)
		if own == nil || filepath.Dir(own.Name()) != dir {
			f, err := tryClaim(dir)
			if f == nil || err != nil {
				return false // alive: it still holds its slot
			}
			f.Close()
		}
		if notify != nil {
			notify("taking over the workspace lease of pid %d on this host, which died without releasing it", rec.PID)
		}
		return true
	}
}

func validSlot(s string) bool {
	_, err := strconv.ParseUint(s, 10, 16)
	return err == nil
}

// DeadHolder is deadHolder for a process that holds no slot (destroy).
func DeadHolder(cacheDir string, st store.Store, id string) func(string) bool {
	return deadHolder(slotsDir(cacheDir, st, id), nil, nil)
}

// slotsDir is where a workspace's working-directory slots live: named
// after the id, or, for an id too long for a file name (AML takes ids of
// any length), after its hash; the state file keeps the id itself.
func slotsDir(cacheDir string, st store.Store, id string) string {
	seg, _ := format.Seg(id)
	if len(seg) > maxSegName {
		sum := sha256.Sum256([]byte(id))
		seg = "id-" + hex.EncodeToString(sum[:16])
	}
	return filepath.Join(cacheDir, "workspaces", seg+"@"+mountKey(st.String()))
}

// maxSegName is the longest id segment a slots directory is named after:
// with "@" and the store's key, the name stays well under NAME_MAX (255).
const maxSegName = 200

// PurgeCache removes a workspace's working trees and recovery state under
// cacheDir. It refuses, with AML_WORKSPACE_CONFLICT, while a mount on this
// host holds one of the slots.
func PurgeCache(cacheDir string, st store.Store, id string) error {
	base := slotsDir(cacheDir, st, id)
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
		if !e.IsDir() {
			continue
		}
		f, err := tryClaim(filepath.Join(base, e.Name()))
		if err != nil {
			return err
		}
		if f == nil {
			return amlerr.New(amlerr.WorkspaceConflict, id, "a mount on this host is using %s", filepath.Join(base, e.Name()))
		}
		held = append(held, f)
	}
	return os.RemoveAll(base)
}
