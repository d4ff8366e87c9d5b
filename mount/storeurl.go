package mount

import (
	"context"
	"net/url"
	"path/filepath"

	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/revision/store/dirstore"
	"github.com/amlfs/amlfs/revision/store/s3store"
	"github.com/amlfs/amlfs/s3client"
)

// StoreSpec is a parsed --store URL.
type StoreSpec struct {
	Kind   string // "file" or "s3"
	Dir    string // file: the store directory
	Bucket string // s3
	Prefix string // s3: the key prefix (AML's default aml/workspaces)
}

// ParseStore parses file:///dir or s3://bucket[/prefix].
func ParseStore(storeURL string) (StoreSpec, error) {
	u, err := url.Parse(storeURL)
	if err != nil {
		return StoreSpec{}, invalid(storeURL, "bad store URL: %v", err)
	}
	switch u.Scheme {
	case "file":
		dir, err := fileURLDir(u, storeURL, "store")
		if err != nil {
			return StoreSpec{}, err
		}
		return StoreSpec{Kind: "file", Dir: dir}, nil
	case "s3":
		su, err := s3client.ParseURL(storeURL, s3store.DefaultPrefix)
		if err != nil {
			return StoreSpec{}, invalid(storeURL, "%v", err)
		}
		return StoreSpec{Kind: "s3", Bucket: su.Bucket, Prefix: su.Prefix}, nil
	}
	return StoreSpec{}, invalid(storeURL, "unsupported store scheme %q (use file:///dir or s3://bucket/prefix)", u.Scheme)
}

// fileURLDir returns the local directory of a file:// URL: file:///abs/dir
// or file://localhost/abs/dir, cleaned. what names the URL's role in
// errors ("store", "mount").
func fileURLDir(u *url.URL, subject, what string) (string, error) {
	if u.Host != "" && u.Host != "localhost" {
		return "", invalid(subject, "file:// %s must be local: file:///absolute/dir", what)
	}
	if u.Path == "" || !filepath.IsAbs(u.Path) {
		return "", invalid(subject, "file:// %s needs an absolute path: file:///absolute/dir", what)
	}
	return filepath.Clean(u.Path), nil
}

// S3Options are the S3 settings from the command line.
type S3Options = s3client.Options

// OpenStore returns the store for workspace id.
func OpenStore(ctx context.Context, storeURL string, s3o S3Options, id string) (store.Store, error) {
	spec, err := ParseStore(storeURL)
	if err != nil {
		return nil, err
	}
	if spec.Kind == "s3" {
		client, err := s3client.NewClient(ctx, s3o)
		if err != nil {
			return nil, err
		}
		st, err := s3store.New(client, spec.Bucket, spec.Prefix, id)
		if err != nil {
			return nil, invalid(id, "--id: %v", err)
		}
		return st, nil
	}
	st, err := dirstore.New(spec.Dir, id)
	if err != nil {
		return nil, invalid(id, "--id: %v", err)
	}
	return st, nil
}
