package integration

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/revision/store/s3store"
	"github.com/amlfs/amlfs/revision/store/storetest"
)

// TestS3StoreConformance runs the store conformance suite, which the
// directory and memory stores pass in the unit lane, on the S3 store
// against versitygw. Faults are the server killed and started again.
func TestS3StoreConformance(t *testing.T) {
	srv := startS3(t, false)
	var seq int
	storetest.Run(t, func(t *testing.T) storetest.Base {
		seq++
		prefix := fmt.Sprintf("conformance%d/aml/workspaces", seq)
		e := newS3EnvAt(t, srv, prefix)
		client := e.client()
		return storetest.Base{
			Open: func(id string) (store.Family, error) {
				s, err := s3store.New(client, s3Bucket, prefix, id)
				if err != nil {
					return nil, err
				}
				return s, nil
			},
			Tune: func(s store.Store, refresh, stale time.Duration) {
				x := s.(*s3store.Store)
				x.LockRefresh, x.LockStale = refresh, stale
			},
			Raw: func(id, key string, data []byte) {
				seg, err := format.Seg(id)
				if err != nil {
					t.Fatal(err)
				}
				k := aws.String(prefix + "/" + seg + "/" + key)
				if data == nil {
					_, err = client.DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: aws.String(s3Bucket), Key: k})
				} else {
					_, err = client.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(s3Bucket), Key: k, Body: bytes.NewReader(data)})
				}
				if err != nil {
					t.Fatal(err)
				}
			},
			Break: func(err error) {
				if err != nil {
					srv.stop()
					return
				}
				srv.start(t)
			},
		}
	})
}
