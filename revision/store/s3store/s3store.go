package s3store

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"

	"github.com/amlfs/amlfs/s3client"
)

// DefaultPrefix is AML's default key prefix for S3 workspaces.
const DefaultPrefix = "aml/workspaces"

// Store is the S3 store: ROOT is the key prefix PREFIX/seg(id)/.
type Store struct {
	Client *s3.Client
	Bucket string
	Prefix string
	ID     string
	Seg    string
	// LockRefresh and LockStale follow AML's 5 and 20 minute policy.
	LockRefresh, LockStale time.Duration
	// Parallel bounds concurrent object uploads and copies.
	Parallel int
	Now      func() time.Time
}

// New returns the S3 store of workspace id under bucket/prefix.
func New(client *s3.Client, bucket, prefix, id string) (*Store, error) {
	seg, err := format.Seg(id)
	if err != nil {
		return nil, err
	}
	return &Store{Client: client, Bucket: bucket, Prefix: strings.Trim(prefix, "/"), ID: id, Seg: seg,
		LockRefresh: 5 * time.Minute, LockStale: 20 * time.Minute, Parallel: 16, Now: time.Now}, nil
}

func (s *Store) root() string {
	if s.Prefix == "" {
		return s.Seg + "/"
	}
	return s.Prefix + "/" + s.Seg + "/"
}

// key is k's full key; a foreign key's is in its workspace's root.
func (s *Store) key(k string) string {
	if seg, rest, ok := store.SplitForeign(k); ok {
		o := *s
		o.Seg = seg
		return o.root() + rest
	}
	return s.root() + k
}

// Sibling returns the store of workspace id under the same prefix.
func (s *Store) Sibling(id string) (store.Store, error) {
	seg, err := format.Seg(id)
	if err != nil {
		return nil, err
	}
	o := *s
	o.ID, o.Seg = id, seg
	return &o, nil
}

// Foreign returns key as the workspace's siblings name it.
func (s *Store) Foreign(key string) string { return store.ForeignKey(s.Seg, key) }

func (s *Store) String() string {
	return "s3://" + s.Bucket + "/" + strings.TrimSuffix(s.root(), "/")
}

func (s *Store) wrap(op, key string, err error) error {
	switch {
	case err == nil:
		return nil
	case s3client.Code(err) == "NoSuchBucket":
		// Not "no index yet": a new workspace needs a bucket.
		return fmt.Errorf("%s s3://%s/%s: %w", op, s.Bucket, key, s3client.Explain(s.Bucket, err))
	case s3client.IsNotFound(err):
		return fmt.Errorf("%w: s3://%s/%s", store.ErrNotExist, s.Bucket, key)
	case s3client.IsPrecondition(err):
		return fmt.Errorf("%w: s3://%s/%s", store.ErrPrecondition, s.Bucket, key)
	}
	return fmt.Errorf("%s s3://%s/%s: %w", op, s.Bucket, key, s3client.Explain(s.Bucket, err))
}

func (s *Store) get(ctx context.Context, key string, limit int64) ([]byte, string, error) {
	out, err := s3client.Get(ctx, s.Client, &s3.GetObjectInput{Bucket: &s.Bucket, Key: aws.String(key)})
	if err != nil {
		return nil, "", s.wrap("get", key, err)
	}
	defer out.Body.Close()
	data, err := store.ReadAllLimited(out.Body, limit, key)
	if err != nil {
		return nil, "", err
	}
	return data, aws.ToString(out.ETag), nil
}

func (s *Store) ReadIndex(ctx context.Context) ([]byte, string, error) {
	return s.get(ctx, s.key(format.IndexKey), format.MaxIndexBytes)
}

// PublishIndex writes workspace.json with If-Match on the observed ETag, or
// If-None-Match: * when there was none.
func (s *Store) PublishIndex(ctx context.Context, data []byte, prev string) (string, error) {
	in := &s3.PutObjectInput{Bucket: &s.Bucket, Key: aws.String(s.key(format.IndexKey)), Body: bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data))), ContentType: aws.String("application/json")}
	if prev == "" {
		in.IfNoneMatch = aws.String("*")
	} else {
		in.IfMatch = aws.String(prev)
	}
	out, err := s.Client.PutObject(ctx, in)
	if err != nil {
		err = s.wrap("put", *in.Key, err)
		if errors.Is(err, store.ErrNotExist) {
			// If-Match on an index that is gone.
			return "", fmt.Errorf("%w: %s disappeared", store.ErrPrecondition, format.IndexKey)
		}
		if errors.Is(err, store.ErrPrecondition) {
			// The SDK retries a PUT whose response was lost; if the first
			// attempt landed, the retry fails its own precondition. That
			// is our publication, not another writer's: the index holds
			// exactly our bytes.
			if cur, etag, gerr := s.ReadIndex(ctx); gerr == nil && bytes.Equal(cur, data) {
				return etag, nil
			}
		}
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

func (s *Store) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := store.CheckKey(key); err != nil {
		return nil, err
	}
	out, err := s3client.Get(ctx, s.Client, &s3.GetObjectInput{Bucket: &s.Bucket, Key: aws.String(s.key(key))})
	if err != nil {
		return nil, s.wrap("get", s.key(key), err)
	}
	return out.Body, nil
}

// list calls fn for every key under prefix (full keys).
func (s *Store) list(ctx context.Context, prefix, delimiter string, fn func(key string, isPrefix bool) error) error {
	in := &s3.ListObjectsV2Input{Bucket: &s.Bucket, Prefix: aws.String(prefix)}
	if delimiter != "" {
		in.Delimiter = aws.String(delimiter)
	}
	p := s3.NewListObjectsV2Paginator(s.Client, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return s.wrap("list", prefix, err)
		}
		for _, cp := range page.CommonPrefixes {
			if err := fn(aws.ToString(cp.Prefix), true); err != nil {
				return err
			}
		}
		for _, o := range page.Contents {
			if err := fn(aws.ToString(o.Key), false); err != nil {
				return err
			}
		}
	}
	return nil
}

// deletePrefix removes every key under prefix, in batches of 1000 (S3's
// most per DeleteObjects), several batches at once while the listing goes
// on.
func (s *Store) deletePrefix(ctx context.Context, prefix string) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(deleteParallel)
	var batch []types.ObjectIdentifier
	flush := func() {
		if len(batch) == 0 {
			return
		}
		objs := batch
		batch = nil
		g.Go(func() error {
			out, err := s.Client.DeleteObjects(gctx, &s3.DeleteObjectsInput{Bucket: &s.Bucket, Delete: &types.Delete{Objects: objs, Quiet: aws.Bool(true)}})
			if err != nil {
				return s.wrap("delete", prefix, err)
			}
			if len(out.Errors) > 0 {
				e := out.Errors[0]
				return fmt.Errorf("delete s3://%s/%s: %s", s.Bucket, aws.ToString(e.Key), aws.ToString(e.Message))
			}
			return nil
		})
	}
	err := s.list(gctx, prefix, "", func(key string, _ bool) error {
		batch = append(batch, types.ObjectIdentifier{Key: aws.String(key)})
		if len(batch) == 1000 {
			flush()
		}
		return nil
	})
	flush()
	if werr := g.Wait(); err == nil {
		err = werr
	}
	return err
}

// deleteParallel is how many DeleteObjects batches run at once.
const deleteParallel = 4

func (s *Store) Remove(ctx context.Context, key string) error {
	if err := store.CheckKey(key); err != nil {
		return err
	}
	if store.IsForeign(key) {
		return fmt.Errorf("remove %s: another workspace's object", key)
	}
	if strings.HasSuffix(key, "/") {
		return s.deletePrefix(ctx, s.key(key))
	}
	_, err := s.Client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.Bucket, Key: aws.String(s.key(key))})
	if err != nil && !s3client.IsNotFound(err) {
		return s.wrap("delete", s.key(key), err)
	}
	return nil
}

func (s *Store) Artifacts(ctx context.Context) ([]string, error) {
	var keys []string
	root := s.root()
	err := s.list(ctx, root+"revisions/", "/", func(key string, _ bool) error {
		keys = append(keys, strings.TrimPrefix(key, root))
		return nil
	})
	return keys, err
}

func (s *Store) Destroy(ctx context.Context) error {
	return s.deletePrefix(ctx, s.root())
}

func (s *Store) Stage(ctx context.Context, key string) (store.Stager, error) {
	if err := store.CheckKey(key); err != nil || store.IsForeign(key) {
		return nil, amlerr.New(amlerr.InvalidStore, key, "not an artifact key of this store")
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, s.Parallel))
	return &s3Stager{s: s, key: key, folder: strings.HasSuffix(key, "/"), g: g, gctx: gctx}, nil
}

// s3Stager writes an artifact's objects straight to their final keys, each
// with If-None-Match: *, so that no write ever replaces an existing object.
// A folder's manifest.json is written last, at Commit, once every file
// object is in place: a folder revision without its manifest is incomplete
// and the index never names it before publication.
type s3Stager struct {
	s      *Store
	key    string
	folder bool
	g      *errgroup.Group
	gctx   context.Context

	mu      sync.Mutex
	written []string // GUARDED_BY(mu): object keys written, for Abort
	pending []byte   // the manifest, written at Commit
	landed  func(string, int64)
	failed  bool // a request of the stage failed: the group cancelled the others
}

func (st *s3Stager) OnWritten(fn func(string, int64)) { st.landed = fn }

func (st *s3Stager) objectKey(name string) (string, error) {
	if !st.folder {
		if name != "" {
			return "", fmt.Errorf("archive artifact has a single object, not %q", name)
		}
		return st.s.key(st.key), nil
	}
	if err := format.ValidPath(name); err != nil {
		return "", err
	}
	return st.s.key(st.key + name), nil
}

// expect notes key before a request that may create it, so that Abort
// removes it even when the request's answer is lost: a request cancelled
// (another upload of the save failed) or timed out may still have landed.
func (st *s3Stager) expect(key string) {
	st.mu.Lock()
	st.written = append(st.written, key)
	st.mu.Unlock()
}

// disown drops key from what Abort removes: an object found there
// already, which is not this save's.
func (st *s3Stager) disown(key string) {
	st.mu.Lock()
	st.written = slices.DeleteFunc(st.written, func(k string) bool { return k == key })
	st.mu.Unlock()
}

// record reports key landed, with its size (0 for a copy).
func (st *s3Stager) record(key string, size int64) {
	if st.landed != nil {
		st.landed(strings.TrimPrefix(key, st.s.key(st.key)), size)
	}
}

// Put uploads one object. Files from disk upload in the background (up to
// Parallel at once); errors surface at Commit.
func (st *s3Stager) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	key, err := st.objectKey(name)
	if err != nil {
		return err
	}
	if st.folder && name == "manifest.json" {
		data, err := store.ReadAllLimited(r, max(size, format.MaxManifestBytes), name)
		if err != nil {
			return err
		}
		st.pending = data
		return nil
	}
	if f, ok := r.(*os.File); ok && size >= 0 {
		// Reopen so the caller may close its file when Put returns.
		g, err := os.Open(f.Name())
		if err != nil {
			return err
		}
		st.g.Go(func() error {
			defer g.Close()
			return st.put(st.gctx, key, g, size)
		})
		return nil
	}
	if size < 0 {
		// An unknown length (a streamed archive): spool to a temp file so
		// the upload is a single conditional PUT with a known length.
		tmp, err := os.CreateTemp("", "amlfs-upload-*")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		defer tmp.Close()
		if size, err = io.Copy(tmp, r); err != nil {
			return err
		}
		if _, err := tmp.Seek(0, io.SeekStart); err != nil {
			return err
		}
		return st.put(ctx, key, tmp, size)
	}
	data, err := store.ReadAllLimited(r, size, name)
	if err != nil {
		return err
	}
	return st.put(ctx, key, bytes.NewReader(data), size)
}

func (st *s3Stager) PutFile(ctx context.Context, name string, f *os.File, done func(store.Stamp, error)) error {
	key, err := st.objectKey(name)
	if err != nil {
		f.Close()
		return err
	}
	st.g.Go(func() error {
		defer f.Close()
		stp, err := st.putStable(name, key, f)
		if errors.Is(err, store.ErrUnsettled) {
			done(stp, err)
			return nil
		}
		if err != nil {
			return err
		}
		done(stp, nil)
		return nil
	})
	return nil
}

// putStable uploads f's bytes at one instant (store.ReadStable) to key, and
// reports them landed under name.
func (st *s3Stager) putStable(name, key string, f *os.File) (store.Stamp, error) {
	stp, err := store.ReadStable(f, func(size int64, attempt int) error {
		// A retry replaces the object our earlier try wrote: the key is
		// under this save's own new revision.
		return st.putObject(st.gctx, key, io.NewSectionReader(f, 0, size), size, attempt == 0, false)
	})
	if errors.Is(err, store.ErrUnsettled) {
		// Nothing is left at key: the last try's object may hold torn
		// bytes.
		if _, derr := st.s.Client.DeleteObject(st.gctx, &s3.DeleteObjectInput{Bucket: &st.s.Bucket, Key: aws.String(key)}); derr != nil {
			return store.Stamp{}, st.s.wrap("delete", key, derr)
		}
		return store.Stamp{}, err
	}
	if err != nil {
		return store.Stamp{}, err
	}
	if st.landed != nil {
		st.landed(name, int64(stp.Size))
	}
	return stp, nil
}

func (st *s3Stager) Flush(ctx context.Context) error {
	err := st.g.Wait()
	if err != nil {
		st.failed = true
	}
	// The group is spent once waited on; later puts go to a new one.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, st.s.Parallel))
	st.g, st.gctx = g, gctx
	return err
}

// holdsOurBytes reports whether the object at key is exactly body: same
// size, and an ETag equal to body's MD5 (as S3 sets for a single PUT).
func (st *s3Stager) holdsOurBytes(ctx context.Context, key string, body io.ReadSeeker, size int64) bool {
	head, err := st.s.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &st.s.Bucket, Key: aws.String(key)})
	if err != nil || aws.ToInt64(head.ContentLength) != size {
		return false
	}
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return false
	}
	h := md5.New()
	if _, err := io.Copy(h, body); err != nil {
		return false
	}
	return strings.Trim(aws.ToString(head.ETag), `"`) == hex.EncodeToString(h.Sum(nil))
}

// put uploads one object with If-None-Match: *, so it never replaces one;
// large files go up in parallel parts (s3client.Put).
func (st *s3Stager) put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return st.putObject(ctx, key, body, size, true, true)
}

// putObject uploads one object, with If-None-Match: * when create is set;
// it records the object when record is set.
func (st *s3Stager) putObject(ctx context.Context, key string, body io.ReadSeeker, size int64, create, record bool) error {
	ra, ok := body.(io.ReaderAt)
	if !ok {
		return fmt.Errorf("put %s: body is not seekable", key)
	}
	if create {
		// A retry (!create) was expected by the first try.
		st.expect(key)
	}
	_, err := s3client.Put(ctx, st.s.Client, s3client.Upload{Bucket: st.s.Bucket, Key: key, Body: ra, Size: size, IfNoneMatch: create})
	if err != nil {
		if create && s3client.IsPrecondition(err) {
			if st.holdsOurBytes(ctx, key, body, size) {
				// Our own PUT landed and the SDK's retry of it failed
				// its precondition.
				if record {
					st.record(key, size)
				}
				return nil
			}
			st.disown(key)
			return fmt.Errorf("%w: s3://%s/%s", store.ErrExist, st.s.Bucket, key)
		}
		return st.s.wrap("put", key, err)
	}
	if record {
		st.record(key, size)
	}
	return nil
}

func (st *s3Stager) Reuse(ctx context.Context, name, fromKey string, local *os.File, done func(*store.Stamp, error)) error {
	if err := store.CheckKey(fromKey); err != nil {
		store.CloseLocal(local)
		return err
	}
	key, err := st.objectKey(name)
	if err != nil {
		store.CloseLocal(local)
		return err
	}
	src := s3client.CopySource(st.s.Bucket, st.s.key(fromKey))
	st.g.Go(func() error {
		defer store.CloseLocal(local)
		st.expect(key)
		_, err := st.s.Client.CopyObject(st.gctx, &s3.CopyObjectInput{Bucket: &st.s.Bucket, Key: aws.String(key),
			CopySource: aws.String(src), IfNoneMatch: aws.String("*")})
		switch {
		case err == nil:
			st.record(key, 0)
			done(nil, nil)
			return nil
		case s3client.IsPrecondition(err):
			st.disown(key)
			return fmt.Errorf("%w: s3://%s/%s", store.ErrExist, st.s.Bucket, key)
		case s3client.IsNotFound(err):
			// The base revision was pruned: write the bytes from the
			// tree.
			if local == nil {
				return store.BaseGone(fromKey)
			}
			stp, err := st.putStable(name, key, local)
			if errors.Is(err, store.ErrUnsettled) {
				done(nil, err)
				return nil
			}
			if err != nil {
				return err
			}
			done(&stp, nil)
			return nil
		}
		return st.s.wrap("copy", key, err)
	})
	return nil
}

func (st *s3Stager) Commit(ctx context.Context) error {
	if err := st.g.Wait(); err != nil {
		st.failed = true
		return err
	}
	if st.folder {
		if st.pending == nil {
			return fmt.Errorf("folder artifact %s has no manifest", st.key)
		}
		return st.put(ctx, st.s.key(st.key+"manifest.json"), bytes.NewReader(st.pending), int64(len(st.pending)))
	}
	return nil
}

func (st *s3Stager) Abort(ctx context.Context) error {
	failed := st.g.Wait() != nil || st.failed
	// When a request failed, the group cancelled the others; a cancelled
	// request may still land on the server after its answer was given up
	// (its copy or upload completes there): the objects are removed again
	// after a pause, and again.
	var err error
	for i, pause := range abortPasses {
		if i > 0 && !failed {
			break
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		}
		err = st.removeStaged(ctx, i > 0)
	}
	return err
}

// abortPasses are the pauses before each removal of an aborted stage's
// objects.
var abortPasses = [...]time.Duration{0, 250 * time.Millisecond, time.Second}

// removeStaged removes the objects the stage noted: all of them, or
// again (after a pause), those of them a listing finds under a folder's
// prefix, which then costs a listing, not a request per object.
func (st *s3Stager) removeStaged(ctx context.Context, again bool) error {
	st.mu.Lock()
	written := slices.Clone(st.written)
	st.mu.Unlock()
	if again && st.folder {
		ours := make(map[string]bool, len(written))
		for _, k := range written {
			ours[k] = true
		}
		written = written[:0]
		if err := st.s.list(ctx, st.s.key(st.key), "", func(key string, _ bool) error {
			if ours[key] {
				written = append(written, key)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	var errs []error
	for _, k := range written {
		if _, err := st.s.Client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &st.s.Bucket, Key: aws.String(k)}); err != nil && !s3client.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// SameObject reports whether keys a and b have the same ETag: a revision
// reuses an unchanged file of the previous one with a server-side copy,
// which keeps it.
func (s *Store) SameObject(ctx context.Context, a, b string) bool {
	if store.CheckKey(a) != nil || store.CheckKey(b) != nil {
		return false
	}
	ha, err := s.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.Bucket, Key: aws.String(s.key(a))})
	if err != nil || ha.ETag == nil {
		return false
	}
	hb, err := s.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.Bucket, Key: aws.String(s.key(b))})
	return err == nil && aws.ToString(hb.ETag) == *ha.ETag
}
