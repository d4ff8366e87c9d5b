// Package s3store is the store under an S3 prefix (s3://bucket/prefix):
// the index and the lease are published with If-Match and If-None-Match,
// objects are uploaded in parallel, and an unchanged file's object is
// reused by a server-side copy. Probe checks that the server honours the
// conditional writes this depends on.
package s3store
