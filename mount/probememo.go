package mount

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/atomicfile"
	"github.com/amlfs/amlfs/revision/store"
)

// ProbeTTL is how long this host trusts that a store honours conditional
// writes, once its probe said so (the probe costs 4 PUTs and a DELETE).
const ProbeTTL = 24 * time.Hour

// A ProbeMemo remembers, per host and user, that a store passed the
// conditional-write probe (store.Probe): one file per store under the
// user's cache directory, trusted only if it is a regular file this user
// owns and no one else may write, younger than ProbeTTL. Only a safe
// store is remembered: an unsafe or unreachable one is probed each time.
type ProbeMemo struct {
	path string
	now  func() time.Time
}

// NewProbeMemo is the memo of the store at url (with its S3 endpoint, if
// any) under the cache directory dir; dir "" remembers nothing.
func NewProbeMemo(dir, url, endpoint string) ProbeMemo {
	if dir == "" {
		return ProbeMemo{}
	}
	sum := sha256.Sum256([]byte(url + "\x00" + endpoint))
	return ProbeMemo{path: filepath.Join(dir, "probes", hex.EncodeToString(sum[:16])+".json"), now: time.Now}
}

// fresh reports whether the store passed its probe within ProbeTTL.
func (m ProbeMemo) fresh() bool {
	if m.path == "" {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(m.path, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Uid != uint32(os.Geteuid()) || st.Mode&0o022 != 0 {
		return false
	}
	age := m.now().Sub(time.Unix(st.Mtim.Unix()))
	return age >= 0 && age < ProbeTTL
}

// remember notes that the store passed its probe now.
func (m ProbeMemo) remember(p store.Probe) {
	if m.path == "" {
		return
	}
	if err := os.MkdirAll(filepath.Dir(m.path), 0o700); err != nil {
		return
	}
	data, _ := json.Marshal(struct {
		Probe store.Probe `json:"probe"`
		At    time.Time   `json:"at"`
	}{p, m.now()})
	atomicfile.Write(m.path, "", data, 0o600)
}

// probe runs st's probe unless the memo says it passed lately.
func (m ProbeMemo) probe(ctx context.Context, st store.Store) store.Probe {
	if m.fresh() {
		return store.Probe{Reachable: true, Writable: true, IfNoneMatch: true, IfMatch: true}
	}
	p := st.Probe(ctx)
	if p.Safe() {
		m.remember(p)
	}
	return p
}
