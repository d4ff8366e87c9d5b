package revision

import (
	"io"
	"sync/atomic"
	"time"
)

// Progress is a snapshot of a long restore or save.
type Progress struct {
	Phase      string // "restore" or "save"
	Files      int64
	TotalFiles int64
	Bytes      int64
	TotalBytes int64
	Elapsed    time.Duration
	Done       bool
}

// progress counts a phase's work; report publishes it every interval.
type progress struct {
	phase      string
	files      atomic.Int64
	bytes      atomic.Int64
	totalFiles int64
	totalBytes int64
	start      time.Time
	stop       chan struct{}
	done       chan struct{}
	report     func(Progress)
}

const progressInterval = 200 * time.Millisecond

// startProgress begins reporting a phase to fn, if fn is set.
func startProgress(fn func(Progress), phase string, totalFiles, totalBytes int64) *progress {
	p := &progress{phase: phase, totalFiles: totalFiles, totalBytes: totalBytes, start: time.Now(),
		stop: make(chan struct{}), done: make(chan struct{}), report: fn}
	if fn == nil {
		close(p.done)
		return p
	}
	go func() {
		defer close(p.done)
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				fn(p.snapshot(true))
				return
			case <-t.C:
				fn(p.snapshot(false))
			}
		}
	}()
	return p
}

func (p *progress) snapshot(done bool) Progress {
	return Progress{Phase: p.phase, Files: p.files.Load(), TotalFiles: p.totalFiles, Bytes: p.bytes.Load(),
		TotalBytes: p.totalBytes, Elapsed: time.Since(p.start), Done: done}
}

// finish stops reporting, with a last report.
func (p *progress) finish() {
	if p.report != nil {
		close(p.stop)
	}
	<-p.done
}

// fileDone counts one file (whose bytes were counted as they moved).
func (p *progress) fileDone() { p.files.Add(1) }

// reader counts bytes as they are read.
func (p *progress) reader(r io.Reader) io.Reader { return &progressReader{r: r, p: p} }

type progressReader struct {
	r io.Reader
	p *progress
}

func (pr *progressReader) Read(b []byte) (int, error) {
	n, err := pr.r.Read(b)
	pr.p.bytes.Add(int64(n))
	return n, err
}

// reset starts the count over (a save that tries again another way).
func (p *progress) reset() {
	p.files.Store(0)
	p.bytes.Store(0)
}
