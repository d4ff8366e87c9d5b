package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

func TestSnapshotMatchesInstruments(t *testing.T) {
	m := New()
	m.Observe("lookup", time.Now(), fuse.OK)
	m.Observe("lookup", time.Now(), fuse.ENOENT)
	m.S3Request("PutObject", 200, time.Millisecond)
	m.S3Request("GetObject", 0, time.Millisecond)
	m.Save("published", time.Second, 10, 5)
	m.Gauge("answer", "a test gauge", nil, func() float64 { return 42 })
	snap := m.Snapshot()
	for key, want := range map[string]float64{
		`amlfs_fuse_request_duration_seconds_count{op="lookup"}`: 2,
		`amlfs_fuse_request_errors_total{errno="2",op="lookup"}`: 1,
		`amlfs_s3_requests_total{op="PutObject",status="200"}`:   1,
		`amlfs_s3_requests_total{op="GetObject",status="error"}`: 1,
		`amlfs_saves_total{result="published"}`:                  1,
		`amlfs_save_bytes_total{kind="uploaded"}`:                10,
		`amlfs_save_bytes_total{kind="reused"}`:                  5,
		`amlfs_answer`:                                           42,
	} {
		if snap[key] != want {
			t.Errorf("%s = %v, want %v", key, snap[key], want)
		}
	}
	for k := range snap {
		if !strings.HasPrefix(k, "amlfs_") {
			t.Errorf("snapshot has %s", k)
		}
	}
	var nilM *Metrics
	nilM.Observe("x", time.Now(), fuse.OK) // a nil *Metrics records nothing
}

// BenchmarkObserve is the cost metrics add to every FUSE request.
func BenchmarkObserve(b *testing.B) {
	m := New()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Observe("getattr", start, fuse.OK)
		}
	})
}
