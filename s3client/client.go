// Package s3client is the S3 client both of amlfs's S3 users share, the
// durable store (revision) and the live mount (providers/s3): the AWS
// SDK's standard config chain (environment, profiles, AWS_ENDPOINT_URL,
// AWS_CA_BUNDLE) plus the endpoint and path-style overrides from the
// command line, a retryer that backs off on throttling and 5xx but never
// retries a 412, GETs whose bodies survive a broken connection (Get),
// uploads that are conditional where asked (Put), s3:// URLs, and the
// mapping of S3 errors to what they mean.
package s3client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Options override the config chain.
type Options struct {
	Endpoint  string // --s3-endpoint
	PathStyle bool   // --s3-path-style
	// MaxAttempts bounds the tries of one request (default 8).
	MaxAttempts int
	// IOTimeout aborts a request, to be retried, when its connection has
	// brought nothing for this long: a stalled upload or download, or a
	// server that never answers (default DefaultIOTimeout).
	IOTimeout time.Duration
	// Observe, if set, is told of every HTTP request as it starts, with
	// its S3 operation; the function it returns is told, as the request
	// ends, of the response's status (0 when none came).
	Observe func(op string) (done func(status int)) `yaml:"-" json:"-"`
}

// observeMiddleware reports each attempt of a request to observe. It sits
// last in the deserialize step, next to the HTTP send, so that it sees
// every retry and the raw response.
func observeMiddleware(observe func(op string) func(status int)) func(*middleware.Stack) error {
	return func(st *middleware.Stack) error {
		return st.Deserialize.Add(middleware.DeserializeMiddlewareFunc("amlfsObserve",
			func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
				done := observe(awsmiddleware.GetOperationName(ctx))
				out, md, err := next.HandleDeserialize(ctx, in)
				status := 0
				if r, ok := out.RawResponse.(*smithyhttp.Response); ok && r != nil {
					status = r.StatusCode
				}
				done(status)
				return out, md, err
			}), middleware.After)
	}
}

// DefaultIOTimeout is Options.IOTimeout's default. It is long enough for a
// server to copy a large object before it answers.
const DefaultIOTimeout = 2 * time.Minute

// NewClient builds an S3 client from the standard config chain.
func NewClient(ctx context.Context, o Options) (*s3.Client, error) {
	// Keep a connection per concurrent request: the default of 10 idle
	// connections per host makes 16 uploads at once dial again and again.
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 256, 128
	})
	// A rolling window on every read of the connection. It also ends a
	// stalled upload: while the body is sent, the transport is reading for
	// the response, which a stalled server does not send.
	timeout := o.IOTimeout
	if timeout <= 0 {
		timeout = DefaultIOTimeout
	}
	hc = hc.WithReadTimeout(timeout)
	cfg, err := config.LoadDefaultConfig(ctx,
		config.WithHTTPClient(hc),
		config.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(so *retry.StandardOptions) {
				so.MaxAttempts = 8
				if o.MaxAttempts > 0 {
					so.MaxAttempts = o.MaxAttempts
				}
				so.MaxBackoff = 20 * time.Second
			})
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("load AWS config: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	return s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		so.UsePathStyle = o.PathStyle
		if o.Observe != nil {
			so.APIOptions = append(so.APIOptions, observeMiddleware(o.Observe))
		}
		// Only send checksums S3 requires: S3-compatible servers differ
		// in which of the newer flexible checksums they accept.
		so.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		so.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	}), nil
}

// URL is a parsed s3://bucket/prefix.
type URL struct {
	Bucket string
	Prefix string // without leading or trailing slash; may be empty
}

// ParseURL parses s3://bucket[/prefix]. defaultPrefix is used when the URL
// has none.
func ParseURL(raw, defaultPrefix string) (URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return URL{}, err
	}
	if u.Scheme != "s3" || u.Host == "" {
		return URL{}, fmt.Errorf("%q is not s3://bucket/prefix", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return URL{}, fmt.Errorf("%q: no user, query or fragment allowed", raw)
	}
	p := strings.Trim(u.Path, "/")
	if p == "" {
		p = defaultPrefix
	}
	for _, seg := range strings.Split(p, "/") {
		if p != "" && (seg == "" || seg == "." || seg == "..") {
			return URL{}, fmt.Errorf("%q: bad prefix segment %q", raw, seg)
		}
	}
	return URL{Bucket: u.Host, Prefix: p}, nil
}

// Status returns the HTTP status of an SDK error, or 0.
func Status(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// Code returns the API error code of an SDK error, or "".
func Code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// IsNotFound reports a missing key or bucket (404 from GET or HEAD).
func IsNotFound(err error) bool {
	switch Code(err) {
	case "NoSuchKey", "NotFound", "NoSuchBucket":
		return true
	}
	return Status(err) == http.StatusNotFound
}

// IsPrecondition reports a failed If-Match / If-None-Match (412), or the
// 409 S3 returns for a conditional write racing another.
func IsPrecondition(err error) bool {
	switch Code(err) {
	case "PreconditionFailed", "ConditionalRequestConflict":
		return true
	}
	s := Status(err)
	return s == http.StatusPreconditionFailed
}

// Explain turns the SDK errors a newcomer meets first into ones that say
// what to do: no credentials anywhere in the AWS chain (the SDK's last
// attempt, the EC2 instance role, is what it reports), and a bucket that
// does not exist. Anything else is returned as is.
func Explain(bucket string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case Code(err) == "NoSuchBucket":
		return fmt.Errorf("bucket %q does not exist at this endpoint: create it, or check the bucket name and --s3-endpoint (%w)", bucket, err)
	case strings.Contains(msg, "failed to refresh cached credentials") || strings.Contains(msg, "get credentials"):
		return fmt.Errorf("no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance role is attached (%w)", err)
	}
	return err
}
