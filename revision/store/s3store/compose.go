package s3store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/s3client"
)

// composeParallel is how many parts of a composition go up at once.
const composeParallel = 4

// ReadRange reads a range of an object with one ranged GET (store.Store).
func (s *Store) ReadRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, int64, error) {
	if err := store.CheckKey(key); err != nil {
		return nil, 0, err
	}
	if n <= 0 {
		return nil, 0, fmt.Errorf("read range of %d bytes", n)
	}
	in := &s3.GetObjectInput{Bucket: &s.Bucket, Key: aws.String(s.key(key))}
	if off < 0 {
		// A suffix (an archive's index): the answer says the object's
		// size; a body cut short is asked for again by offset, which
		// resumes (s3client.Get).
		in.Range = aws.String("bytes=-" + strconv.FormatInt(n, 10))
		body, size, err := s.getRange(ctx, in, false)
		if err != nil {
			return nil, 0, err
		}
		want := min(n, size)
		data, rerr := store.ReadAllLimited(body, want, key)
		body.Close()
		if rerr == nil && int64(len(data)) == want {
			return io.NopCloser(bytes.NewReader(data)), size, nil
		}
		if want == 0 {
			return io.NopCloser(bytes.NewReader(nil)), size, nil
		}
		off, n = size-want, want
	}
	in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	return s.getRange(ctx, in, true)
}

// getRange is one ranged GET, with the object's whole size; resume picks
// up a body that breaks off (s3client.Get), which needs explicit offsets.
func (s *Store) getRange(ctx context.Context, in *s3.GetObjectInput, resume bool) (io.ReadCloser, int64, error) {
	var out *s3.GetObjectOutput
	var err error
	if resume {
		out, err = s3client.Get(ctx, s.Client, in)
	} else {
		out, err = s.Client.GetObject(ctx, in)
	}
	if err != nil {
		return nil, 0, s.wrap("get", *in.Key, err)
	}
	size, err := totalSize(out)
	if err != nil {
		out.Body.Close()
		return nil, 0, s.wrap("get", *in.Key, err)
	}
	return out.Body, size, nil
}

// totalSize is the object's size a ranged GET's Content-Range gives
// ("bytes A-B/SIZE"), or its length when the server sent it whole.
func totalSize(out *s3.GetObjectOutput) (int64, error) {
	cr := aws.ToString(out.ContentRange)
	if cr == "" {
		return aws.ToInt64(out.ContentLength), nil
	}
	_, total, ok := strings.Cut(cr, "/")
	size, err := strconv.ParseInt(total, 10, 64)
	if !ok || err != nil || size < 0 {
		return 0, fmt.Errorf("a Content-Range of %q", cr)
	}
	return size, nil
}

// Compose writes the archive as one multipart upload (store.Stager):
// ranges of existing objects are UploadPartCopy parts, copied by the
// server, under S3's part rules (store.PlanParts); the completion is
// conditional (If-None-Match: *), so it never replaces an object.
func (st *s3Stager) Compose(ctx context.Context, pieces []store.Piece) error {
	if st.folder {
		return errors.New("a folder artifact is not composed")
	}
	if err := store.CheckPieces(pieces); err != nil {
		return err
	}
	parts, err := store.PlanParts(pieces, store.MinPart, store.MaxPart, store.MaxParts)
	if err != nil {
		return err
	}
	key := st.s.key(st.key)
	c := st.s.Client
	mu, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &st.s.Bucket, Key: &key})
	if err != nil {
		return st.s.wrap("create multipart upload", key, err)
	}
	abort := func() {
		c.AbortMultipartUpload(context.WithoutCancel(ctx), &s3.AbortMultipartUploadInput{Bucket: &st.s.Bucket, Key: &key, UploadId: mu.UploadId})
	}
	get := func(ctx context.Context, k string, off, n int64) (io.ReadCloser, error) {
		r, _, err := st.s.ReadRange(ctx, k, off, n)
		return r, err
	}
	done := make([]types.CompletedPart, len(parts))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(composeParallel)
	var total int64
	for i, p := range parts {
		num := aws.Int32(int32(i + 1))
		total += p.N
		g.Go(func() error {
			if p.Copy {
				pc := p.Pieces[0]
				out, err := c.UploadPartCopy(gctx, &s3.UploadPartCopyInput{Bucket: &st.s.Bucket, Key: &key, UploadId: mu.UploadId, PartNumber: num,
					CopySource:      aws.String(s3client.CopySource(st.s.Bucket, st.s.key(pc.Key))),
					CopySourceRange: aws.String(fmt.Sprintf("bytes=%d-%d", pc.Off, pc.Off+pc.N-1))})
				if err != nil {
					return st.s.wrap("copy part", st.s.key(pc.Key), err)
				}
				if out.CopyPartResult == nil {
					return amlerr.New(amlerr.StoreOffline, key, "the server answered a part copy with no result")
				}
				done[i] = types.CompletedPart{ETag: out.CopyPartResult.ETag, PartNumber: num}
				return nil
			}
			data, err := store.ReadPart(gctx, p, get)
			if err != nil {
				return err
			}
			out, err := c.UploadPart(gctx, &s3.UploadPartInput{Bucket: &st.s.Bucket, Key: &key, UploadId: mu.UploadId, PartNumber: num,
				Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data)))})
			if err != nil {
				return st.s.wrap("upload part", key, err)
			}
			done[i] = types.CompletedPart{ETag: out.ETag, PartNumber: num}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		abort()
		return err
	}
	st.expect(key)
	_, err = c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: &st.s.Bucket, Key: &key, UploadId: mu.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: done}, IfNoneMatch: aws.String("*")})
	if err != nil {
		abort()
		if s3client.IsPrecondition(err) {
			st.disown(key)
			return fmt.Errorf("%w: s3://%s/%s", store.ErrExist, st.s.Bucket, key)
		}
		return st.s.wrap("complete multipart upload", key, err)
	}
	st.record(key, total)
	return nil
}
