package mount

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision"
)

// serveMetrics serves /metrics on --metrics-addr, if set, and Go's
// profiles under /debug/pprof/ (an operator's address, as the metrics
// are). The listener is opened before anything is mounted, so a bad
// address fails the mount.
func (d *Daemon) serveMetrics() (stop func(), err error) {
	if d.cfg.MetricsAddr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", d.cfg.MetricsAddr)
	if err != nil {
		return nil, amlerr.Wrap(amlerr.InvalidConfig, "--metrics-addr", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", d.metrics.Handler())
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("metrics server", "provider", "daemon", "op", "serve-metrics", "path", d.cfg.MetricsAddr, "err", err)
		}
	}()
	d.log.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}

// progress relays restore and save progress to the caller's hook, and
// keeps the size of the last restore for the metrics.
func (d *Daemon) progress(p revision.Progress) {
	if p.Phase == "restore" {
		d.restoredBytes.Store(p.TotalBytes)
	}
	// A save still running at its first progress report (0.2 s in) says
	// what it has left, and again every 5 s, so that a stop that outlasts
	// its grace period leaves a record of what was pending.
	if p.Phase == "save" && !p.Done && p.Elapsed >= d.nextSaveReport.Load() {
		d.nextSaveReport.Store(p.Elapsed + saveReportEvery)
		d.log.Info("saving", "files", p.Files, "totalFiles", p.TotalFiles, "bytes", p.Bytes, "totalBytes", p.TotalBytes,
			"pendingBytes", p.TotalBytes-p.Bytes, "seconds", p.Elapsed.Seconds())
	}
	if p.Phase == "save" && p.Done {
		d.nextSaveReport.Store(0) // the next save reports at its first report too
	}
	if d.hooks.Progress != nil {
		d.hooks.Progress(p)
	}
}

// saveReportEvery is how often a running save logs its progress.
const saveReportEvery = 5 * time.Second

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// registerGauges adds the figures read from the daemon's state at each
// scrape: the workspace's changes and lock, and each live mount's queue,
// health and cache.
func (d *Daemon) registerGauges() {
	m := d.metrics
	if d.ws != nil {
		m.Gauge("workspace_changes", "Mutating FUSE requests since the tree was restored or last saved.", nil, func() float64 {
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.baseMark < 0 {
				return float64(d.fs.Changes())
			}
			return float64(d.fs.Changes() - d.baseMark)
		})
		m.Gauge("workspace_dirty", "1 if the tree has changes no revision holds.", nil, func() float64 {
			d.mu.Lock()
			defer d.mu.Unlock()
			return boolGauge(d.dirtyLocked())
		})
		m.Gauge("workspace_pending_files", "Lazily restored files whose bytes are not fetched yet.", nil, func() float64 {
			n, _ := d.ws.Placeholders().Pending()
			return float64(n)
		})
		m.Gauge("workspace_pending_bytes", "Bytes of lazily restored files not fetched yet.", nil, func() float64 {
			_, b := d.ws.Placeholders().Pending()
			return float64(b)
		})
		for _, state := range []string{"held", "lost", "none"} {
			m.Gauge("lock_state", "The workspace lease: 1 for the current state (held, lost, or none when unlocked).", prometheus.Labels{"state": state},
				func() float64 { return boolGauge(d.ws.Lease().State == state) })
		}
	}
	var cached bool
	for i, p := range d.live {
		labels := prometheus.Labels{"mount": d.cfg.Live[i].Prefix}
		m.Gauge("live_healthy", "1 if the live mount's last request succeeded.", labels, func() float64 { return boolGauge(p.Health() == nil) })
		if q, ok := p.(queued); ok {
			m.Gauge("live_pending_operations", "Uploads and deletes an S3 live mount has not sent yet.", labels, func() float64 { return float64(q.Pending()) })
		}
		l, ok := p.(cacheReader)
		if !ok {
			continue
		}
		m.Counter("cache_hits_total", "Reads reaching the daemon whose bytes were in the cache.", labels, func() float64 { h, _ := l.CacheReads(); return float64(h) })
		m.Counter("cache_misses_total", "Reads reaching the daemon that had to fetch bytes.", labels, func() float64 { _, n := l.CacheReads(); return float64(n) })
		if !cached {
			cached = true
			c := l.Cache()
			m.Gauge("cache_clean_bytes", "Bytes of clean (evictable) data in the S3 data cache.", nil, func() float64 { return float64(c.Stats().Clean) })
			m.Gauge("cache_pinned_bytes", "Bytes in the S3 data cache that may not be evicted: not uploaded yet (dirty), or open for passthrough.", nil,
				func() float64 { return float64(c.Stats().Pinned) })
			m.Gauge("cache_limit_bytes", "The S3 data cache's bound (--cache-size).", nil, func() float64 { return float64(c.Stats().Limit) })
		}
	}
}

// atomicDuration is a time.Duration safe for concurrent use.
type atomicDuration struct{ v atomic.Int64 }

func (a *atomicDuration) Load() time.Duration   { return time.Duration(a.v.Load()) }
func (a *atomicDuration) Store(d time.Duration) { a.v.Store(int64(d)) }
