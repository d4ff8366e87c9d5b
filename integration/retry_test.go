package integration

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// lostResponseProxy forwards every request, but for the first PUT whose
// path ends in suffix it forwards the request and then drops the
// connection instead of answering: the write landed, the client never
// heard. The SDK retries, and the retry's precondition fails against the
// write that landed.
func lostResponseProxy(t *testing.T, target, suffix string) (endpoint string, dropped *atomic.Int32) {
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	dropped = &atomic.Int32{}
	addr := freePort(t)
	srv := &http.Server{Addr: addr, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, suffix) && dropped.CompareAndSwap(0, 1) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			rec := &discardWriter{h: http.Header{}}
			rp.ServeHTTP(rec, r)
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					conn.Close()
					return
				}
			}
			return
		}
		rp.ServeHTTP(w, r)
	})}
	go srv.ListenAndServe()
	t.Cleanup(func() { srv.Close() })
	return "http://" + addr, dropped
}

type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}

// A write whose response is lost, retried by the SDK, is recognised as our
// own: the save succeeds, and the published revision is complete. Both the
// index publication and an artifact object are checked.
func TestS3LostWriteResponse(t *testing.T) {
	for _, suffix := range []string{"/workspace.json", "/files/f"} {
		t.Run(strings.TrimPrefix(suffix, "/"), func(t *testing.T) {
			srv := startS3(t, false)
			e := newS3Env(t, srv)
			e.folder() // a test of the folder layout
			endpoint, dropped := lostResponseProxy(t, srv.endpoint, suffix)
			e.storeArgs = []string{"--s3-endpoint", endpoint, "--s3-path-style"}
			mp := e.mount("lost-response")
			sh(t, mp, "echo durable > f")
			r := e.unmount(mp)
			if dropped.Load() != 1 {
				t.Fatalf("the proxy dropped %d responses", dropped.Load())
			}
			if r.code != 0 {
				t.Fatalf("save with a lost response: %s", r)
			}
			rev := strings.TrimSpace(r.stdout)
			idx := readIndex(t, e, "lost-response")
			if idx.Current != rev {
				t.Fatalf("current %s, want %s", idx.Current, rev)
			}
			if got := readFile(t, filepath.Join(e.storeD, "lost-response", "revisions", rev, "files", "f")); got != "durable\n" {
				t.Fatalf("the published revision's file holds %q", got)
			}
		})
	}
}
