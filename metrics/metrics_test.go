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
	m.S3Request("PutObject")(200)
	m.S3Request("GetObject")(0)
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

// The wait is the union of the requests' intervals, not their sum.
func TestWaitIsUnionOfRequests(t *testing.T) {
	m := New()
	w := &m.wait[0]
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	w.begin(at(0))    // a: 0..100
	w.begin(at(50))   // b: 50..300, overlapping a
	w.end(at(100))    // a ends
	w.end(at(300))    // b ends: 300 ms so far, not 350
	w.begin(at(1000)) // c: 1000..1100, after a gap
	w.end(at(1100))
	if got := m.Snapshot()[`amlfs_s3_wait_seconds_total{ops="all"}`]; got < 0.3999 || got > 0.4001 {
		t.Fatalf("wait = %v s, want 0.4", got)
	}
	// A server copy counts in both series; a GET only in "all".
	m.S3Request("UploadPartCopy")(200)
	m.S3Request("GetObject")(200)
	snap := m.Snapshot()
	if snap[`amlfs_s3_wait_seconds_total{ops="server_copy"}`] <= 0 || snap[`amlfs_s3_wait_seconds_total{ops="server_copy"}`] > snap[`amlfs_s3_wait_seconds_total{ops="all"}`]-0.4 {
		t.Fatalf("server_copy wait %v against all %v", snap[`amlfs_s3_wait_seconds_total{ops="server_copy"}`], snap[`amlfs_s3_wait_seconds_total{ops="all"}`])
	}
}
