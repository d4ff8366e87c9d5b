package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// A real S3 server on loopback: Versity's gateway over a posix directory.
// .ci/run installs it and sets AMLFS_VERSITYGW; in CI its absence fails
// the S3 tests rather than skipping them.

const (
	s3Access = "amlfs-test-key"
	s3Secret = "amlfs-test-secret"
	s3Bucket = "bkt"
)

type s3Server struct {
	endpoint string
	data     string // the posix backend directory
	log      string // the server's access log
	cmd      *exec.Cmd
	args     []string
}

// requests counts the requests in the access log by operation (as
// versitygw names them: "s3_GetObject", "s3_UploadPartCopy"), from byte
// offset from on; it returns the offset the next count starts at.
func (s *s3Server) requests(t testing.TB, from int64) (map[string]int, int64) {
	t.Helper()
	data, err := os.ReadFile(s.log)
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]int{}
	for _, line := range strings.Split(string(data[min(from, int64(len(data))):]), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "s3_") {
				ops[f]++
				break
			}
		}
	}
	return ops, int64(len(data))
}

func total(ops map[string]int) int {
	n := 0
	for _, k := range ops {
		n += k
	}
	return n
}

func versitygw(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("AMLFS_VERSITYGW"); p != "" {
		return p
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	home, _ := os.UserHomeDir()
	dir := filepath.Join(home, ".cache", "amlfs-tools")
	p := filepath.Join(dir, "versitygw")
	if fileExists(p) {
		return p
	}
	// Not there: build it, once, through the Go toolchain (about 2
	// minutes), as .ci/run does, so that the README's one test command
	// runs every S3 test on a fresh machine too.
	vgwOnce.Do(func() {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			vgwErr = err
			return
		}
		lock, err := os.OpenFile(filepath.Join(dir, ".versitygw.lock"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			vgwErr = err
			return
		}
		defer lock.Close()
		syscall.Flock(int(lock.Fd()), syscall.LOCK_EX) // another package's tests may be building it
		if fileExists(p) {
			return
		}
		cmd := exec.Command("go", "install", "github.com/versity/versitygw/cmd/versitygw@v1.8.0")
		cmd.Env = append(os.Environ(), "GOBIN="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			vgwErr = fmt.Errorf("build versitygw: %v\n%s", err, out)
		}
	})
	if vgwErr != nil {
		t.Fatalf("versitygw is not installed (AMLFS_VERSITYGW), and building it failed: %v", vgwErr)
	}
	return p
}

var (
	vgwOnce sync.Once
	vgwErr  error
)

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func freePort(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startS3 starts versitygw with bucket s3Bucket; nometa starts it without
// object metadata, where it silently ignores conditional writes.
func startS3(t testing.TB, nometa bool) *s3Server {
	t.Helper()
	bin := versitygw(t)
	srv := &s3Server{data: t.TempDir()}
	srv.log = filepath.Join(t.TempDir(), "access.log")
	if err := os.Mkdir(filepath.Join(srv.data, s3Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	srv.endpoint = "http://" + addr
	srv.args = []string{"--port", addr, "--access", s3Access, "--secret", s3Secret, "--access-log", srv.log, "posix"}
	if nometa {
		srv.args = append(srv.args, "--nometa")
	}
	srv.args = append(srv.args, srv.data)
	srv.cmd = exec.Command(bin, srv.args...)
	srv.start(t)
	t.Cleanup(srv.stop)
	return srv
}

func (s *s3Server) start(t testing.TB) {
	t.Helper()
	s.cmd = exec.Command(s.cmd.Path, s.args...)
	var out bytes.Buffer
	s.cmd.Stdout, s.cmd.Stderr = &out, &out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(s.endpoint, "http://")
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("versitygw did not start: %s", out.String())
}

func (s *s3Server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
}

func s3Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s3Access, "AWS_SECRET_ACCESS_KEY=" + s3Secret, "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
}

var envSeq atomic.Int64

// newS3Env is newEnv on an S3 store served by srv, under a key prefix of
// its own.
func newS3Env(t *testing.T, srv *s3Server) *env {
	return newS3EnvAt(t, srv, fmt.Sprintf("env%d/aml/workspaces", envSeq.Add(1)))
}

// newS3EnvAt is newS3Env on a given prefix: two envs on one prefix are
// two hosts sharing a store.
func newS3EnvAt(t *testing.T, srv *s3Server, prefix string) *env {
	e := newEnv(t)
	e.kind = "s3"
	e.prefix = prefix
	e.store = "s3://" + s3Bucket + "/" + prefix
	e.storeD = filepath.Join(srv.data, s3Bucket, filepath.FromSlash(prefix))
	e.storeArgs = []string{"--s3-endpoint", srv.endpoint, "--s3-path-style"}
	e.extraEnv = s3Env()
	e.s3 = srv
	return e
}

// client is a plain S3 client of the test server, with the test's keys
// given to it (not set in the environment: parallel tests share that).
func (e *env) client() *s3.Client {
	e.t.Helper()
	creds := aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{AccessKeyID: s3Access, SecretAccessKey: s3Secret}, nil
	})
	return s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(e.s3.endpoint), UsePathStyle: true, Credentials: creds})
}

// putStoreFile writes rel (relative to the store root for all ids) through
// the store's own interface: a file, or an S3 PUT.
func (e *env) putStoreFile(rel string, data []byte) {
	e.t.Helper()
	if e.kind != "s3" {
		p := filepath.Join(e.storeD, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			e.t.Fatal(err)
		}
		return
	}
	_, err := e.client().PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(s3Bucket),
		Key: aws.String(e.prefix + "/" + rel), Body: bytes.NewReader(data)})
	if err != nil {
		e.t.Fatal(err)
	}
}

// lockExists reports whether workspace id's lease is held in the store.
func (e *env) lockExists(id string) bool {
	if e.kind == "s3" {
		return fileExists(filepath.Join(e.storeD, id, "lock.json"))
	}
	return fileExists(filepath.Join(e.storeD, id+".lock"))
}

// forEachStore runs fn against a filesystem store and a real S3 store.
func forEachStore(t *testing.T, fn func(t *testing.T, newEnv func(*testing.T) *env)) {
	t.Run("file", func(t *testing.T) { fn(t, newEnv) })
	t.Run("s3", func(t *testing.T) {
		srv := startS3(t, false)
		fn(t, func(t *testing.T) *env { return newS3Env(t, srv) })
	})
}

func TestS3ConditionalWritesRequired(t *testing.T) {
	srv := startS3(t, true)
	e := newS3Env(t, srv)
	r := e.amlfs(append([]string{"check"}, e.wsArgs("nometa")...)...)
	if r.code == 0 || !strings.Contains(r.stdout, "NOT honoured") || !strings.Contains(r.stderr, "UNSAFE_STORE") {
		t.Fatalf("check on a server ignoring conditional writes: %s", r)
	}
	mp := filepath.Join(e.root, "mnt")
	r = e.mountAt(mp, "nometa")
	if r.code == 0 || !strings.Contains(r.stderr, "UNSAFE_STORE") || !strings.Contains(r.stderr, "--unsafe-no-conditional-writes") {
		t.Fatalf("mount should refuse: %s", r)
	}
	if fileExists(filepath.Join(e.storeD, "nometa", "lock.json")) || fileExists(filepath.Join(e.storeD, "nometa", "workspace.json")) {
		t.Error("a refused mount wrote to the store")
	}
	// The explicit override mounts, and says so.
	r = e.mountAt(mp, "nometa", "--unsafe-no-conditional-writes")
	if r.code != 0 || !strings.Contains(r.stderr, "UNSAFE") {
		t.Fatalf("override: %s", r)
	}
	// And a server that honours them passes the check.
	good := newS3Env(t, startS3(t, false))
	if r := good.amlfs(append([]string{"check"}, good.wsArgs("ok")...)...); r.code != 0 || !strings.Contains(r.stdout, "are honoured") {
		t.Fatalf("check on versitygw with metadata: %s", r)
	}
}

func TestS3LockTakeover(t *testing.T) {
	srv := startS3(t, false)
	e := newS3Env(t, srv)
	stale := fmt.Sprintf(`{"token":"dead-writer","updatedAt":%d}`, time.Now().Add(-21*time.Minute).UnixMilli())
	fresh := fmt.Sprintf(`{"token":"live-writer","updatedAt":%d}`, time.Now().Add(-1*time.Minute).UnixMilli())

	e.putStoreFile("fresh/lock.json", []byte(fresh))
	if r := e.mountAt(filepath.Join(e.root, "f"), "fresh"); r.code != 3 || !strings.Contains(r.stderr, "AML_WORKSPACE_CONFLICT") {
		t.Fatalf("fresh lock: %s", r)
	}

	e.putStoreFile("stale/lock.json", []byte(stale))
	mp := e.mount("stale")
	sh(t, mp, "echo taken > over")
	if r := e.unmount(mp); r.code != 0 {
		t.Fatalf("unmount after takeover: %s", r)
	}
	if e.lockExists("stale") {
		t.Error("lock not released")
	}

	// Two contenders race on one stale lock: exactly one wins.
	for round := 0; round < 3; round++ {
		id := fmt.Sprintf("race%d", round)
		e.putStoreFile(id+"/lock.json", []byte(stale))
		type res struct{ r result }
		ch := make(chan result, 2)
		for i := 0; i < 2; i++ {
			go func(i int) { ch <- e.mountAt(filepath.Join(e.root, fmt.Sprintf("%s-%d", id, i)), id) }(i)
		}
		a, b := <-ch, <-ch
		wins := 0
		for _, r := range []result{a, b} {
			switch r.code {
			case 0:
				wins++
			case 3:
			default:
				t.Errorf("contender: %s", r)
			}
		}
		if wins != 1 {
			t.Errorf("round %d: %d winners\n%s\n%s", round, wins, a, b)
		}
	}
}

func TestS3TwoHosts(t *testing.T) {
	srv := startS3(t, false)
	a := newS3EnvAt(t, srv, "hosts")
	b := newS3EnvAt(t, srv, "hosts") // its own cache and runtime dirs: another host
	mp := a.mount("shared")
	sh(t, mp, "mkdir -p src && echo from-a > src/a.txt && chmod 700 src")
	if r := a.unmount(mp); r.code != 0 {
		t.Fatalf("A's save: %s", r)
	}
	mpb := b.mount("shared")
	if got := readFile(t, filepath.Join(mpb, "src", "a.txt")); got != "from-a\n" {
		t.Errorf("B sees %q", got)
	}
	b.unmount(mpb)

	// Unlocked: both mount; A saves first; B's stale save exits 3
	// (AML_PUBLISH_CONFLICT) and A's revision stays current.
	ma := a.mount("shared", "--no-lock")
	mb := b.mount("shared", "--no-lock")
	sh(t, ma, "echo a2 > v")
	sh(t, mb, "echo b2 > v")
	ra := a.unmount(ma)
	rb := b.unmount(mb)
	if ra.code != 0 || rb.code != 3 || !strings.Contains(rb.stderr, "AML_PUBLISH_CONFLICT") {
		t.Fatalf("A %s\nB %s", ra, rb)
	}
	if idx := readIndex(t, a, "shared"); idx.Current != strings.TrimSpace(ra.stdout) {
		t.Errorf("current %s, want A's %s", idx.Current, ra.stdout)
	}
}

// A lease taken over behind the daemon's back is reported at the next
// save: nothing publishes, and the exit status is 4.
func TestS3LostLeaseFailsSave(t *testing.T) {
	srv := startS3(t, false)
	e := newS3Env(t, srv)
	mp := e.mount("lost")
	sh(t, mp, "echo mine > f")
	e.putStoreFile("lost/lock.json", []byte(fmt.Sprintf(`{"token":"someone-else","updatedAt":%d}`, time.Now().UnixMilli())))
	r := e.unmount(mp)
	if r.code != 4 || !strings.Contains(r.stderr, "AML_LOCK_LOST") {
		t.Fatalf("save after losing the lease: %s", r)
	}
	if fileExists(filepath.Join(e.storeD, "lost", "workspace.json")) {
		t.Error("published without the lease")
	}
	if got := readFile(t, filepath.Join(e.storeD, "lost", "lock.json")); !strings.Contains(got, "someone-else") {
		t.Errorf("the other writer's lock was touched: %s", got)
	}
}

// TestS3NewcomerErrors: the first S3 mistakes say what to do: a bucket
// that does not exist, and no credentials anywhere in the AWS chain.
func TestS3NewcomerErrors(t *testing.T) {
	srv := startS3(t, false)
	e := newS3Env(t, srv)
	e.store = "s3://no-such-bucket/p"
	r := e.mountAt(filepath.Join(e.root, "mnt-nobucket"), "x")
	if r.code == 0 || !strings.Contains(r.stderr, `bucket "no-such-bucket" does not exist`) {
		t.Errorf("mount on a missing bucket: %s", r)
	}
	n := newS3Env(t, srv)
	n.extraEnv = []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_PROFILE=", "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
	r = n.mountAt(filepath.Join(n.root, "mnt-nocreds"), "x")
	if r.code == 0 || !strings.Contains(r.stderr, "no AWS credentials found") {
		t.Errorf("mount without credentials: %s", r)
	}
}

// lines returns the access log's lines of operation op (s3_GetObject, ...)
// from offset from on, for a test to say which keys its requests named.
func (s *s3Server) lines(t testing.TB, from int64, op string) []string {
	t.Helper()
	data, err := os.ReadFile(s.log)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data[min(from, int64(len(data))):]), "\n") {
		if strings.Contains(line, " "+op+" ") || strings.HasSuffix(line, " "+op) {
			out = append(out, line)
		}
	}
	return out
}
