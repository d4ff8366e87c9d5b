package integration

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrape reads a Prometheus text exposition into name{labels} -> value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetrics scrapes /metrics during a workload on a workspace with an S3
// live mount, and finds the counters moving: FUSE requests, S3 requests by
// operation and status, saves, cache misses and hits, queued uploads and
// the lock. `amlfs status --json` reports the same figures.
func TestMetrics(t *testing.T) {
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "m")
	l.put("obj.bin", make([]byte, 3<<20), nil)
	addr := freePort(t)
	url := "http://" + addr + "/metrics"
	// FUSE's own request counters are what it checks: served through FUSE
	// whatever AMLFS_TEST_SERVE says.
	mp := l.mount("metrics", append(l.s3Args(), "--mount", "/data=s3://"+s3Bucket+"/m", "--metrics-addr", addr, "--serve", "fuse")...)
	before := scrape(t, url)
	if before[`amlfs_lock_state{state="held"}`] != 1 {
		t.Errorf("lock_state held = %v", before[`amlfs_lock_state{state="held"}`])
	}

	sh(t, mp, `mkdir -p src && for i in $(seq 1 50); do echo $i > src/f$i; done && cat src/* >/dev/null && ls -lR >/dev/null`)
	if _, err := os.ReadFile(filepath.Join(mp, "data", "obj.bin")); err != nil {
		t.Fatal(err)
	}
	writeSynced(t, filepath.Join(mp, "data", "up.bin"), 1<<20)
	if r := l.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	after := scrape(t, url)

	moved := func(key string) {
		t.Helper()
		if after[key] <= before[key] {
			t.Errorf("%s did not move: %v -> %v", key, before[key], after[key])
		}
	}
	for _, op := range []string{"lookup", "create", "mkdir", "getattr", "release"} {
		moved(`amlfs_fuse_request_duration_seconds_count{op="` + op + `"}`)
	}
	moved(`amlfs_s3_requests_total{op="GetObject",status="206"}`)
	moved(`amlfs_s3_requests_total{op="PutObject",status="200"}`)
	moved(`amlfs_s3_requests_total{op="ListObjectsV2",status="200"}`)
	moved(`amlfs_saves_total{result="published"}`)
	moved(`amlfs_save_duration_seconds_count`)
	moved(`amlfs_cache_misses_total{mount="/data"}`)
	if after[`amlfs_cache_limit_bytes`] != 10<<30 {
		t.Errorf("cache_limit_bytes = %v", after[`amlfs_cache_limit_bytes`])
	}
	if after[`amlfs_live_healthy{mount="/data"}`] != 1 {
		t.Errorf("live_healthy = %v", after[`amlfs_live_healthy{mount="/data"}`])
	}
	if after[`amlfs_workspace_dirty`] != 0 {
		t.Errorf("workspace_dirty after a commit = %v", after[`amlfs_workspace_dirty`])
	}
	sh(t, mp, "echo more > more.txt")
	if got := scrape(t, url)[`amlfs_workspace_dirty`]; got != 1 {
		t.Errorf("workspace_dirty after a write = %v", got)
	}

	// status --json: the same names, the same counts, once the live
	// mount's background uploads (which count as PutObject too) are done.
	var st struct {
		Metrics map[string]float64
		Mounts  []struct{ Pending int }
	}
	keys := []string{`amlfs_saves_total{result="published"}`, `amlfs_s3_requests_total{op="PutObject",status="200"}`, `amlfs_lock_state{state="held"}`}
	var now map[string]float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := l.amlfs("status", mp, "--json")
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("status: %v\n%s", err, r)
		}
		now = scrape(t, url)
		same := true
		for _, key := range keys {
			same = same && st.Metrics[key] == now[key]
		}
		if same || time.Now().After(deadline) {
			break
		}
	}
	for _, key := range keys {
		if st.Metrics[key] != now[key] || now[key] == 0 {
			t.Errorf("status says %s = %v, /metrics says %v", key, st.Metrics[key], now[key])
		}
	}
}
