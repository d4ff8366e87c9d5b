package s3client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// cutServer serves one object at /b/k, answering ranged and If-Match GETs
// as S3 does. cut decides, for the i-th request (from 0), how many of the
// response's n body bytes to send before the connection breaks; n or more
// sends them all. replace, if set, swaps the object before request i.
type cutServer struct {
	mu      sync.Mutex
	data    []byte
	etag    string
	reqs    int
	cut     func(i, n int) int
	replace func(i int) []byte
}

func (s *cutServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	i := s.reqs
	s.reqs++
	if s.replace != nil {
		if d := s.replace(i); d != nil {
			s.data, s.etag = d, fmt.Sprintf(`"v%d"`, i)
		}
	}
	data, etag := s.data, s.etag
	s.mu.Unlock()
	if im := r.Header.Get("If-Match"); im != "" && im != etag {
		w.WriteHeader(http.StatusPreconditionFailed)
		io.WriteString(w, `<Error><Code>PreconditionFailed</Code></Error>`)
		return
	}
	start, end := 0, len(data)-1
	status := http.StatusOK
	if rg := r.Header.Get("Range"); rg != "" {
		fmt.Sscanf(rg, "bytes=%d-%d", &start, &end)
		status = http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end, len(data)))
	}
	body := data[start : end+1]
	w.Header().Set("ETag", etag)
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(status)
	if n := s.cut(i, len(body)); n < len(body) {
		w.Write(body[:n])
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the connection breaks
	}
	w.Write(body)
}

func testClient(t *testing.T, h http.Handler) *s3.Client {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		UsePathStyle: true,
		Credentials:  aws.AnonymousCredentials{},
	})
}

// TestGetResumes: a body that breaks off is picked up where it stopped,
// for as long as each try brings bytes; tries that bring none give up
// after stuckResumes in a row; a changed object is an error, never a mix.
func TestGetResumes(t *testing.T) {
	obj := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	halved := func(i, n int) int { return (n + 1) / 2 }
	tests := []struct {
		name    string
		rng     string // the caller's Range, if any
		cut     func(i, n int) int
		replace func(i int) []byte
		want    []byte
		wantErr string
		reqs    int // requests made; 0: don't check
	}{
		{name: "whole", cut: func(i, n int) int { return n }, want: obj, reqs: 1},
		// Every response is cut in half: 16 breaks in a row, each with
		// progress, far more than stuckResumes.
		{name: "every response halved", cut: halved, want: obj, reqs: 17},
		{name: "halved, ranged", rng: "bytes=100-60099", cut: halved, want: obj[100:60100], reqs: 16},
		// Empty breaks between useful ones: stuck counts only in a row.
		{name: "stuck 5 then progress, twice", cut: func(i, n int) int {
			switch {
			case i == 0, i == 6:
				return n / 3
			case i < 12:
				return 0
			}
			return n
		}, want: obj, reqs: 13},
		{name: "never a byte", cut: func(i, n int) int { return 0 },
			wantErr: fmt.Sprintf("after %d resumed requests", stuckResumes), reqs: stuckResumes + 1},
		{name: "replaced while resuming", cut: func(i, n int) int {
			if i == 0 {
				return n / 2
			}
			return n
		}, replace: func(i int) []byte {
			if i == 1 {
				return bytes.Repeat([]byte("X"), len(obj))
			}
			return nil
		}, wantErr: "PreconditionFailed", reqs: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &cutServer{data: obj, etag: `"v"`, cut: tc.cut, replace: tc.replace}
			c := testClient(t, s)
			in := &s3.GetObjectInput{Bucket: aws.String("b"), Key: aws.String("k")}
			if tc.rng != "" {
				in.Range = aws.String(tc.rng)
			}
			out, err := Get(context.Background(), c, in)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(out.Body)
			out.Body.Close()
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one with %q", err, tc.wantErr)
				}
				if !bytes.Equal(got, obj[:len(got)]) {
					t.Fatalf("the %d bytes before the error are not the first version's", len(got))
				}
			case err != nil:
				t.Fatal(err)
			case !bytes.Equal(got, tc.want):
				t.Fatalf("got %d bytes, want %d, or other bytes", len(got), len(tc.want))
			}
			if s.reqs != tc.reqs && tc.reqs != 0 {
				t.Fatalf("%d requests, want %d", s.reqs, tc.reqs)
			}
		})
	}
}
