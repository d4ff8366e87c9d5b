// Package metrics holds amlfs's Prometheus metrics: one registry per
// daemon (no globals), instruments the other layers report to, and the
// same figures as plain numbers for `amlfs status --json`.
package metrics

import (
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Metrics is one daemon's instruments. A nil *Metrics records nothing.
type Metrics struct {
	reg *prometheus.Registry

	fuseOps    *prometheus.HistogramVec
	fuseByOp   sync.Map // op -> prometheus.Observer: the label lookup, once per op
	fuseErrors *prometheus.CounterVec
	s3Reqs     *prometheus.CounterVec
	s3Seconds  *prometheus.HistogramVec
	s3Wait     *prometheus.CounterVec
	wait       [2]waiting // s3Wait's two series: all requests, server copies
	saves      *prometheus.CounterVec
	saveSecs   prometheus.Histogram
	frozen     prometheus.Histogram
	saveBytes  *prometheus.CounterVec
	restores   *prometheus.CounterVec
	restSecs   prometheus.Histogram
	restBytes  prometheus.Counter
}

// New makes the instruments, in a registry of their own with the Go
// runtime's and the process's collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := prometheus.WrapRegistererWithPrefix("amlfs_", reg)
	m := &Metrics{reg: reg}
	m.fuseOps = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "fuse_request_duration_seconds", Help: "FUSE requests served by the daemon, by operation (passthrough reads and writes never reach it).",
		Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
	}, []string{"op"})
	m.fuseErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fuse_request_errors_total", Help: "FUSE requests answered with an error, by operation and errno.",
	}, []string{"op", "errno"})
	m.s3Reqs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "s3_requests_total", Help: "S3 HTTP requests (each attempt), by operation and HTTP status (\"error\" when no response came).",
	}, []string{"op", "status"})
	m.s3Seconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "s3_request_duration_seconds", Help: "S3 HTTP request time to response headers, by operation.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
	}, []string{"op"})
	m.s3Wait = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "s3_wait_seconds_total", Help: "Wall-clock time with at least one S3 request in flight: of any operation (ops=\"all\"), or of the server's own copies (ops=\"server_copy\": CopyObject, UploadPartCopy, CompleteMultipartUpload). A save's own time is its time less the growth of ops=\"all\".",
	}, []string{"ops"})
	m.wait[0].c = m.s3Wait.WithLabelValues("all")
	m.wait[1].c = m.s3Wait.WithLabelValues("server_copy")
	m.saves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "saves_total", Help: "Saves, by result: published, unchanged (nothing to write), or failed.",
	}, []string{"result"})
	m.saveSecs = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "save_duration_seconds", Help: "Time of saves that published a revision.", Buckets: prometheus.ExponentialBuckets(0.01, 4, 9),
	})
	m.frozen = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "writers_frozen_seconds", Help: "How long each checkpoint held the writers' cgroup frozen (--freeze-cgroup, amlfs exec): the longest a writer waited.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
	})
	m.saveBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "save_bytes_total", Help: "File bytes of published revisions: uploaded, or reused from the previous revision.",
	}, []string{"kind"})
	m.restores = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "restores_total", Help: "Restores of a revision at mount, by result.",
	}, []string{"result"})
	m.restSecs = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "restore_duration_seconds", Help: "Time to restore a revision until the mount is ready.", Buckets: prometheus.ExponentialBuckets(0.01, 4, 9),
	})
	m.restBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "restore_bytes_total", Help: "File bytes of restored revisions (lazily restored files count when restored as placeholders).",
	})
	f.MustRegister(m.fuseOps, m.fuseErrors, m.s3Reqs, m.s3Seconds, m.s3Wait, m.saves, m.saveSecs, m.frozen, m.saveBytes, m.restores, m.restSecs, m.restBytes)
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Observe records one FUSE request; it makes *Metrics a fuse.OpObserver.
func (m *Metrics) Observe(op string, start time.Time, st fuse.Status) {
	if m == nil {
		return
	}
	o, ok := m.fuseByOp.Load(op)
	if !ok {
		o, _ = m.fuseByOp.LoadOrStore(op, m.fuseOps.WithLabelValues(op))
	}
	o.(prometheus.Observer).Observe(time.Since(start).Seconds())
	if st != fuse.OK {
		m.fuseErrors.WithLabelValues(op, strconv.Itoa(int(st))).Inc()
	}
}

// S3Request records one S3 HTTP request as it starts; the function it
// returns records its end, with the response's status (0 when none came).
func (m *Metrics) S3Request(op string) (done func(status int)) {
	if m == nil {
		return func(int) {}
	}
	start := time.Now()
	w := m.wait[:1]
	if serverCopy(op) {
		w = m.wait[:]
	}
	for i := range w {
		w[i].begin(start)
	}
	return func(status int) {
		end := time.Now()
		for i := range w {
			w[i].end(end)
		}
		s := "error"
		if status > 0 {
			s = strconv.Itoa(status)
		}
		m.s3Reqs.WithLabelValues(op, s).Inc()
		m.s3Seconds.WithLabelValues(op).Observe(end.Sub(start).Seconds())
	}
}

// serverCopy tells the operations whose time is the server moving bytes
// it already holds.
func serverCopy(op string) bool {
	return op == "CopyObject" || op == "UploadPartCopy" || op == "CompleteMultipartUpload"
}

// waiting adds to a counter the union of the intervals during which at
// least one request was in flight: requests run in parallel, so the sum
// of their durations overstates the wait.
type waiting struct {
	mu       sync.Mutex
	inFlight int
	since    time.Time
	c        prometheus.Counter
}

func (w *waiting) begin(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inFlight == 0 {
		w.since = t
	}
	w.inFlight++
}

func (w *waiting) end(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inFlight--
	if w.inFlight == 0 {
		w.c.Add(t.Sub(w.since).Seconds())
	}
}

// Save records a save: published (with its uploaded and reused bytes),
// unchanged, or failed.
func (m *Metrics) Save(result string, d time.Duration, uploaded, reused int64) {
	if m == nil {
		return
	}
	m.saves.WithLabelValues(result).Inc()
	if result == "published" {
		m.saveSecs.Observe(d.Seconds())
		m.saveBytes.WithLabelValues("uploaded").Add(float64(uploaded))
		m.saveBytes.WithLabelValues("reused").Add(float64(reused))
	}
}

// Frozen records how long a checkpoint held the writers frozen.
func (m *Metrics) Frozen(d time.Duration) {
	if m == nil {
		return
	}
	m.frozen.Observe(d.Seconds())
}

// Restore records a restore at mount.
func (m *Metrics) Restore(ok bool, d time.Duration, bytes int64) {
	if m == nil {
		return
	}
	if !ok {
		m.restores.WithLabelValues("failed").Inc()
		return
	}
	m.restores.WithLabelValues("ok").Inc()
	m.restSecs.Observe(d.Seconds())
	m.restBytes.Add(float64(bytes))
}

// Gauge registers amlfs_NAME, read from fn at each scrape, with constant
// labels (such as the live mount's prefix).
func (m *Metrics) Gauge(name, help string, labels prometheus.Labels, fn func() float64) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "amlfs_" + name, Help: help, ConstLabels: labels}, fn))
}

// Counter registers amlfs_NAME, a counter read from fn at each scrape.
func (m *Metrics) Counter(name, help string, labels prometheus.Labels, fn func() float64) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "amlfs_" + name, Help: help, ConstLabels: labels}, fn))
}

// Snapshot returns every amlfs_ series as name{labels} -> value, the same
// figures /metrics serves: counters and gauges as their value, histograms
// as NAME_count and NAME_sum.
func (m *Metrics) Snapshot() map[string]float64 {
	if m == nil {
		return nil
	}
	mfs, err := m.reg.Gather()
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "amlfs_") {
			continue
		}
		for _, mt := range mf.GetMetric() {
			key := name + labelString(mt.GetLabel())
			switch {
			case mt.Counter != nil:
				out[key] = mt.Counter.GetValue()
			case mt.Gauge != nil:
				out[key] = mt.Gauge.GetValue()
			case mt.Histogram != nil:
				out[name+"_count"+labelString(mt.GetLabel())] = float64(mt.Histogram.GetSampleCount())
				out[name+"_sum"+labelString(mt.GetLabel())] = mt.Histogram.GetSampleSum()
			}
		}
	}
	return out
}

func labelString(ls []*dto.LabelPair) string {
	if len(ls) == 0 {
		return ""
	}
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		parts = append(parts, l.GetName()+"="+strconv.Quote(l.GetValue()))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}
