// Package dirstore is the store in a local directory (file:///dir): the
// index is replaced by rename under flock after a compare of its bytes,
// artifacts are staged in a hidden directory and renamed into place, an
// unchanged file's object is reused by a hard link, and the lease is a
// lock file whose mtime the heartbeat moves.
package dirstore
