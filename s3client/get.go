package s3client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// stuckResumes bounds how often in a row one GET's body is picked up again
// without a byte having arrived since the last time; a resume that brought
// bytes resets the count, so a long body on a connection that keeps
// breaking still completes. resumeBackoff is the first wait before a
// resume that follows one without progress; it doubles up to
// maxResumeBackoff.
const (
	stuckResumes     = 8
	resumeBackoff    = 20 * time.Millisecond
	maxResumeBackoff = time.Second
)

// Get is GetObject whose body survives a connection that drops mid-way:
// the SDK retries a request until its response headers arrive, but a body
// that breaks off after that (a reset, a truncated response) reaches the
// reader as an error. Get's body then asks again for the bytes still due,
// with a ranged GET conditional on the first response's ETag, so the bytes
// it returns are always one version of the object, and exactly as many as
// the response announced: a short body is an error, never a short read
// passed off as the end. in.Range, if set, must be "bytes=A-B".
func Get(ctx context.Context, c *s3.Client, in *s3.GetObjectInput) (*s3.GetObjectOutput, error) {
	out, err := c.GetObject(ctx, in)
	if err != nil {
		return nil, err
	}
	var start int64
	if in.Range != nil {
		var end int64
		if _, err := fmt.Sscanf(*in.Range, "bytes=%d-%d", &start, &end); err != nil {
			out.Body.Close()
			return nil, fmt.Errorf("unsupported range %q", *in.Range)
		}
	}
	if out.ContentLength == nil || out.ETag == nil {
		return out, nil // nothing to check against; take the body as is
	}
	out.Body = &resumingBody{ctx: ctx, c: c, in: *in, etag: *out.ETag, body: out.Body,
		pos: start, end: start + *out.ContentLength}
	return out, nil
}

type resumingBody struct {
	ctx      context.Context
	c        *s3.Client
	in       s3.GetObjectInput
	etag     string
	body     io.ReadCloser
	pos, end int64 // the next offset due, and the end of the response
	resumes  int   // resumes so far, for the error
	stuck    int   // resumes in a row without a byte since
	resumed  int64 // pos at the last resume
}

func (b *resumingBody) Read(p []byte) (int, error) {
	for {
		if b.pos >= b.end {
			return 0, io.EOF
		}
		if int64(len(p)) > b.end-b.pos {
			p = p[:b.end-b.pos]
		}
		n, err := b.body.Read(p)
		b.pos += int64(n)
		if n > 0 || err == nil {
			return n, nil
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // ended before the announced length
		}
		if b.resumes > 0 && b.pos == b.resumed {
			b.stuck++
		} else {
			b.stuck = 0
		}
		if b.stuck == stuckResumes || b.ctx.Err() != nil {
			return 0, fmt.Errorf("read %s: %w (after %d resumed requests)", aws.ToString(b.in.Key), err, b.resumes)
		}
		b.body.Close()
		if b.stuck > 0 {
			if werr := sleepCtx(b.ctx, min(resumeBackoff<<(b.stuck-1), maxResumeBackoff)); werr != nil {
				return 0, fmt.Errorf("read %s: %w; resuming: %w", aws.ToString(b.in.Key), err, werr)
			}
		}
		b.resumes++
		b.resumed = b.pos
		in := b.in
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", b.pos, b.end-1))
		in.IfMatch = aws.String(b.etag)
		out, gerr := b.c.GetObject(b.ctx, &in)
		if gerr != nil {
			b.body = io.NopCloser(errReader{gerr})
			return 0, fmt.Errorf("read %s: %w; resuming: %w", aws.ToString(b.in.Key), err, gerr)
		}
		b.body = out.Body
	}
}

func (b *resumingBody) Close() error { return b.body.Close() }

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
