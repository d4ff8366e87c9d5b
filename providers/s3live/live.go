// Package s3live is the S3 live mount (--mount /PREFIX=s3://bucket/prefix): a
// bucket prefix served as a directory tree, with listings and metadata
// cached for --metadata-ttl, file data in the local cache, and changes
// uploaded in the background (queue), one key at a time. The S3 client
// it uses is s3client's, shared with the durable S3 store.
package s3live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/cache"
	"github.com/amlfs/amlfs/fuse/posix"
	"github.com/amlfs/amlfs/s3client"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Options configure an S3 live mount (s3://bucket/prefix).
type Options struct {
	Client *s3.Client
	Bucket string
	Prefix string // "" or ending in "/"
	RO     bool
	// TTL is how long listings, metadata and the kernel's entries and
	// attributes are trusted before the bucket is asked again
	// (--metadata-ttl).
	TTL   time.Duration
	Cache *cache.Cache
	Log   *slog.Logger
	// Tag (1 or more) puts this mount's inode numbers in their own space.
	Tag uint16
	// Workers bounds concurrent uploads and deletes (default 16).
	Workers int
	// WriteBack is how long a closed file's upload waits for more
	// changes (metadata set after close, say) before it starts (default
	// 200 ms). fsync does not wait.
	WriteBack time.Duration
	// UID and GID own objects without uid/gid metadata.
	UID, GID uint32
}

// Live serves one bucket prefix as a directory tree.
type Live struct {
	o     Options
	q     *queue
	root  *node
	ino   atomic.Uint64
	fetch sync.Mutex // guards fetching

	mu     sync.Mutex
	rootE  *ent // GUARDED_BY(mu) for its fields
	health error
	// tombs are keys deleted here: zero while the delete is on its way,
	// then when it finished. A listing that started before then may
	// still show the key, and must not bring it back.
	tombs     map[string]time.Time
	lastPrune time.Time
	inflight  map[chunkKey]*fetchCall // GUARDED_BY(fetch)

	sem chan struct{} // bounds concurrent ranged GETs

	// hits and misses count the reads that reached the daemon and found
	// their bytes in the cache, or had to fetch them. Reads of files open
	// with passthrough never reach it.
	hits, misses atomic.Int64
}

// CacheReads returns how many reads found their bytes cached, and how many
// had to fetch them.
func (l *Live) CacheReads() (hits, misses int64) { return l.hits.Load(), l.misses.Load() }

// Cache is the data cache the mount uses (shared by a daemon's S3 mounts).
func (l *Live) Cache() *cache.Cache { return l.o.Cache }

type chunkKey struct {
	f   *cache.File
	idx int64
}

type fetchCall struct {
	done chan struct{}
	err  error
}

// ent is one file, directory or symlink of the mount, as amlfs knows it.
// Every field is guarded by Live.mu.
type ent struct {
	name   string
	parent *ent
	ino    uint64
	mode   uint32 // type and permission bits
	uid    uint32
	gid    uint32
	mtime  time.Time
	// ctime is when amlfs last changed the entry (zero: its mtime). A
	// bucket keeps no ctime, so it lasts while the daemon runs.
	ctime time.Time
	// atime is the access time a utimensat set (zero: its mtime). A
	// bucket keeps none, and reads do not change it (as with noatime).
	atime time.Time
	size  int64
	etag  string

	metaKnown bool // mode, uid, gid and mtime are read or set here
	remote    bool // the bucket holds it (for a dir: its marker or a key below)
	gone      bool // unlinked
	// changed is when it was last made, moved or uploaded here: a
	// listing that started before then may not show it yet.
	changed time.Time

	// directories
	children map[string]*ent
	listedAt time.Time // zero: not listed, or refresh asked
	listing  chan struct{}

	// files and symlinks
	data      *cache.File
	dirty     bool // bytes to upload
	metaDirty bool // metadata to set on the object
	gen       uint64
	upGen     uint64 // the gen of the last upload
	opens     int
	link      string
	// ptData is the cache file the kernel has open directly
	// (passthrough), by ptOpens handles, ptWriters of them writing.
	ptData    *cache.File
	ptOpens   int
	ptWriters int
	ver       uint64 // bumped when the object changed under the cache
}

func (e *ent) isDir() bool { return e.mode&syscall.S_IFMT == syscall.S_IFDIR }

// New builds the provider. It does not touch the bucket: a bucket
// that is unreachable now gives EIO on its paths until it answers.
func New(o Options) *Live {
	if o.TTL <= 0 {
		o.TTL = time.Minute
	}
	if o.Workers <= 0 {
		o.Workers = 16
	}
	if o.WriteBack <= 0 {
		o.WriteBack = 200 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	l := &Live{o: o, inflight: map[chunkKey]*fetchCall{}, sem: make(chan struct{}, 16), tombs: map[string]time.Time{}}
	l.ino.Store(uint64(o.Tag)<<48 | 1)
	l.rootE = &ent{mode: syscall.S_IFDIR | 0o755, uid: o.UID, gid: o.GID, mtime: time.Now(), metaKnown: true, remote: true,
		ino: l.ino.Load(), children: map[string]*ent{}}
	l.root = &node{l: l, e: l.rootE}
	l.q = newQueue(o.Workers, l.runOps)
	return l
}

func (l *Live) newIno() uint64 { return l.ino.Add(1) }

// key is the object key of e; directories end in "/".
func (l *Live) key(e *ent) string {
	if e.parent == nil {
		return l.o.Prefix
	}
	var parts []string
	for x := e; x.parent != nil; x = x.parent {
		parts = append(parts, x.name)
	}
	var b strings.Builder
	b.WriteString(l.o.Prefix)
	for i := len(parts) - 1; i >= 0; i-- {
		b.WriteString(parts[i])
		if i > 0 {
			b.WriteByte('/')
		}
	}
	if e.isDir() {
		b.WriteByte('/')
	}
	return b.String()
}

// MaxKeyLen is S3's limit on an object key, in bytes.
const MaxKeyLen = 1024

// keyTooLongLocked reports whether name in dir would have a key over S3's
// limit, or give one to any known entry below it: sub is the longest key
// suffix below the entry (0 for a file; its dir marker's "/" counts).
func (l *Live) keyTooLongLocked(dir *ent, name string, sub int) bool {
	return len(name) > NameMax || len(l.key(dir))+len(name)+sub > MaxKeyLen
}

// NameMax is the longest name amlfs makes in a bucket, as on ext4: tools
// size their buffers by NAME_MAX. An existing object whose key has a
// longer component is still shown.
const NameMax = 255

// longestBelowLocked is the length of the longest key suffix that e's
// known subtree adds to e's name: 1 (the marker's "/") for an empty
// directory, and 0 for a file.
func longestBelowLocked(e *ent) int {
	if !e.isDir() {
		return 0
	}
	n := 1
	for name, c := range e.children {
		n = max(n, 1+len(name)+longestBelowLocked(c))
	}
	return n
}

// keyOf is l.key for a caller that does not hold l.mu.
func (l *Live) keyOf(e *ent) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.key(e)
}

func (l *Live) url(key string) string { return "s3://" + l.o.Bucket + "/" + key }

// errno maps a bucket error to the errno the kernel sees, logs what is
// not a plain miss, and records the mount's health. S3's answers are
// turned into the errors the one table knows (amlerr.Errno).
func (l *Live) errno(op, key string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	var oe *net.OpError
	var ue *url.Error
	switch {
	case errors.As(err, &oe), errors.As(err, &ue), errors.Is(err, context.DeadlineExceeded):
		// The bucket is unreachable: not the errno of a local call
		// (ECONNREFUSED) but STORE_UNREACHABLE's, EIO. (Not net.Error:
		// a plain syscall.Errno, such as the cache disk's EFBIG or
		// ENOSPC, implements it too.)
		err = amlerr.New(amlerr.StoreOffline, l.url(key), "%v", err)
	case errors.As(err, &en), errors.Is(err, context.Canceled):
		return amlerr.Errno(err)
	case s3client.IsNotFound(err) && s3client.Code(err) != "NoSuchBucket":
		return amlerr.Errno(fs.ErrNotExist)
	case s3client.Code(err) == "KeyTooLongError":
		return amlerr.Errno(syscall.ENAMETOOLONG)
	case s3client.Status(err) == http.StatusForbidden:
		err = fmt.Errorf("%w: %w", fs.ErrPermission, err)
	}
	l.setHealth(err)
	l.o.Log.Error("s3 live mount", "op", op, "path", l.url(key), "err", err)
	return amlerr.Errno(err)
}

func (l *Live) setHealth(err error) {
	l.mu.Lock()
	l.health = err
	l.mu.Unlock()
}

// Health is nil while the bucket answers, else the last error.
func (l *Live) Health() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.health
}

// Check asks the bucket once and records the answer as the health.
func (l *Live) Check(ctx context.Context) error {
	_, err := l.o.Client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &l.o.Bucket, Prefix: &l.o.Prefix, MaxKeys: aws.Int32(1)})
	l.setHealth(err)
	return err
}

// Pending is the number of uploads and deletes not yet done.
func (l *Live) Pending() int { return l.q.Len() }

// Sync waits until every change made so far is in the bucket.
func (l *Live) Sync(ctx context.Context) error {
	l.mu.Lock()
	var enq []*ent
	walk(l.rootE, func(e *ent) {
		if (e.dirty || e.metaDirty) && e.opens > 0 {
			enq = append(enq, e)
		}
	})
	l.mu.Unlock()
	for _, e := range enq {
		l.enqueuePut(e, 0)
	}
	return l.q.flush(ctx, l.o.Prefix, false)
}

func walk(e *ent, fn func(*ent)) {
	fn(e)
	for _, c := range e.children {
		walk(c, fn)
	}
}

// Close uploads what is left (up to timeout) and stops the workers.
func (l *Live) Close(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := l.Sync(ctx)
	if err != nil {
		l.o.Log.Error("s3 live mount: changes not uploaded at unmount are lost", "op", "unmount", "path", "s3://"+l.o.Bucket+"/"+l.o.Prefix, "pending", l.q.Len(), "err", err)
	}
	l.q.close()
	return err
}

// --- metadata (s3fs's keys) ---

const dirContentType = "application/x-directory"

// metadata returns the object metadata for e, with s3fs's keys (the SDK
// adds the x-amz-meta- prefix).
func metadata(e *ent) map[string]string {
	return map[string]string{
		"mode":  strconv.FormatUint(uint64(e.mode), 10),
		"mtime": strconv.FormatInt(e.mtime.Unix(), 10),
		"uid":   strconv.FormatUint(uint64(e.uid), 10),
		"gid":   strconv.FormatUint(uint64(e.gid), 10),
	}
}

// applyMetadata sets e's attributes from object metadata; keys that are
// missing or bad keep the defaults. A dir stays a dir, a file a file or
// symlink.
func applyMetadata(e *ent, md map[string]string, lastModified time.Time) {
	get := func(k string) (uint64, bool) {
		for mk, v := range md {
			if strings.EqualFold(mk, k) {
				if i := strings.IndexByte(v, '.'); i >= 0 {
					v = v[:i]
				}
				n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				return n, err == nil
			}
		}
		return 0, false
	}
	if m, ok := get("mode"); ok && m <= 0xffff {
		t := uint32(m) & syscall.S_IFMT
		switch {
		case e.isDir():
			e.mode = syscall.S_IFDIR | uint32(m)&0o7777
		case t == syscall.S_IFLNK:
			e.mode = uint32(m)
		default:
			e.mode = syscall.S_IFREG | uint32(m)&0o7777
		}
	}
	if v, ok := get("uid"); ok && v <= 1<<32-1 {
		e.uid = uint32(v)
	}
	if v, ok := get("gid"); ok && v <= 1<<32-1 {
		e.gid = uint32(v)
	}
	e.mtime = lastModified
	if v, ok := get("mtime"); ok && v < 1<<40 {
		e.mtime = time.Unix(int64(v), 0)
	}
	e.metaKnown = true
}

// --- listing ---

// maxFetch bounds one ranged GET.
const maxFetch = 16 * cache.ChunkSize

// fill makes chunks [first, last] of e's cached file present, fetching
// the missing runs with ranged GETs (several at once) conditional on the
// ETag the cache holds. Each chunk is fetched once however many readers
// want it.
func (l *Live) fill(ctx context.Context, e *ent, f *cache.File, first, last int64, wait bool) error {
	missing := f.Missing(first*cache.ChunkSize, (last+1)*cache.ChunkSize)
	if len(missing) == 0 {
		return nil
	}
	l.mu.Lock()
	key, etag := l.key(e), e.etag
	l.mu.Unlock()
	var waits []*fetchCall
	l.fetch.Lock()
	var run []int64
	start := func() {
		if len(run) == 0 {
			return
		}
		c := &fetchCall{done: make(chan struct{})}
		for _, i := range run {
			l.inflight[chunkKey{f, i}] = c
		}
		waits = append(waits, c)
		r := run
		run = nil
		go func() {
			c.err = l.get(context.WithoutCancel(ctx), key, etag, f, r[0], r[len(r)-1])
			l.fetch.Lock()
			for _, i := range r {
				delete(l.inflight, chunkKey{f, i})
			}
			l.fetch.Unlock()
			close(c.done)
		}()
	}
	for _, i := range missing {
		if c := l.inflight[chunkKey{f, i}]; c != nil {
			start()
			waits = append(waits, c)
			continue
		}
		if len(run) > 0 && (run[len(run)-1] != i-1 || int64(len(run)) == maxFetch/cache.ChunkSize) {
			start()
		}
		run = append(run, i)
	}
	start()
	l.fetch.Unlock()
	if !wait {
		return nil
	}
	for _, c := range waits {
		select {
		case <-c.done:
			if c.err != nil {
				return c.err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// get fetches chunks [first, last] of key into f.
func (l *Live) get(ctx context.Context, key, etag string, f *cache.File, first, last int64) error {
	l.sem <- struct{}{}
	defer func() { <-l.sem }()
	size := f.Size()
	off := first * cache.ChunkSize
	end := min((last+1)*cache.ChunkSize, size)
	if off >= end {
		return nil
	}
	in := &s3.GetObjectInput{Bucket: &l.o.Bucket, Key: &key, Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, end-1))}
	if etag != "" {
		in.IfMatch = aws.String(etag)
	}
	out, err := s3client.Get(ctx, l.o.Client, in)
	if err != nil {
		if s3client.IsPrecondition(err) {
			return fmt.Errorf("%s changed while it was read: %w", l.url(key), syscall.ESTALE)
		}
		return fmt.Errorf("get %s: %w", l.url(key), err)
	}
	defer out.Body.Close()
	buf := make([]byte, cache.ChunkSize)
	for i := first; i*cache.ChunkSize < end; i++ {
		n := min(int64(cache.ChunkSize), size-i*cache.ChunkSize)
		if _, err := io.ReadFull(out.Body, buf[:n]); err != nil {
			return fmt.Errorf("get %s: %w", l.url(key), err)
		}
		if err := f.Fill(i, buf[:n]); err != nil {
			return err
		}
	}
	l.setHealth(nil)
	return nil
}

// --- the write-back ops ---

// Refresh forgets what is cached of sub (a path below the mount root; ""
// for all of it): listings, metadata and bytes of everything there that
// has no changes waiting to upload, and the kernel's entries, attributes
// and pages of it. The next access asks the bucket.
func (l *Live) Refresh(sub string) error {
	var parts []string
	if sub != "" {
		parts = strings.Split(sub, "/")
	}
	l.mu.Lock()
	e := l.rootE
	for _, name := range parts {
		e.listedAt = time.Time{}
		if e = e.children[name]; e == nil {
			break
		}
	}
	if e != nil {
		walk(e, func(x *ent) {
			switch {
			case x.isDir():
				x.listedAt = time.Time{}
				if x.parent != nil && !x.metaDirty {
					x.metaKnown = false
				}
			case !x.dirty && !x.metaDirty && x.remote:
				l.staleLocked(x)
			}
		})
	}
	l.mu.Unlock()

	posix.Invalidate(l.root.EmbeddedInode(), sub)
	return nil
}
