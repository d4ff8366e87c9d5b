package revision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/uuid"
)

// Probe is what a preflight learns about a store.
type Probe struct {
	Reachable   bool   `json:"reachable"`
	Writable    bool   `json:"writable"`
	IfNoneMatch bool   `json:"ifNoneMatch"` // create-if-absent is honoured
	IfMatch     bool   `json:"ifMatch"`     // compare-and-swap is honoured
	Error       string `json:"error,omitempty"`
}

// Safe reports whether the store honours both conditional writes.
func (p Probe) Safe() bool { return p.Reachable && p.Writable && p.IfNoneMatch && p.IfMatch }

// Prober is a store that can check itself.
type Prober interface {
	Probe(ctx context.Context) Probe
}

// Probe checks the store directory: it must be creatable and writable.
// Conditional publication there is a compare-and-swap under flock, which
// any local filesystem honours.
func (s *FSStore) Probe(ctx context.Context) Probe {
	var p Probe
	if err := os.MkdirAll(s.Base, 0o755); err != nil {
		p.Error = err.Error()
		return p
	}
	p.Reachable = true
	f, err := os.CreateTemp(s.Base, ".amlfs-check-*")
	if err != nil {
		p.Error = err.Error()
		return p
	}
	f.Close()
	os.Remove(f.Name())
	unlock, err := flockDir(s.Base)
	if err != nil {
		p.Error = err.Error()
		return p
	}
	unlock()
	p.Writable, p.IfNoneMatch, p.IfMatch = true, true, true
	return p
}

// Probe checks reachability and access, then whether the server honours
// If-None-Match: * and If-Match, with a scratch key under the workspace
// root that it removes afterwards. Some S3-compatible servers accept both
// headers and ignore them; publishing to such a store is not safe.
func (s *S3Store) Probe(ctx context.Context) Probe {
	var p Probe
	if _, err := s.Client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &s.Bucket, Prefix: aws.String(s.root()), MaxKeys: aws.Int32(1)}); err != nil {
		p.Error = s.wrap("list", s.root(), err).Error()
		return p
	}
	p.Reachable = true
	key := s.key(".amlfs-check-" + uuid.NewString())
	put := func(body string, ifNoneMatch, ifMatch string) (string, error) {
		in := &s3.PutObjectInput{Bucket: &s.Bucket, Key: aws.String(key), Body: bytes.NewReader([]byte(body)), ContentLength: aws.Int64(int64(len(body)))}
		if ifNoneMatch != "" {
			in.IfNoneMatch = aws.String(ifNoneMatch)
		}
		if ifMatch != "" {
			in.IfMatch = aws.String(ifMatch)
		}
		out, err := s.Client.PutObject(ctx, in)
		if err != nil {
			return "", s.wrap("put", key, err)
		}
		return aws.ToString(out.ETag), nil
	}
	defer s.Client.DeleteObject(context.WithoutCancel(ctx), &s3.DeleteObjectInput{Bucket: &s.Bucket, Key: aws.String(key)})
	etag, err := put("1", "*", "")
	if err != nil {
		p.Error = fmt.Sprintf("write probe: %v", err)
		return p
	}
	p.Writable = true
	_, err = put("2", "*", "")
	switch {
	case errors.Is(err, ErrPrecondition):
		p.IfNoneMatch = true
	case err == nil:
		p.Error = "the server accepted If-None-Match: * on an existing key and overwrote it"
	default:
		p.Error = fmt.Sprintf("If-None-Match probe: %v", err)
		return p
	}
	_, err = put("3", "", `"0123456789abcdef0123456789abcdef"`)
	switch {
	case errors.Is(err, ErrPrecondition):
		p.IfMatch = true
	case err == nil:
		p.Error = joinMsg(p.Error, "the server accepted If-Match with a wrong ETag and overwrote the key")
	default:
		p.Error = joinMsg(p.Error, fmt.Sprintf("If-Match probe: %v", err))
	}
	if p.IfMatch {
		// And a matching ETag must succeed.
		cur := etag
		if !p.IfNoneMatch {
			// the second put replaced the object; learn its ETag
			out, err := s.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.Bucket, Key: aws.String(key)})
			if err == nil {
				cur = aws.ToString(out.ETag)
			}
		}
		if _, err := put("4", "", cur); err != nil {
			p.IfMatch = false
			p.Error = joinMsg(p.Error, fmt.Sprintf("If-Match with the current ETag failed: %v", err))
		}
	}
	return p
}

func joinMsg(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
