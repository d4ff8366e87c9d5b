package store

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
)

// Sentinel errors stores return, wrapped.
var (
	ErrNotExist     = errors.New("not found")
	ErrExist        = errors.New("already exists")
	ErrPrecondition = errors.New("precondition failed: the object changed since it was read")
	// ErrTooLarge: an object is over the bound its reader allows
	// (ReadAllLimited).
	ErrTooLarge = errors.New("too large")
)

// Store is one workspace's durable root: ROOT = base/seg(id). Keys are
// /-separated and relative to ROOT.
type Store interface {
	// String names the root, for messages.
	String() string
	// ReadIndex returns workspace.json and an opaque version token for
	// conditional publication, or ErrNotExist.
	ReadIndex(ctx context.Context) (data []byte, version string, err error)
	// PublishIndex replaces workspace.json only if its version is still prev
	// ("" meaning there is none); otherwise it returns ErrPrecondition.
	PublishIndex(ctx context.Context, data []byte, prev string) (version string, err error)
	// Open reads one object, or returns ErrNotExist.
	Open(ctx context.Context, key string) (io.ReadCloser, error)
	// ReadRange reads n bytes of the object key from off (a ranged GET),
	// or with off < 0 its last n bytes (all of it if it is shorter). It
	// returns the object's whole size with them. A range past the
	// object's end is cut at it.
	ReadRange(ctx context.Context, key string, off, n int64) (r io.ReadCloser, size int64, err error)
	// Stage starts writing the artifact at key ("revisions/<id>/" or
	// "revisions/<id>.tar.gz"). A folder's manifest.json, which makes it
	// a revision, and an archive's one object are readable only once
	// Commit returns; a folder's other objects may be readable before
	// (S3 writes them in place), and Artifacts may list a folder that is
	// not committed, as a leftover to remove.
	Stage(ctx context.Context, key string) (Stager, error)
	// Remove deletes the artifact at key, tolerating its absence.
	Remove(ctx context.Context, key string) error
	// Artifacts lists the artifact keys under revisions/, and any staging
	// leftovers, so that orphans can be found and removed.
	Artifacts(ctx context.Context) ([]string, error)
	// Lock takes the single-writer lease for the workspace, or fails with
	// AML_WORKSPACE_CONFLICT. onLost, if not nil, is called once if the
	// heartbeat finds the lease gone. A lease that is not stale yet is
	// still taken over if dead, not nil, reports its holder (as a Lease's
	// Holder names it) dead.
	Lock(ctx context.Context, onLost func(error), dead func(holder string) bool) (Lease, error)
	// Destroy removes the workspace root and everything under it.
	Destroy(ctx context.Context) error
	// Probe checks that the store is reachable and writable, and that it
	// honours conditional writes.
	Probe(ctx context.Context) Probe
}

// Stager writes one artifact.
type Stager interface {
	// Put writes name (relative to the artifact; "" for a single-object
	// artifact) with exactly size bytes from r, or all of r if size < 0.
	Put(ctx context.Context, name string, r io.Reader, size int64) error
	// PutFile writes name with the bytes of the working-tree file f as
	// they were at one instant (see ReadStable), and closes f. Once the
	// object has landed it calls done with the stamp of those bytes,
	// whose size is their length. If f changed during every reading, it
	// leaves nothing at name and calls done with an error wrapping
	// ErrUnsettled: the caller decides what the artifact holds instead.
	// It may work in the background: any other error may surface only at
	// Flush or Commit.
	PutFile(ctx context.Context, name string, f *os.File, done func(Stamp, error)) error
	// Flush waits until everything put so far has landed.
	Flush(ctx context.Context) error
	// Reuse makes name a copy of the existing object fromKey without moving
	// the bytes through amlfs (a hard link, or a server-side copy). local
	// is the working-tree file holding the same bytes, which Reuse closes:
	// if fromKey is gone (another writer pruned its revision), the file is
	// written from local instead, as PutFile does; with local nil (a
	// placeholder, whose bytes are only in the store), that is a
	// BASE_REVISION_GONE error. done is called once
	// name has landed, with the stamp of the bytes written from local, or
	// nil for a copy; or, as PutFile's, with ErrUnsettled. It may work in
	// the background, as PutFile.
	Reuse(ctx context.Context, name, fromKey string, local *os.File, done func(*Stamp, error)) error
	// Compose writes a single-object artifact (an archive; name "") as
	// pieces, in order. Pieces of existing objects are copied without
	// passing through amlfs where the store can: ranged server-side
	// copies (UploadPartCopy) under S3's part rules (PlanParts), or
	// copy_file_range, which reflinks where the disk can. A source that
	// is gone gives an error wrapping ErrNotExist (see BaseGone).
	Compose(ctx context.Context, pieces []Piece) error
	// Commit makes the artifact visible at its key if nothing is there yet,
	// else returns ErrExist. Everything is durable when it returns.
	Commit(ctx context.Context) error
	// Abort discards whatever was written.
	Abort(ctx context.Context) error
	// OnWritten sets a callback run as each object lands, with its name
	// and size (0 for a reused one), for progress reports. Set it before
	// Put.
	OnWritten(func(name string, size int64))
}

// Lease is a held writer lock.
type Lease interface {
	// Lost reports a lease lost since acquisition (for example taken over
	// after a missed heartbeat), or nil.
	Lost() error
	// LostErr is the loss the heartbeat found, if any, without asking the
	// store (Heartbeat provides it).
	LostErr() error
	// Release gives the lease up; it reports a lost lease.
	Release(ctx context.Context) error
	// Holder names this holding of the lease: the token in lock.json, or
	// the identity of the lock directory. No later holding has the same
	// name.
	Holder() string
}

// A Family is a store that reaches the other workspaces under its base:
// a fork reads its source's revision, and copies from it, by foreign keys.
// A foreign key "../SEG/revisions/..." names an object of the workspace
// whose segment is SEG, and means the same in every store of the family.
type Family interface {
	Store
	// Sibling returns the store of workspace id under the same base.
	Sibling(id string) (Store, error)
	// Foreign returns key (one of this store's, or already foreign) as
	// a foreign key.
	Foreign(key string) string
}

// SplitForeign parses a foreign key into its segment and the key within
// that workspace's root. Only revision objects are reachable that way.
func SplitForeign(key string) (seg, rest string, ok bool) {
	tail, ok := strings.CutPrefix(key, "../")
	if !ok {
		return "", "", false
	}
	seg, rest, ok = strings.Cut(tail, "/")
	if !ok || seg == "" || seg == "." || seg == ".." || !strings.HasPrefix(rest, "revisions/") || format.ValidPath(strings.TrimSuffix(rest, "/")) != nil {
		return "", "", false
	}
	return seg, rest, true
}

// ForeignKey returns key of the workspace whose segment is seg as a ForeignKey
// key; a key that is ForeignKey already stays as it is.
func ForeignKey(seg, key string) string {
	if IsForeign(key) {
		return key
	}
	return "../" + seg + "/" + key
}

// IsForeign reports whether key names another workspace's object.
func IsForeign(key string) bool { return strings.HasPrefix(key, "../") }

// CheckKey refuses a key that is neither a clean path beneath the
// workspace's root nor a foreign key to another workspace's revisions:
// S3 keys are literal, but a gateway backed by a file system (versitygw's
// posix backend) resolves ".." in them.
func CheckKey(key string) error {
	if IsForeign(key) {
		if _, _, ok := SplitForeign(key); !ok {
			return amlerr.New(amlerr.InvalidStore, key, "not a key of another workspace's revisions")
		}
		return nil
	}
	if err := format.ValidPath(strings.TrimSuffix(key, "/")); err != nil {
		return amlerr.Wrap(amlerr.InvalidStore, key, err)
	}
	return nil
}
