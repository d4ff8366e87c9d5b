package s3client

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"
)

// Objects larger than MultipartThreshold upload in parallel parts.
const (
	MultipartThreshold = 64 << 20
	minPartSize        = 16 << 20
	partParallel       = 8
	maxParts           = 10000
)

// Upload is one object to put.
type Upload struct {
	Bucket, Key string
	Body        io.ReaderAt
	Size        int64
	Metadata    map[string]string
	ContentType string
	// IfNoneMatch makes the upload fail with 412 if the key exists.
	IfNoneMatch bool
}

// Put uploads u with one PUT, or in parts, several at once, above
// MultipartThreshold. It returns the new object's ETag.
func Put(ctx context.Context, c *s3.Client, u Upload) (string, error) {
	var inm *string
	if u.IfNoneMatch {
		inm = aws.String("*")
	}
	var ct *string
	if u.ContentType != "" {
		ct = aws.String(u.ContentType)
	}
	if u.Size <= MultipartThreshold {
		out, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: &u.Bucket, Key: &u.Key, Body: io.NewSectionReader(u.Body, 0, u.Size),
			ContentLength: aws.Int64(u.Size), IfNoneMatch: inm, Metadata: u.Metadata, ContentType: ct})
		if err != nil {
			return "", err
		}
		return aws.ToString(out.ETag), nil
	}
	mu, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &u.Bucket, Key: &u.Key, Metadata: u.Metadata, ContentType: ct})
	if err != nil {
		return "", fmt.Errorf("create multipart upload: %w", err)
	}
	defer func() {
		if err != nil {
			c.AbortMultipartUpload(context.WithoutCancel(ctx), &s3.AbortMultipartUploadInput{Bucket: &u.Bucket, Key: &u.Key, UploadId: mu.UploadId})
		}
	}()
	part := max(int64(minPartSize), (u.Size+maxParts-1)/maxParts)
	n := int((u.Size + part - 1) / part)
	parts := make([]types.CompletedPart, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(partParallel)
	for i := range n {
		off := int64(i) * part
		length := min(part, u.Size-off)
		num := int32(i + 1)
		g.Go(func() error {
			out, err := c.UploadPart(gctx, &s3.UploadPartInput{Bucket: &u.Bucket, Key: &u.Key, UploadId: mu.UploadId,
				PartNumber: aws.Int32(num), Body: io.NewSectionReader(u.Body, off, length), ContentLength: aws.Int64(length)})
			if err != nil {
				return fmt.Errorf("upload part %d: %w", num, err)
			}
			parts[num-1] = types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(num)}
			return nil
		})
	}
	if err = g.Wait(); err != nil {
		return "", err
	}
	out, err := c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: &u.Bucket, Key: &u.Key, UploadId: mu.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}, IfNoneMatch: inm})
	if err != nil {
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

// CopySource is bucket/key for x-amz-copy-source, percent-encoded except
// for RFC 3986's unreserved characters and the slashes between segments.
// url.PathEscape is not enough: it keeps "+", which servers decode as a
// space, and other sub-delimiters some servers decode differently.
func CopySource(bucket, key string) string {
	const hex = "0123456789ABCDEF"
	s := bucket + "/" + key
	var b strings.Builder
	b.Grow(len(s) + len(s)/4)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '-', c == '_', c == '.', c == '~', c == '/':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}
