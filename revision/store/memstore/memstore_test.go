package memstore

import (
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/revision/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Base {
		b := NewBase()
		return storetest.Base{
			Open: func(id string) (store.Family, error) { return New(b, id) },
			Tune: func(s store.Store, refresh, stale time.Duration) {
				m := s.(*Store)
				m.LockRefresh, m.LockStale = refresh, stale
			},
			Raw: func(id, key string, data []byte) {
				seg, err := format.Seg(id)
				if err != nil {
					t.Fatal(err)
				}
				b.Set(seg+"/"+key, data)
			},
			Break: func(err error) {
				if err == nil {
					b.Fail(nil)
					return
				}
				b.Fail(func(op, key string) error { return err })
			},
		}
	})
}
