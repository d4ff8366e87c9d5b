package integration

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// faultProxy is an HTTP proxy in front of the S3 server that injects
// faults into the requests a fault matches. The signature stays valid: the
// Host header goes through unchanged.
type faultProxy struct {
	endpoint string
	srv      *http.Server
	rp       *httputil.ReverseProxy

	mu      sync.Mutex
	faults  []*fault
	stalls  chan *http.Request // each stall, once it holds its request
	release chan struct{}      // closed to end the stalls
}

type faultKind string

const (
	faultLatency  faultKind = "latency"  // delay, then forward
	faultStatus   faultKind = "status"   // answer with an S3 error
	faultReset    faultKind = "reset"    // reset the connection, answering nothing
	faultTruncate faultKind = "truncate" // forward, but cut the response body off half-way
	faultStall    faultKind = "stall"    // read part of the request body, then hang until released
	faultLost     faultKind = "lost"     // forward, let the server carry it out, then reset the connection: the reply is lost
)

type fault struct {
	kind   faultKind
	match  func(*http.Request) bool // nil: every request
	delay  time.Duration            // faultLatency
	status int                      // faultStatus
	code   string                   // faultStatus: InternalError, ServiceUnavailable, SlowDown
	every  int                      // act on one matching request in every; 0 or 1: all
	limit  int                      // act at most this often; 0: no bound
	after  *fault                   // act only once this fault has acted

	seen, acted int // GUARDED_BY(faultProxy.mu)
}

func startFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{endpoint: "http://" + ln.Addr().String(), stalls: make(chan *http.Request, 64), release: make(chan struct{})}
	p.rp = &httputil.ReverseProxy{
		Rewrite:  func(r *httputil.ProxyRequest) { r.SetURL(u); r.Out.Host = r.In.Host },
		ErrorLog: log.New(io.Discard, "", 0),
	}
	p.srv = &http.Server{Handler: p, ErrorLog: log.New(io.Discard, "", 0)}
	go p.srv.Serve(ln)
	t.Cleanup(func() {
		p.set()
		p.srv.Close()
	})
	return p
}

// set replaces the active faults (none: the proxy only forwards) and ends
// any stall in progress.
func (p *faultProxy) set(fs ...*fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = fs
	close(p.release)
	p.release = make(chan struct{})
}

// acted reports how often f has acted.
func (p *faultProxy) acted(f *fault) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return f.acted
}

// pick returns the fault to apply to r, if any, and the channel that ends
// a stall.
func (p *faultProxy) pick(r *http.Request) (*fault, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.faults {
		if f.match != nil && !f.match(r) || f.after != nil && f.after.acted == 0 {
			continue
		}
		f.seen++
		if (f.every > 1 && f.seen%f.every != 0) || (f.limit > 0 && f.acted >= f.limit) {
			continue
		}
		f.acted++
		return f, p.release
	}
	return nil, nil
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f, release := p.pick(r)
	if f == nil {
		p.rp.ServeHTTP(w, r)
		return
	}
	switch f.kind {
	case faultLatency:
		time.Sleep(f.delay)
		p.rp.ServeHTTP(w, r)
	case faultStatus:
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(f.status)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected by the test</Message></Error>`, f.code)
	case faultReset:
		reset(w)
	case faultLost:
		p.rp.ServeHTTP(httptest.NewRecorder(), r)
		reset(w)
	case faultTruncate:
		p.rp.ServeHTTP(&truncWriter{ResponseWriter: w}, r)
	case faultStall:
		io.CopyN(io.Discard, r.Body, 64<<10)
		select {
		case p.stalls <- r:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		reset(w)
	}
}

// reset closes the client's connection with a TCP RST.
func reset(w http.ResponseWriter) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// truncWriter passes on the headers, Content-Length included, and half of
// the body; then the handler aborts and the connection closes.
type truncWriter struct {
	http.ResponseWriter
	left int64
}

var errTruncated = errors.New("truncated by the test")

func (t *truncWriter) WriteHeader(code int) {
	var n int64
	fmt.Sscan(t.Header().Get("Content-Length"), &n)
	t.left = n / 2
	t.ResponseWriter.WriteHeader(code)
}

func (t *truncWriter) Write(b []byte) (int, error) {
	if int64(len(b)) <= t.left {
		t.left -= int64(len(b))
		return t.ResponseWriter.Write(b)
	}
	n, _ := t.ResponseWriter.Write(b[:t.left])
	t.left = 0
	http.NewResponseController(t.ResponseWriter).Flush()
	return n, errTruncated
}

// Request matchers.

func isGet(r *http.Request) bool {
	return r.Method == http.MethodGet && r.URL.Query().Get("list-type") == ""
}

func putTo(sub string) func(*http.Request) bool {
	return func(r *http.Request) bool { return r.Method == http.MethodPut && strings.Contains(r.URL.Path, sub) }
}

// onIndex matches requests of method to a workspace's workspace.json.
func onIndex(method string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return r.Method == method && strings.HasSuffix(r.URL.Path, "/workspace.json")
	}
}

func isDelete(r *http.Request) bool {
	return r.Method == http.MethodDelete || (r.Method == http.MethodPost && r.URL.Query().Has("delete"))
}

// waitStall waits for a stall to hold a request and returns it.
func (p *faultProxy) waitStall(t *testing.T) *http.Request {
	t.Helper()
	select {
	case r := <-p.stalls:
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("no request stalled")
		return nil
	}
}
