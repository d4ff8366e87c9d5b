package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// faultyS3Env is an S3 store env whose daemon reaches versitygw through a
// fault proxy, with a short stall timeout.
func faultyS3Env(t *testing.T) (*env, *faultProxy) {
	srv := startS3(t, false)
	px := startFaultProxy(t, srv.endpoint)
	e := newS3Env(t, srv)
	e.storeArgs = []string{"--s3-endpoint", px.endpoint, "--s3-path-style", "--s3-timeout", "3s"}
	return e, px
}

// host is e seen from another machine: its own cache and runtime dirs.
func (e *env) host(t *testing.T) *env {
	h := *e
	h.t = t
	h.root = t.TempDir()
	h.cache = filepath.Join(h.root, "cache")
	h.runtime = filepath.Join(h.root, "run")
	return &h
}

// checkReads reads every file want names under mp: each read gives the
// right bytes or EIO, never other bytes. It returns how many gave EIO.
func checkReads(t *testing.T, mp string, want map[string][]byte) int {
	t.Helper()
	eio := 0
	for rel, data := range want {
		got, err := os.ReadFile(filepath.Join(mp, rel))
		switch {
		case errors.Is(err, syscall.EIO):
			eio++
		case err != nil:
			t.Errorf("read %s: %v (want the bytes or EIO)", rel, err)
		case !bytes.Equal(got, data):
			t.Errorf("read %s: WRONG BYTES: %d bytes, want %d", rel, len(got), len(data))
		}
	}
	return eio
}

// fileSet writes files of several sizes under mp and returns their
// contents, by path.
func fileSet(t *testing.T, mp, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for i, size := range []int{0, 1, 5000, 300 << 10, 3 << 20, 9<<20 + 3} {
		rel := filepath.Join(dir, fmt.Sprintf("f%d", i))
		writeSynced(t, filepath.Join(mp, rel), size)
		data, err := os.ReadFile(filepath.Join(mp, rel))
		if err != nil {
			t.Fatal(err)
		}
		out[rel] = data
	}
	return out
}

// namedFault is one case of the fault tests.
type namedFault struct {
	name string
	f    *fault
}

// transientFaults are the faults a client must ride out: latency, and one
// request in two failing with 500, 503, SlowDown (at most 8 of those: the
// SDK backs off long on throttling), a reset, or a body cut off half-way.
func transientFaults(latency time.Duration) []namedFault {
	return []namedFault{
		{"latency", &fault{kind: faultLatency, delay: latency}},
		{"500", &fault{kind: faultStatus, status: 500, code: "InternalError", every: 2}},
		{"503", &fault{kind: faultStatus, status: 503, code: "ServiceUnavailable", every: 2}},
		{"SlowDown", &fault{kind: faultStatus, status: 503, code: "SlowDown", every: 2, limit: 8}},
		{"reset", &fault{kind: faultReset, every: 2}},
		{"truncated body", &fault{kind: faultTruncate, match: isGet, every: 2}},
	}
}

// currentRevision reads workspace id's current revision from the store.
func (e *env) currentRevision(id string) string {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.storeD, id, "workspace.json"))
	if err != nil {
		e.t.Fatal(err)
	}
	var idx struct{ Current string }
	json.Unmarshal(data, &idx)
	return idx.Current
}

// TestFaultsWorkspaceS3 restores, reads and saves an S3 workspace through
// each fault: reads give the right bytes or EIO, a save publishes a whole
// revision or leaves the previous one current, and with the faults gone
// everything works again.
func TestFaultsWorkspaceS3(t *testing.T) {
	e, px := faultyS3Env(t)
	e.folder() // the faults target a file's object
	mp := e.mount("faulty")
	want := fileSet(t, mp, "base")
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	for _, tc := range transientFaults(150 * time.Millisecond) {
		t.Run(tc.name, func(t *testing.T) {
			h := e.host(t)
			before := e.currentRevision("faulty")
			px.set(tc.f)
			mp := filepath.Join(h.root, "mnt")
			if r := h.mountAt(mp, "faulty"); r.code != 0 {
				t.Fatalf("mount under %s: %s", tc.name, r)
			}
			// One request in two fails, and retries (the SDK's, and the
			// resumed bodies) cover that: no read may fail, let alone
			// give wrong bytes.
			if n := checkReads(t, mp, want); n > 0 {
				t.Errorf("%d of %d reads gave EIO under %s", n, len(want), tc.name)
			}
			// A save under the fault: all or nothing, and with retries,
			// all.
			more := fileSet(t, mp, tc.name)
			r := h.amlfs("commit", mp)
			after := e.currentRevision("faulty")
			if r.code != 0 {
				if after != before {
					t.Fatalf("a failed commit (%s) moved current from %s to %s", r, before, after)
				}
				t.Errorf("commit under %s failed: %s", tc.name, r)
			} else if rev := strings.TrimSpace(r.stdout); rev != after {
				t.Fatalf("commit printed %s, the index says %s", rev, after)
			}
			acted := px.acted(tc.f)
			px.set()
			if acted == 0 {
				t.Fatalf("the %s fault never acted", tc.name)
			}
			// The faults are gone: every read is right, and saves work.
			if n := checkReads(t, mp, want); n > 0 {
				t.Fatalf("%d reads still fail after the faults stopped", n)
			}
			for k, v := range more {
				want[k] = v
			}
			if r := h.unmount(mp); r.code != 0 {
				t.Fatalf("unmount after the faults: %s", r)
			}
			// What is current is whole.
			e.verifyCurrent(t, "faulty", want)
		})
	}
}

// TestFaultsStalledUpload stalls an upload mid-body: the daemon gives up on
// the silent connection after --s3-timeout and retries, and the save
// completes.
func TestFaultsStalledUpload(t *testing.T) {
	e, px := faultyS3Env(t)
	e.folder() // the faults target a file's object
	mp := e.mount("stall")
	want := fileSet(t, mp, "d")
	f := &fault{kind: faultStall, match: putTo("/files/d/f5"), limit: 1}
	px.set(f)
	start := time.Now()
	r := e.amlfs("commit", mp)
	if r.code != 0 {
		t.Fatalf("commit with a stalled upload: %s", r)
	}
	if px.acted(f) != 1 {
		t.Fatalf("the stall acted %d times", px.acted(f))
	}
	t.Logf("commit with one stalled upload took %s", time.Since(start).Round(time.Millisecond))
	px.set()
	e.unmount(mp)
	e.verifyCurrent(t, "stall", want)
}

// verifyCurrent mounts workspace id's current revision on another host,
// without taking the lease or saving, and checks every file in want.
func (e *env) verifyCurrent(t *testing.T, id string, want ...map[string][]byte) {
	t.Helper()
	v := e.host(t)
	mp := filepath.Join(v.root, "verify")
	if r := v.mountAt(mp, id, "--no-lock", "--save", "never"); r.code != 0 {
		t.Fatalf("load the current revision: %s", r)
	}
	for _, w := range want {
		if n := checkReads(t, mp, w); n > 0 {
			t.Fatalf("%d reads of the current revision failed", n)
		}
	}
	v.unmount(mp)
}

// TestKillDuringSave kills the daemon with SIGKILL at each step of a save
// (during the upload, between upload and publication, during the prune),
// holding it there: on S3 by stalling the step's request in the fault
// proxy, on a file store by holding the step's file operation in a FUSE
// gate under the store. The previous revision stays current and loadable,
// the next mount resumes the tree, its save succeeds, and it removes the
// orphan artifacts.
func TestKillDuringSave(t *testing.T) {
	steps := []string{"upload", "publish", "prune"}
	t.Run("file", func(t *testing.T) {
		e := newEnv(t)
		e.folder() // a test of the folder layout
		g := mountGateFS(t)
		e.storeD = g.dir
		e.store = "file://" + g.dir
		arms := map[string]func(op, name string) bool{
			"upload": func(op, name string) bool { return op == "create" && name == "f4" },
			// The index's temporary file: a held operation completes
			// once released, and the rename would publish.
			"publish": func(op, name string) bool { return op == "create" && strings.HasPrefix(name, ".tmp-workspace.json") },
			"prune":   func(op, name string) bool { return op == "unlink" },
		}
		for _, step := range steps {
			t.Run(step, func(t *testing.T) {
				testKillDuringSave(t, e, step, func() { g.set(arms[step]) }, func() { g.waitHeld(t) }, func() { g.set(nil) })
			})
		}
	})
	t.Run("s3", func(t *testing.T) {
		e, px := faultyS3Env(t)
		e.folder() // the faults target a file's object
		matches := map[string]func(r *http.Request) bool{
			"upload":  putTo("/files/step/f4"),
			"publish": putTo("/workspace.json"),
			"prune":   isDelete,
		}
		for _, step := range steps {
			t.Run(step, func(t *testing.T) {
				testKillDuringSave(t, e, step, func() { px.set(&fault{kind: faultStall, match: matches[step], limit: 1}) },
					func() { px.waitStall(t) }, func() { px.set() })
			})
		}
	})
}

func testKillDuringSave(t *testing.T, e0 *env, step string, hold, held, release func()) {
	e := *e0
	e.t = t
	id := "kill-" + step
	published := step == "prune"
	mp := e.mount(id)
	first := fileSet(t, mp, "first")
	if r := e.amlfs("commit", mp); r.code != 0 {
		t.Fatalf("commit: %s", r)
	}
	prev := e.currentRevision(id)
	second := fileSet(t, mp, "step")
	hold()
	pid := e.pid(mp)
	done := make(chan result, 1)
	go func() { done <- e.amlfs("commit", mp) }()
	held()
	// Status answers while the save is held up. (A prune runs after the
	// save has published and returned.)
	if st := e.amlfs("status", mp, "--json"); step != "prune" && !strings.Contains(st.stdout, `"phase": "committing"`) {
		t.Errorf("status during the save: %s", st)
	}
	// SIGKILL, then release the held operation: a thread inside a FUSE
	// request that has reached the server cannot die until it is
	// answered, but the answer brings it back only to die.
	syscall.Kill(pid, syscall.SIGKILL)
	release()
	e.kill(mp, pid)
	<-done

	cur := e.currentRevision(id)
	if !published && cur != prev {
		t.Fatalf("killed before publication, yet current moved from %s to %s", prev, cur)
	}
	if published && cur == prev {
		t.Fatalf("killed during the prune, yet current is still %s", prev)
	}
	// Whatever is current loads, whole.
	if published {
		e.verifyCurrent(t, id, first, second)
	} else {
		e.verifyCurrent(t, id, first)
	}
	if orphans := e.orphans(id); len(orphans) == 0 {
		t.Fatalf("the kill left no orphan artifacts; it did not stop the save at the %s step", step)
	}

	// The next mount resumes, its save succeeds and cleans up.
	if r := e.mountAt(mp, id); r.code != 0 || !strings.Contains(r.stderr, "resuming unsaved work") {
		t.Fatalf("remount: %s", r)
	}
	checkReads(t, mp, first)
	checkReads(t, mp, second)
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("save after the kill: %s", r)
	}
	if orphans := e.orphans(id); len(orphans) > 0 {
		t.Fatalf("orphan artifacts left after the next save: %v", orphans)
	}
}

// orphans lists the artifacts under workspace id's revisions/ that its
// index does not name.
func (e *env) orphans(id string) []string {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.storeD, id, "workspace.json"))
	if err != nil {
		e.t.Fatal(err)
	}
	var idx struct{ Revisions []struct{ Path string } }
	json.Unmarshal(data, &idx)
	known := map[string]bool{}
	for _, r := range idx.Revisions {
		known[strings.TrimSuffix(strings.TrimPrefix(r.Path, "revisions/"), "/")] = true
	}
	if e.kind != "s3" {
		var orphans []string
		for _, dir := range []string{"revisions", ".amlfs-staging"} {
			ents, _ := os.ReadDir(filepath.Join(e.storeD, id, dir))
			for _, d := range ents {
				if dir != "revisions" || !known[d.Name()] {
					orphans = append(orphans, dir+"/"+d.Name())
				}
			}
		}
		return orphans
	}
	out, err := e.client().ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(s3Bucket),
		Prefix: aws.String(e.prefix + "/" + id + "/revisions/"), Delimiter: aws.String("/")})
	if err != nil {
		e.t.Fatal(err)
	}
	var orphans []string
	for _, p := range out.CommonPrefixes {
		name := strings.TrimSuffix(strings.TrimPrefix(aws.ToString(p.Prefix), e.prefix+"/"+id+"/revisions/"), "/")
		if !known[name] {
			orphans = append(orphans, name)
		}
	}
	for _, o := range out.Contents {
		name := strings.TrimPrefix(aws.ToString(o.Key), e.prefix+"/"+id+"/revisions/")
		if !known[name] {
			orphans = append(orphans, name)
		}
	}
	sort.Strings(orphans)
	return orphans
}

// TestFaultsLiveS3 reads and writes an S3 live mount through each fault:
// reads give the right bytes or EIO, never others; an outage gives EIO and
// an unhealthy status, not a hang; and once the faults stop, the mount
// works again.
func TestFaultsLiveS3(t *testing.T) {
	srv := startS3(t, false)
	px := startFaultProxy(t, srv.endpoint)
	l := newLiveS3(t, srv, "flt")
	l.endpoint = px.endpoint
	want := map[string][]byte{}
	for i, size := range []int{0, 1, 5000, 3 << 20, 40<<20 + 5} {
		data := make([]byte, size)
		rand.Read(data)
		key := fmt.Sprintf("o%d", i)
		l.put(key, data, nil)
		want[filepath.Join("s", key)] = data
	}
	mp := l.mountNone("flt", "--s3-timeout", "3s", "--metadata-ttl", "1s")
	refresh := func() {
		if r := l.amlfs("refresh", mp); r.code != 0 {
			t.Fatalf("refresh: %s", r)
		}
	}
	for _, tc := range transientFaults(100 * time.Millisecond) {
		t.Run(tc.name, func(t *testing.T) {
			refresh()
			px.set(tc.f)
			if n := checkReads(t, mp, want); n > 0 {
				t.Errorf("%d of %d reads gave EIO under %s", n, len(want), tc.name)
			}
			// A write under the fault: fsync reports it in the bucket.
			rel := filepath.Join("s", "w-"+strings.ReplaceAll(tc.name, " ", "-"))
			writeSynced(t, filepath.Join(mp, rel), 2<<20+1)
			data, _ := os.ReadFile(filepath.Join(mp, rel))
			if got, err := l.get(filepath.Base(rel)); err != nil || !bytes.Equal(got, data) {
				t.Errorf("after fsync under %s the bucket holds %d bytes (%v), want %d", tc.name, len(got), err, len(data))
			}
			want[rel] = data
			acted := px.acted(tc.f)
			px.set()
			if acted == 0 {
				t.Fatalf("the %s fault never acted", tc.name)
			}
		})
	}
	// An outage: every request fails. Reads of uncached data give EIO,
	// soon, and status says the mount is unhealthy.
	refresh()
	px.set(&fault{kind: faultStatus, status: 503, code: "ServiceUnavailable"})
	start := time.Now()
	if n := checkReads(t, mp, want); n == 0 {
		t.Fatal("every read succeeded during an outage")
	}
	t.Logf("reads during the outage failed in %s", time.Since(start).Round(time.Millisecond))
	if h := l.health(mp, "/s"); h == "ok" {
		t.Errorf("status says ok during an outage")
	}
	px.set()
	// Every error logged names its provider, operation and path.
	logs, _ := filepath.Glob(filepath.Join(l.runtime, "*.log"))
	errLines := 0
	for _, p := range logs {
		data, _ := os.ReadFile(p)
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.Contains(line, "level=ERROR") {
				continue
			}
			errLines++
			for _, key := range []string{" provider=", " op=", " path="} {
				if !strings.Contains(line, key) {
					t.Errorf("an error log line without%s: %s", key, line)
				}
			}
		}
	}
	if errLines == 0 {
		t.Errorf("the outage logged no errors (logs: %v)", logs)
	}
	// The outage is over: the mount recovers, with no remount.
	waitFor(t, func() bool { return checkReads(t, mp, want) == 0 })
	if h := l.health(mp, "/s"); h != "ok" {
		t.Errorf("status after the outage: %s", h)
	}
}
