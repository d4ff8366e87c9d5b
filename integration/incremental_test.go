package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// countingProxy sits between amlfs and the S3 server and counts what goes
// through it, so a test can prove what a save uploaded.
type countingProxy struct {
	mu       sync.Mutex
	puts     int   // PutObject requests
	putBytes int64 // their body bytes
	copies   int   // CopyObject requests
	putKeys  []string
	fileGets int      // GETs of revision file objects
	getKeys  []string // their URL paths
	srv      *http.Server
	endpoint string
}

func startCountingProxy(t *testing.T, target string) *countingProxy {
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	cp := &countingProxy{}
	addr := freePort(t)
	cp.endpoint = "http://" + addr
	// Count PUT bodies as they stream through to the server.
	cp.srv = &http.Server{Addr: addr, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/files/") {
			cp.mu.Lock()
			cp.fileGets++
			cp.getKeys = append(cp.getKeys, r.URL.Path)
			cp.mu.Unlock()
		}
		if r.Method == http.MethodPut {
			cr := &countReader{r: r.Body}
			r.Body = cr
			defer func() {
				cp.mu.Lock()
				if r.Header.Get("X-Amz-Copy-Source") != "" {
					cp.copies++
				} else {
					cp.puts++
					cp.putBytes += cr.n.Load()
					cp.putKeys = append(cp.putKeys, r.URL.Path)
				}
				cp.mu.Unlock()
			}()
		}
		rp.ServeHTTP(w, r)
	})}
	go cp.srv.ListenAndServe()
	t.Cleanup(func() { cp.srv.Close() })
	return cp
}

// countReader counts body bytes; the proxy's transport reads the body in
// its own goroutine, hence the atomic.
type countReader struct {
	r io.ReadCloser
	n atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}
func (c *countReader) Close() error { return c.r.Close() }

func (cp *countingProxy) reset() {
	cp.mu.Lock()
	cp.puts, cp.putBytes, cp.copies, cp.putKeys, cp.fileGets, cp.getKeys = 0, 0, 0, nil, 0, nil
	cp.mu.Unlock()
}

// proxiedS3Env is an S3 env whose amlfs reaches a fresh versitygw through a
// counting proxy.
func proxiedS3Env(t *testing.T) (*s3Server, *countingProxy, *env) {
	srv := startS3(t, false)
	proxy := startCountingProxy(t, srv.endpoint)
	e := newS3Env(t, srv)
	e.storeArgs = []string{"--s3-endpoint", proxy.endpoint, "--s3-path-style"}
	return srv, proxy, e
}

// After changing 1 file of 2,000, the save uploads only that file's bytes
// (plus the manifest and index); the rest is copied server-side. The count
// of uploads does not depend on the tree's size; bench/s3bench.sh times
// the same with 10,000 files.
func TestS3IncrementalSave(t *testing.T) {
	srv, proxy, e := proxiedS3Env(t)
	e.folder() // counts requests for each file's object
	mp := e.mount("inc")
	const n = 2000
	sh(t, mp, fmt.Sprintf(`for d in $(seq 0 %d); do mkdir d$d; for f in $(seq 0 99); do echo "file $d/$f" > d$d/f$f.txt; done; done; test $(find . -type f | wc -l) = %d`, n/100-1, n))
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("first commit: %s", r)
	}
	first := readIndex(t, e, "inc").Current
	proxy.reset()
	payload := strings.Repeat("new content ", 1000) // 12000 bytes
	if err := os.WriteFile(filepath.Join(mp, "d12", "f7.txt"), []byte(payload), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.amlfs("commit", mp)
	if r.code != 0 {
		t.Fatalf("second commit: %s", r)
	}
	second := strings.TrimSpace(r.stdout)
	proxy.mu.Lock()
	puts, bytes, copies, keys := proxy.puts, proxy.putBytes, proxy.copies, proxy.putKeys
	proxy.mu.Unlock()
	// The changed file, the manifest, the index, and lock refreshes at most.
	var fileKeys []string
	for _, k := range keys {
		if strings.Contains(k, "/files/") {
			fileKeys = append(fileKeys, k)
		}
	}
	if len(fileKeys) != 1 || !strings.HasSuffix(fileKeys[0], "/files/d12/f7.txt") {
		t.Errorf("uploaded file objects: %v", fileKeys)
	}
	if copies != n-1 {
		t.Errorf("server-side copies: %d, want %d", copies, n-1)
	}
	// About 135 bytes an entry: AML's keys, mtime and the stat data.
	manifestMax := int64(n * 140)
	if bytes > int64(len(payload))+manifestMax+4096 {
		t.Errorf("uploaded %d bytes in %d PUTs; want about %d plus the manifest", bytes, puts, len(payload))
	}
	t.Logf("incremental save: %d PUTs, %d bytes, %d copies", puts, bytes, copies)
	// AML's rules hold, and the new revision restores exactly.
	idx := checkAMLStore(t, filepath.Join(e.storeD, "inc"))
	if idx.Current != second || idx.Current == first {
		t.Fatalf("index %+v", idx)
	}
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	other := newS3EnvAt(t, srv, e.prefix)
	other.folder() // a test of the folder layout
	mp2 := other.mount("inc")
	if got := readFile(t, filepath.Join(mp2, "d12", "f7.txt")); got != payload {
		t.Errorf("changed file restored as %d bytes", len(got))
	}
	if got := readFile(t, filepath.Join(mp2, "d19", "f99.txt")); got != "file 19/99\n" {
		t.Errorf("unchanged file restored as %q", got)
	}
}
