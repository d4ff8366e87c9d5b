package s3live

import (
	"context"
	"strings"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/s3client"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sync/errgroup"
)

type objInfo struct {
	name  string
	size  int64
	etag  string
	mtime time.Time
}

// list reads one directory level under dirKey, every page of it.
func (l *Live) list(ctx context.Context, dirKey string) (files []objInfo, dirs []string, err error) {
	p := s3.NewListObjectsV2Paginator(l.o.Client, &s3.ListObjectsV2Input{Bucket: &l.o.Bucket, Prefix: &dirKey, Delimiter: aws.String("/")})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return nil, nil, err
		}
		for _, o := range out.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), dirKey)
			if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
				continue // the directory's own marker
			}
			files = append(files, objInfo{name: name, size: aws.ToInt64(o.Size), etag: aws.ToString(o.ETag), mtime: aws.ToTime(o.LastModified)})
		}
		for _, cp := range out.CommonPrefixes {
			name := strings.TrimSuffix(strings.TrimPrefix(aws.ToString(cp.Prefix), dirKey), "/")
			if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
				continue
			}
			dirs = append(dirs, name)
		}
	}
	l.setHealth(nil)
	return files, dirs, nil
}

// loadDir makes d's children current: listed within the TTL, or listed
// now and merged with what is changed here and not uploaded yet.
func (l *Live) loadDir(ctx context.Context, d *ent) syscall.Errno {
	for {
		l.mu.Lock()
		if d.gone {
			l.mu.Unlock()
			return syscall.ENOENT
		}
		if !d.listedAt.IsZero() && time.Since(d.listedAt) < l.o.TTL {
			l.mu.Unlock()
			return 0
		}
		if ch := d.listing; ch != nil {
			l.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return syscall.EINTR
			}
		}
		ch := make(chan struct{})
		d.listing = ch
		key := l.key(d)
		l.mu.Unlock()

		start := time.Now()
		files, dirs, err := l.list(ctx, key)
		l.mu.Lock()
		d.listing = nil
		close(ch)
		if err != nil {
			l.mu.Unlock()
			return l.errno("list", key, err)
		}
		l.mergeLocked(d, key, files, dirs, start)
		l.mu.Unlock()
		return 0
	}
}

// mergeLocked folds a fresh listing into d. What was made, changed or
// deleted here and not yet uploaded wins over the listing; clean entries
// follow it, and a clean file whose ETag changed loses its cached bytes.
func (l *Live) mergeLocked(d *ent, key string, files []objInfo, dirs []string, start time.Time) {
	seen := make(map[string]bool, len(files)+len(dirs))
	for _, f := range files {
		seen[f.name] = true
		c := d.children[f.name]
		if c == nil {
			if l.tombedLocked(key+f.name, start) {
				continue // deleted here
			}
			d.children[f.name] = &ent{name: f.name, parent: d, ino: l.newIno(), mode: syscall.S_IFREG | 0o644, uid: l.o.UID, gid: l.o.GID,
				mtime: f.mtime, size: f.size, etag: f.etag, remote: true}
			continue
		}
		if c.isDir() || c.dirty || c.metaDirty || !c.remote || l.q.busy(key+f.name) {
			continue
		}
		if c.etag != f.etag {
			l.staleLocked(c)
			c.size, c.etag, c.mtime = f.size, f.etag, f.mtime
		}
	}
	for _, name := range dirs {
		seen[name] = true
		c := d.children[name]
		if c == nil {
			if l.tombedLocked(key+name+"/", start) || l.q.busyUnder(key+name+"/") {
				continue
			}
			d.children[name] = &ent{name: name, parent: d, ino: l.newIno(), mode: syscall.S_IFDIR | 0o755, uid: l.o.UID, gid: l.o.GID,
				mtime: time.Now(), remote: true, children: map[string]*ent{}}
			continue
		}
		c.remote = true
	}
	for name, c := range d.children {
		if seen[name] || c.changed.After(start) || l.busyLocked(c) {
			continue
		}
		// Gone from the bucket, and nothing here holds it.
		c.gone = true
		delete(d.children, name)
		if c.data != nil {
			c.data.Drop()
			c.data = nil
		}
	}
	d.listedAt = time.Now()
}

// tombedLocked reports whether key was deleted here after a listing that
// started at start could have seen it.
func (l *Live) tombedLocked(key string, start time.Time) bool {
	t, ok := l.tombs[key]
	return ok && (t.IsZero() || t.After(start))
}

// buried records finished deletes, for the keys and for the directories
// deleted here above them (a directory's prefix lists until its last key
// is gone).
func (l *Live) buried(keys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for _, k := range keys {
		if _, ok := l.tombs[k]; ok {
			l.tombs[k] = now
		}
		for p := strings.TrimSuffix(k, "/"); len(p) > len(l.o.Prefix); {
			i := strings.LastIndexByte(p, '/')
			if i < 0 {
				break
			}
			p = p[:i]
			if _, ok := l.tombs[p+"/"]; ok {
				l.tombs[p+"/"] = now
			}
		}
	}
	if now.Sub(l.lastPrune) > 30*time.Second {
		l.lastPrune = now
		for k, t := range l.tombs {
			if !t.IsZero() && now.Sub(t) > 5*time.Minute {
				delete(l.tombs, k)
			}
		}
	}
}

// syncDirtyLocked reads a dirty file's size and mtime from its cache file,
// which the kernel may have written directly.
func (l *Live) syncDirtyLocked(e *ent) {
	if !e.dirty || e.data == nil {
		return
	}
	if size, mtime, err := e.data.Stat(); err == nil {
		e.size, e.mtime = size, mtime
	}
}

// busyLocked reports whether e, or anything below it, has changes here
// that the bucket does not have yet.
func (l *Live) busyLocked(e *ent) bool {
	if !e.remote || e.dirty || e.metaDirty || e.opens > 0 {
		return true
	}
	if l.q.busy(l.key(e)) {
		return true
	}
	for _, c := range e.children {
		if l.busyLocked(c) {
			return true
		}
	}
	return false
}

// staleLocked drops a clean file's cached bytes and metadata: the object
// changed.
func (l *Live) staleLocked(e *ent) {
	if e.data != nil && !e.dirty {
		// Open handles read a fresh file on their next read; those the
		// kernel serves itself keep the old one until they close.
		if e.ptData != e.data {
			e.data.Drop()
		}
		e.data = nil
	}
	e.ver++
	e.metaKnown = false
	e.link = ""
}

// head reads e's metadata if it is not known yet (a file listed, not
// read; a directory that may have a marker).
func (l *Live) head(ctx context.Context, e *ent) syscall.Errno {
	l.mu.Lock()
	if e.metaKnown || !e.remote || e.parent == nil {
		l.mu.Unlock()
		return 0
	}
	key := l.key(e)
	l.mu.Unlock()
	out, err := l.o.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &l.o.Bucket, Key: &key})
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if s3client.IsNotFound(err) {
			if e.isDir() {
				e.metaKnown = true // no marker: the defaults stand
				return 0
			}
			e.gone = true
			if e.parent != nil && e.parent.children[e.name] == e {
				delete(e.parent.children, e.name)
			}
			return syscall.ENOENT
		}
		l.mu.Unlock()
		errno := l.errno("head", key, err)
		l.mu.Lock()
		return errno
	}
	if !e.isDir() && e.etag != "" && aws.ToString(out.ETag) != e.etag {
		l.staleLocked(e)
	}
	if !e.isDir() {
		e.size, e.etag = aws.ToInt64(out.ContentLength), aws.ToString(out.ETag)
	}
	applyMetadata(e, out.Metadata, aws.ToTime(out.LastModified))
	return 0
}

// headAll reads the metadata of d's children not read yet, several at
// once, so that a listing's lookups need no round trip each.
func (l *Live) headAll(ctx context.Context, d *ent) {
	l.mu.Lock()
	var todo []*ent
	for _, c := range d.children {
		if !c.metaKnown && c.remote {
			todo = append(todo, c)
		}
	}
	l.mu.Unlock()
	if len(todo) < 2 {
		return
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for _, c := range todo {
		g.Go(func() error { l.head(gctx, c); return nil })
	}
	g.Wait()
}

// --- reading ---
