package s3store

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/amlfs/amlfs/revision/store"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/uuid"
)

// Probe checks reachability and access, then whether the server honours
// If-None-Match: * and If-Match, with a scratch key under the workspace
// root that it removes afterwards. Some S3-compatible servers accept both
// headers and ignore them; publishing to such a store is not safe.
func (s *Store) Probe(ctx context.Context) store.Probe {
	var p store.Probe
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
	case errors.Is(err, store.ErrPrecondition):
		p.IfNoneMatch = true
	case err == nil:
		p.Error = "the server accepted If-None-Match: * on an existing key and overwrote it"
	default:
		p.Error = fmt.Sprintf("If-None-Match probe: %v", err)
		return p
	}
	_, err = put("3", "", `"0123456789abcdef0123456789abcdef"`)
	switch {
	case errors.Is(err, store.ErrPrecondition):
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
