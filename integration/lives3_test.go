package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sys/unix"
)

// liveS3 is a versitygw bucket seen two ways: through an S3 live mount,
// and directly with the SDK.
type liveS3 struct {
	*env
	c      *s3.Client
	prefix string // key prefix of the live mount, ending in "/"
	// endpoint, if set, is where the daemon reaches the bucket (a fault
	// proxy); the test's own client always goes to the server.
	endpoint string
}

func newLiveS3(t *testing.T, srv *s3Server, prefix string) *liveS3 {
	e := newEnv(t)
	e.s3 = srv
	e.extraEnv = s3Env()
	return &liveS3{env: e, c: e.client(), prefix: prefix + "/"}
}

func (l *liveS3) s3Args() []string {
	if l.endpoint != "" {
		return []string{"--s3-endpoint", l.endpoint, "--s3-path-style"}
	}
	return []string{"--s3-endpoint", l.s3.endpoint, "--s3-path-style"}
}

func (l *liveS3) put(key string, data []byte, md map[string]string) {
	l.t.Helper()
	_, err := l.c.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(s3Bucket), Key: aws.String(l.prefix + key),
		Body: bytes.NewReader(data), Metadata: md})
	if err != nil {
		l.t.Fatal(err)
	}
}

func (l *liveS3) get(key string) ([]byte, error) {
	out, err := l.c.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(s3Bucket), Key: aws.String(l.prefix + key)})
	if err != nil {
		return nil, err
	}
	defer out.Body.Close()
	return io.ReadAll(out.Body)
}

func (l *liveS3) head(key string) (*s3.HeadObjectOutput, error) {
	return l.c.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String(s3Bucket), Key: aws.String(l.prefix + key)})
}

// mountNone mounts only the S3 prefix, at /s, with --store none, and
// returns the mountpoint.
func (l *liveS3) mountNone(prefix string, extra ...string) string {
	l.t.Helper()
	mp := filepath.Join(l.root, "mnt")
	args := append([]string{"mount", "--daemon", mp, "--store", "none", "--cache-dir", l.cache, "--mount", "/s=s3://" + s3Bucket + "/" + prefix}, l.s3Args()...)
	if r := l.amlfs(append(args, extra...)...); r.code != 0 {
		l.t.Fatalf("mount: %s", r)
	}
	l.t.Cleanup(func() { l.forceUnmount(mp) })
	return mp
}

// pending is what status says the mount at prefix still has to upload.
func (l *liveS3) pending(mp, prefix string) int {
	l.t.Helper()
	return l.mountStatus(mp, prefix).Pending
}

// health is what status says of the mount at prefix.
func (l *liveS3) health(mp, prefix string) string {
	l.t.Helper()
	return l.mountStatus(mp, prefix).Health
}

type mountStatus struct {
	Prefix  string `json:"prefix"`
	Health  string `json:"health"`
	Pending int    `json:"pending"`
}

func (l *liveS3) mountStatus(mp, prefix string) mountStatus {
	l.t.Helper()
	var st struct {
		Mounts []mountStatus `json:"mounts"`
	}
	r := l.amlfs("status", mp, "--json")
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		l.t.Fatalf("status: %v: %s", err, r)
	}
	for _, m := range st.Mounts {
		if m.Prefix == prefix {
			return m
		}
	}
	l.t.Fatalf("status has no mount %s: %s", prefix, r.stdout)
	return mountStatus{}
}

// drained waits until the mount has uploaded everything.
func (l *liveS3) drained(mp, prefix string) {
	l.t.Helper()
	waitFor(l.t, func() bool { return l.pending(mp, prefix) == 0 })
}

func TestS3LiveMount(t *testing.T) {
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "live")
	mp := l.mount("ws", append(l.s3Args(), "--mount", "/data=s3://"+s3Bucket+"/live", "--mount", "/ro=s3://"+s3Bucket+"/live,ro", "--metadata-ttl", "2s")...)
	data := filepath.Join(mp, "data")

	// Mount to bucket: close starts the upload, fsync waits for it.
	sh(t, data, "echo hello > a.txt && mkdir -p d/e && printf 'deep' > d/e/f.txt && ln -s a.txt link")
	f, err := os.Create(filepath.Join(data, "synced.bin"))
	must(t, err)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	f.Write(payload)
	must(t, f.Sync())
	if got, err := l.get("synced.bin"); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("after fsync the object holds %d bytes (err %v), want %d", len(got), err, len(payload))
	}
	f.Close()
	l.drained(mp, "/data")
	for key, want := range map[string]string{"a.txt": "hello\n", "d/e/f.txt": "deep", "link": "a.txt"} {
		if got, err := l.get(key); err != nil || string(got) != want {
			t.Errorf("object %s = %q, %v; want %q", key, got, err, want)
		}
	}
	if _, err := l.head("d/"); err != nil {
		t.Errorf("mkdir made no directory marker: %v", err)
	}

	// Metadata under s3fs's keys.
	must(t, os.Chmod(filepath.Join(data, "a.txt"), 0o640))
	must(t, os.Chown(filepath.Join(data, "a.txt"), 1234, 5678))
	mt := time.Unix(1600000000, 0)
	must(t, os.Chtimes(filepath.Join(data, "a.txt"), mt, mt))
	l.drained(mp, "/data")
	h, err := l.head("a.txt")
	must(t, err)
	if h.Metadata["mode"] != fmt.Sprint(syscall.S_IFREG|0o640) || h.Metadata["uid"] != "1234" || h.Metadata["gid"] != "5678" || h.Metadata["mtime"] != "1600000000" {
		t.Errorf("metadata of a.txt: %v", h.Metadata)
	}
	if got, _ := l.get("a.txt"); string(got) != "hello\n" {
		t.Errorf("a metadata change altered the bytes: %q", got)
	}

	// Bucket to mount: objects written as s3fs writes them, and plain ones.
	l.put("s3fs/file", []byte("from s3fs"), map[string]string{"mode": fmt.Sprint(syscall.S_IFREG | 0o600), "uid": "42", "gid": "43", "mtime": "1500000000"})
	l.put("s3fs/dir/", nil, map[string]string{"mode": fmt.Sprint(syscall.S_IFDIR | 0o700), "uid": "42", "gid": "43", "mtime": "1500000000"})
	l.put("s3fs/sym", []byte("file"), map[string]string{"mode": fmt.Sprint(syscall.S_IFLNK | 0o777)})
	l.put("s3fs/plain", []byte("no metadata"), nil)
	time.Sleep(2500 * time.Millisecond) // the TTL
	for name, want := range map[string]struct {
		mode     os.FileMode
		uid, gid uint32
		mtime    int64
	}{
		"file": {0o600, 42, 43, 1500000000},
		"dir":  {os.ModeDir | 0o700, 42, 43, 1500000000},
		"sym":  {os.ModeSymlink | 0o777, 0, 0, -1},
	} {
		fi, err := os.Lstat(filepath.Join(data, "s3fs", name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != want.mode || (name != "sym" && (st.Uid != want.uid || st.Gid != want.gid || fi.ModTime().Unix() != want.mtime)) {
			t.Errorf("%s: mode %v uid %d gid %d mtime %d; want %+v", name, fi.Mode(), st.Uid, st.Gid, fi.ModTime().Unix(), want)
		}
	}
	if target, err := os.Readlink(filepath.Join(data, "s3fs/sym")); err != nil || target != "file" {
		t.Errorf("readlink s3fs/sym = %q, %v", target, err)
	}
	fi, err := os.Stat(filepath.Join(data, "s3fs/plain"))
	if err != nil || fi.Mode() != 0o644 || time.Since(fi.ModTime()) > time.Minute {
		t.Errorf("object without metadata: %v, %v", fi, err)
	}

	// A change in the bucket shows after the TTL, and drops cached bytes.
	if got := readFile(t, filepath.Join(data, "a.txt")); got != "hello\n" {
		t.Fatalf("a.txt = %q", got)
	}
	l.put("a.txt", []byte("changed in the bucket\n"), nil)
	time.Sleep(2500 * time.Millisecond)
	if got := readFile(t, filepath.Join(data, "a.txt")); got != "changed in the bucket\n" {
		t.Errorf("after the TTL a.txt = %q", got)
	}

	// rename: a file, and a directory with everything under it.
	sh(t, data, "mv a.txt b.txt && mv d moved")
	l.drained(mp, "/data")
	if _, err := l.head("a.txt"); err == nil {
		t.Error("a.txt is still in the bucket after its rename")
	}
	if got, err := l.get("moved/e/f.txt"); err != nil || string(got) != "deep" {
		t.Errorf("moved/e/f.txt = %q, %v", got, err)
	}
	if _, err := l.head("d/e/f.txt"); err == nil {
		t.Error("d/e/f.txt is still in the bucket after its directory's rename")
	}
	if got := readFile(t, filepath.Join(data, "moved/e/f.txt")); got != "deep" {
		t.Errorf("moved/e/f.txt through the mount = %q", got)
	}
	// delete
	sh(t, data, "rm b.txt && rm -r moved")
	l.drained(mp, "/data")
	for _, k := range []string{"b.txt", "moved/e/f.txt", "moved/"} {
		if _, err := l.head(k); err == nil {
			t.Errorf("%s is still in the bucket after rm", k)
		}
	}
	if ls := sh(t, data, "ls"); strings.Contains(ls, "moved") || strings.Contains(ls, "b.txt") {
		t.Errorf("ls after rm: %q", ls)
	}

	// Across providers: EXDEV. The read-only view: EROFS for every write.
	sh(t, mp, "echo ws > w.txt")
	if err := os.Rename(filepath.Join(mp, "w.txt"), filepath.Join(data, "w.txt")); !errors.Is(err, syscall.EXDEV) {
		t.Errorf("rename workspace -> s3: %v, want EXDEV", err)
	}
	if err := os.Link(filepath.Join(data, "synced.bin"), filepath.Join(mp, "l")); !errors.Is(err, syscall.EXDEV) {
		t.Errorf("link s3 -> workspace: %v, want EXDEV", err)
	}
	ro := filepath.Join(mp, "ro")
	if got := readFile(t, filepath.Join(ro, "synced.bin")); got != string(payload) {
		t.Error("the ro view reads other bytes")
	}
	for name, err := range map[string]error{
		"create":   os.WriteFile(filepath.Join(ro, "new"), nil, 0o644),
		"write":    os.WriteFile(filepath.Join(ro, "synced.bin"), []byte("x"), 0o644),
		"mkdir":    os.Mkdir(filepath.Join(ro, "nd"), 0o755),
		"remove":   os.Remove(filepath.Join(ro, "synced.bin")),
		"rename":   os.Rename(filepath.Join(ro, "synced.bin"), filepath.Join(ro, "x")),
		"chmod":    os.Chmod(filepath.Join(ro, "synced.bin"), 0o600),
		"symlink":  os.Symlink("x", filepath.Join(ro, "sl")),
		"truncate": os.Truncate(filepath.Join(ro, "synced.bin"), 0),
	} {
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("ro %s: %v, want EROFS", name, err)
		}
	}

	// Tool calls see and change the bucket like the shell does.
	cl := toolClient(t, l.env, mp)
	tool(t, cl, "write_file", map[string]any{"path": filepath.Join(mp, "data", "tool.txt"), "content": "from a tool\n"})
	if got := readFile(t, filepath.Join(data, "tool.txt")); got != "from a tool\n" {
		t.Errorf("the shell reads %q after write_file", got)
	}
	l.drained(mp, "/data")
	if got, err := l.get("tool.txt"); err != nil || string(got) != "from a tool\n" {
		t.Errorf("object tool.txt = %q, %v", got, err)
	}
	if m := tool(t, cl, "grep", map[string]any{"pattern": "from a", "path": "data"}); len(m["matches"].([]any)) != 1 {
		t.Errorf("grep on the S3 mount: %v", m)
	}
	if _, err := toolErr(cl, "write_file", map[string]any{"path": "ro/x", "content": "x"}); err == nil || !strings.Contains(err.Error(), "EROFS") {
		t.Errorf("write_file to the ro S3 view: %v", err)
	}

	// Saves leave the live mounts out.
	if r := l.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
	mp2 := l.mount("ws")
	if _, err := os.Stat(filepath.Join(mp2, "data/synced.bin")); err == nil {
		t.Error("the workspace revision holds a live mount's file")
	}
	if got := readFile(t, filepath.Join(mp2, "w.txt")); got != "ws\n" {
		t.Errorf("workspace w.txt = %q", got)
	}
	l.unmount(mp2)
}

// amlfs refresh (and SIGHUP) drop cached metadata and bytes at once, where
// the TTL would keep them for an hour.
func TestS3LiveRefresh(t *testing.T) {
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "refresh")
	l.put("f.txt", []byte("one"), nil)
	mp := l.mountNone("refresh", "--metadata-ttl", "1h")
	if ls := strings.Fields(sh(t, mp, "ls -A")); strings.Join(ls, " ") != "s" {
		t.Errorf("ls / with --store none = %q, want the mount only", ls)
	}
	p := filepath.Join(mp, "s/f.txt")
	if got := readFile(t, p); got != "one" {
		t.Fatalf("f.txt = %q", got)
	}
	l.put("f.txt", []byte("two, longer"), nil)
	l.put("new.txt", []byte("new"), nil)
	time.Sleep(300 * time.Millisecond)
	if got := readFile(t, p); got != "one" {
		t.Fatalf("f.txt changed before any refresh (%q): the test shows nothing", got)
	}
	if r := l.amlfs("refresh", mp, "/s/f.txt"); r.code != 0 {
		t.Fatalf("refresh: %s", r)
	}
	if got := readFile(t, p); got != "two, longer" {
		t.Errorf("after refresh f.txt = %q", got)
	}
	if r := l.amlfs("refresh", mp); r.code != 0 {
		t.Fatalf("refresh: %s", r)
	}
	if got := readFile(t, filepath.Join(mp, "s/new.txt")); got != "new" {
		t.Errorf("after refresh new.txt = %q", got)
	}
	// SIGHUP refreshes everything.
	l.put("f.txt", []byte("three"), nil)
	pid := jsonInt(t, l.amlfs("status", mp, "--json").stdout, "pid")
	must(t, syscall.Kill(pid, syscall.SIGHUP))
	waitFor(t, func() bool { b, _ := os.ReadFile(p); return string(b) == "three" })
	if r := l.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// A 2 GiB file written at random offsets goes up as a multipart upload and
// arrives whole.
func TestS3LiveLargeRandomWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("2 GiB")
	}
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "big")
	mp := l.mountNone("big")
	const size, block = 2 << 30, 4 << 20
	f, err := os.OpenFile(filepath.Join(mp, "s/big.bin"), os.O_CREATE|os.O_RDWR, 0o644)
	must(t, err)
	r := rand.New(rand.NewPCG(1, 2))
	order := r.Perm(size / block)
	blockData := func(i int) []byte {
		b := make([]byte, block)
		rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), 3}).Read(b)
		return b
	}
	for _, i := range order {
		if _, err := f.WriteAt(blockData(i), int64(i)*block); err != nil {
			t.Fatal(err)
		}
	}
	// A few overwrites inside blocks, as a database would.
	patch := []byte("patched!")
	for _, off := range []int64{0, block - 3, size / 2, size - int64(len(patch))} {
		_, err := f.WriteAt(patch, off)
		must(t, err)
	}
	must(t, f.Sync())
	must(t, f.Close())
	want := sha256.New()
	for i := 0; i < size/block; i++ {
		b := blockData(i)
		for _, off := range []int64{0, block - 3, size / 2, size - int64(len(patch))} {
			if lo, hi := int64(i)*block, int64(i+1)*block; off+int64(len(patch)) > lo && off < hi {
				for k := range patch {
					if p := off + int64(k); p >= lo && p < hi {
						b[p-lo] = patch[k]
					}
				}
			}
		}
		want.Write(b)
	}
	h, err := l.head("big.bin")
	must(t, err)
	if aws.ToInt64(h.ContentLength) != size || !strings.Contains(aws.ToString(h.ETag), "-") {
		t.Errorf("object: %d bytes, ETag %s; want %d bytes from a multipart upload", aws.ToInt64(h.ContentLength), aws.ToString(h.ETag), size)
	}
	out, err := l.c.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(s3Bucket), Key: aws.String("big/big.bin")})
	must(t, err)
	got := sha256.New()
	_, err = io.Copy(got, out.Body)
	out.Body.Close()
	must(t, err)
	if hex.EncodeToString(got.Sum(nil)) != hex.EncodeToString(want.Sum(nil)) {
		t.Fatal("the uploaded object's checksum differs from the bytes written")
	}
	if r := l.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// Reading 3x --cache-size keeps the cache under its bound, and every read
// is right.
func TestS3LiveCacheBound(t *testing.T) {
	srv := startS3(t, false)
	l := newLiveS3(t, srv, "bound")
	const bound, size = 32 << 20, 24 << 20
	sums := map[string][32]byte{}
	for i := range 4 {
		b := make([]byte, size)
		rr := rand.New(rand.NewPCG(uint64(i), 9))
		for j := range b {
			b[j] = byte(rr.Uint32())
		}
		name := fmt.Sprintf("obj%d", i)
		l.put(name, b, nil)
		sums[name] = sha256.Sum256(b)
	}
	mp := l.mountNone("bound", "--cache-size", "32MiB")
	usage := func() int64 {
		// The cache's files are unlinked once open: count them through
		// the daemon's descriptors, as du of the directory and of
		// deleted-but-open files together. Data extents, not st_blocks:
		// st_blocks also counts ext4's extent-tree blocks, which a
		// file punched full of holes grows (a 4 KiB "overshoot" once).
		pid := jsonInt(t, l.amlfs("status", mp, "--json").stdout, "pid")
		var total int64
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err != nil || !strings.HasPrefix(target, l.cache) {
				continue
			}
			total += dataBytes(t, fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		}
		return total
	}
	for round := range 2 {
		for i := range 4 {
			name := fmt.Sprintf("obj%d", i)
			b, err := os.ReadFile(filepath.Join(mp, "s", name))
			must(t, err)
			if sha256.Sum256(b) != sums[name] {
				t.Fatalf("round %d: %s read wrong bytes", round, name)
			}
			if u := usage(); u > bound {
				t.Fatalf("round %d after %s: the cache takes %d bytes, over its %d bound", round, name, u, bound)
			}
		}
	}
	if r := l.unmount(mp); r.code != 0 {
		t.Fatalf("unmount: %s", r)
	}
}

// dataBytes is how many bytes of a sparse file hold data, by SEEK_DATA and
// SEEK_HOLE.
func dataBytes(t *testing.T, path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var total, off int64
	for {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			return total // ENXIO: no data past off
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			t.Fatalf("SEEK_HOLE %s: %v", path, err)
		}
		total += hole - data
		off = hole
	}
}
