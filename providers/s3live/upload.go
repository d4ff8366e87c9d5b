package s3live

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/s3client"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"
)

func (l *Live) enqueuePut(e *ent, delay time.Duration) chan error {
	return l.q.add(&op{key: l.keyOf(e), kind: opPut, e: e}, delay, delay == 0)
}

func (l *Live) enqueueDel(key string) {
	l.q.add(&op{key: key, kind: opDel}, l.o.WriteBack, false)
}

// runOps runs a batch from the queue: one put, or up to 1000 deletes.
func (l *Live) runOps(batch []*op) []error {
	ctx := context.Background()
	errs := make([]error, len(batch))
	if batch[0].kind == opDel {
		keys := make([]types.ObjectIdentifier, len(batch))
		for i, o := range batch {
			keys[i] = types.ObjectIdentifier{Key: aws.String(o.key)}
		}
		out, err := l.o.Client.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: &l.o.Bucket, Delete: &types.Delete{Objects: keys, Quiet: aws.Bool(true)}})
		if err != nil {
			// Not every server has DeleteObjects: one at a time.
			for i, o := range batch {
				_, errs[i] = l.o.Client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &l.o.Bucket, Key: aws.String(o.key)})
				if errs[i] != nil && s3client.IsNotFound(errs[i]) {
					errs[i] = nil
				}
			}
		} else {
			failed := map[string]error{}
			for _, e := range out.Errors {
				if aws.ToString(e.Code) != "NoSuchKey" {
					failed[aws.ToString(e.Key)] = fmt.Errorf("delete: %s %s", aws.ToString(e.Code), aws.ToString(e.Message))
				}
			}
			for i, o := range batch {
				errs[i] = failed[o.key]
			}
		}
		var done []string
		for i, o := range batch {
			if errs[i] != nil {
				l.errno("delete", o.key, errs[i])
			} else {
				done = append(done, o.key)
			}
		}
		l.buried(done)
		return errs
	}
	o := batch[0]
	errs[0] = l.put(ctx, o)
	if errs[0] != nil && !errors.Is(errs[0], errGiveUp) { // put logged a final one
		l.errno("upload", o.key, errs[0])
	}
	return errs
}

// put uploads e's bytes (or only its metadata, or a directory marker) to
// the key the op names, if e still lives there.
func (l *Live) put(ctx context.Context, o *op) error {
	e := o.e
	l.mu.Lock()
	if e.gone {
		l.mu.Unlock()
		return nil // deleted since
	}
	if l.key(e) != o.key {
		// Moved since: upload at the new key (the move deletes the old).
		l.mu.Unlock()
		l.enqueuePut(e, l.o.WriteBack)
		return nil
	}
	l.syncDirtyLocked(e)
	gen, dirty, md := e.gen, e.dirty, metadata(e)
	up := s3client.Upload{Bucket: l.o.Bucket, Key: o.key, Metadata: md}
	var body *strings.Reader
	switch {
	case e.isDir():
		body, up.ContentType = strings.NewReader(""), dirContentType
	case e.mode&syscall.S_IFMT == syscall.S_IFLNK:
		body = strings.NewReader(e.link)
	case dirty:
		up.Body, up.Size = e.data.Reader(), e.size
	case !e.metaDirty:
		l.mu.Unlock()
		return nil
	}
	if body != nil {
		up.Body, up.Size = body, body.Size()
	}
	l.mu.Unlock()

	var etag string
	var err error
	if up.Body == nil {
		etag, err = l.setMetadata(ctx, o.key, md)
		if s3client.IsNotFound(err) && s3client.Code(err) != "NoSuchBucket" {
			// Deleted by another client: there is nothing left to
			// give the metadata to, now or on a retry.
			l.o.Log.Error("s3 live mount: the object is gone from the bucket (deleted by another client?); its mode, owner and times are not saved", "op", "upload", "path", l.url(o.key))
			l.mu.Lock()
			e.metaDirty, e.remote = false, false
			l.mu.Unlock()
			return fmt.Errorf("set metadata of %s: the object is gone: %w", l.url(o.key), errGiveUp)
		}
	} else {
		etag, err = s3client.Put(ctx, l.o.Client, up)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	l.health = nil
	delete(l.tombs, o.key)
	e.changed = time.Now()
	e.remote = true
	if !e.isDir() {
		e.etag = etag
	}
	e.upGen = max(e.upGen, gen)
	if e.gen == gen && e.ptWriters == 0 {
		if e.dirty && e.data != nil {
			e.data.Unpin()
		}
		e.dirty, e.metaDirty = false, false
		if e.gone && e.data != nil && e.opens == 0 {
			e.data.Drop()
			e.data = nil
		}
	}
	return nil
}

// setMetadata replaces the metadata of the object at key. S3 does this
// by copying an object onto itself, but not every S3-compatible server
// copies a key onto itself safely (versitygw's posix backend empties it),
// so the object goes to a temporary key and back.
func (l *Live) setMetadata(ctx context.Context, key string, md map[string]string) (string, error) {
	tmp := key + ".amlfs-meta-" + strconv.FormatUint(l.ino.Add(1), 36)
	if _, err := l.o.Client.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &l.o.Bucket, Key: &tmp, CopySource: aws.String(s3client.CopySource(l.o.Bucket, key)),
		Metadata: md, MetadataDirective: types.MetadataDirectiveReplace}); err != nil {
		return "", err
	}
	defer l.o.Client.DeleteObject(context.WithoutCancel(ctx), &s3.DeleteObjectInput{Bucket: &l.o.Bucket, Key: &tmp})
	out, err := l.o.Client.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &l.o.Bucket, Key: &key, CopySource: aws.String(s3client.CopySource(l.o.Bucket, tmp)),
		MetadataDirective: types.MetadataDirectiveCopy})
	if err != nil {
		return "", err
	}
	if out.CopyObjectResult == nil {
		return "", nil
	}
	return aws.ToString(out.CopyObjectResult.ETag), nil
}

// moveKeys copies every object under from to the same name under to, then
// deletes the originals (a directory rename).
func (l *Live) moveKeys(ctx context.Context, from, to string) error {
	var keys []string
	p := s3.NewListObjectsV2Paginator(l.o.Client, &s3.ListObjectsV2Input{Bucket: &l.o.Bucket, Prefix: &from})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, o := range out.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	sort.Strings(keys)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(l.o.Workers)
	for _, k := range keys {
		g.Go(func() error {
			dst := to + strings.TrimPrefix(k, from)
			if strings.HasSuffix(k, "/") {
				// A directory marker: some servers refuse to copy
				// one, so put a new marker with the old metadata.
				head, err := l.o.Client.HeadObject(gctx, &s3.HeadObjectInput{Bucket: &l.o.Bucket, Key: &k})
				if err != nil {
					return err
				}
				_, err = l.o.Client.PutObject(gctx, &s3.PutObjectInput{Bucket: &l.o.Bucket, Key: &dst, Body: strings.NewReader(""),
					ContentLength: aws.Int64(0), Metadata: head.Metadata, ContentType: aws.String(dirContentType)})
				return err
			}
			_, err := l.o.Client.CopyObject(gctx, &s3.CopyObjectInput{Bucket: &l.o.Bucket, Key: &dst,
				CopySource: aws.String(s3client.CopySource(l.o.Bucket, k))})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for i := 0; i < len(keys); i += 1000 {
		var ids []types.ObjectIdentifier
		for _, k := range keys[i:min(i+1000, len(keys))] {
			ids = append(ids, types.ObjectIdentifier{Key: aws.String(k)})
		}
		if _, err := l.o.Client.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: &l.o.Bucket, Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)}}); err != nil {
			return err
		}
	}
	return nil
}
