package dirstore

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/revision/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Base {
		base := filepath.Join(t.TempDir(), "store")
		return storetest.Base{
			Open: func(id string) (store.Family, error) { return New(base, id) },
			Tune: func(s store.Store, refresh, stale time.Duration) {
				d := s.(*Store)
				d.LockRefresh, d.LockStale = refresh, stale
			},
			Raw: func(id, key string, data []byte) {
				seg, err := format.Seg(id)
				if err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(base, seg, filepath.FromSlash(key))
				if data == nil {
					os.RemoveAll(p)
					return
				}
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			Root: base,
		}
	})
}
