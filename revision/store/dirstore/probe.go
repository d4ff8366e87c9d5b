package dirstore

import (
	"context"
	"os"

	"github.com/amlfs/amlfs/revision/store"
)

// Probe checks the store directory: it must be creatable and writable.
// Conditional publication there is a compare-and-swap under flock, which
// any local filesystem honours.
func (s *Store) Probe(ctx context.Context) store.Probe {
	var p store.Probe
	if err := os.MkdirAll(s.Base, 0o755); err != nil {
		p.Error = err.Error()
		return p
	}
	p.Reachable = true
	f, err := os.CreateTemp(s.Base, ".amlfs-check-*")
	if err != nil {
		p.Error = err.Error()
		return p
	}
	f.Close()
	os.Remove(f.Name())
	unlock, err := flockDir(s.Base)
	if err != nil {
		p.Error = err.Error()
		return p
	}
	unlock()
	p.Writable, p.IfNoneMatch, p.IfMatch = true, true, true
	return p
}
