package revision

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
)

// Archive revisions are written composable (format.ComposeWriter): gzip
// members of whole tar entries, files first and directories after, and
// amlfs's index at the end. A save whose base is such an archive composes
// the next one (composeArchive): the runs of members whose files are all
// unchanged are copied by range on the store's side, and only the rest is
// written. A file of such an archive is reachable alone, by its member
// (memberKey): a lazy restore fetches each file with one ranged read.

// memberKey names the bytes of the file e of the archive at key: where a
// placeholder's bytes are, as a folder's object key names them.
func memberKey(archive string, e format.ArchiveEntry) string {
	b := make([]byte, 0, len(archive)+len(e.Path)+48)
	b = append(b, archive...)
	b = append(b, '#')
	for _, n := range [...]int64{e.Member, e.MemberLen, e.Data, e.Size} {
		b = strconv.AppendInt(b, n, 10)
		b = append(b, ',')
	}
	return string(append(b, e.Path...))
}

// parseMemberKey reads a memberKey back; ok is false for any other key.
func parseMemberKey(key string) (archive string, e format.ArchiveEntry, ok bool) {
	archive, rest, ok := strings.Cut(key, "#")
	if !ok || !isArchiveKey(archive) {
		return "", e, false
	}
	f := strings.SplitN(rest, ",", 5)
	if len(f) != 5 {
		return "", e, false
	}
	var n [4]int64
	for i := range n {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || v < 0 {
			return "", e, false
		}
		n[i] = v
	}
	e = format.ArchiveEntry{TreeEntry: format.TreeEntry{Path: f[4], Type: format.TypeFile, Size: n[3]}, Member: n[0], MemberLen: n[1], Data: n[2]}
	if e.MemberLen == 0 || format.ValidPath(e.Path) != nil || strings.ContainsRune(e.Path, 0) {
		return "", e, false
	}
	return archive, e, true
}

// artifactOf is the artifact a file's key lies in: a folder revision's
// "revisions/<id>/", or an archive.
func artifactOf(key string) string {
	if archive, _, ok := parseMemberKey(key); ok {
		return archive
	}
	if archive, _, ok := parseRefKey(key); ok {
		return archive
	}
	if rev, _, ok := strings.Cut(key, "files/"); ok {
		return rev
	}
	return key
}

// openFileBytes reads the bytes of one file: a folder revision's object,
// or an archive's member, with one ranged read, checked against the
// index.
func (w *Workspace) openFileBytes(ctx context.Context, key string) (io.ReadCloser, error) {
	if archive, idx, ok := parseRefKey(key); ok {
		var err error
		if key, err = w.resolveRef(ctx, archive, idx); err != nil {
			return nil, err
		}
	}
	archive, e, ok := parseMemberKey(key)
	if !ok {
		return w.store.Open(ctx, key)
	}
	if e.MemberLen <= maxCachedMember {
		// A member of small files: its neighbours are likely read next
		// (a checkout, a build, a prefetch), so it is kept, decompressed,
		// a while. A member that inflates past the bound is read as a
		// stream.
		data, err := w.members.get(ctx, w.store, archive, e.Member, e.MemberLen)
		if err == nil {
			r, err := format.EntryInTar(bytes.NewReader(data), e)
			if err != nil {
				return nil, err
			}
			return io.NopCloser(r), nil
		}
		if !errors.Is(err, errMemberLarge) {
			return nil, err
		}
	}
	rc, _, err := w.store.ReadRange(ctx, archive, e.Member, e.MemberLen)
	if err != nil {
		return nil, err
	}
	r, err := format.EntryIn(rc, e)
	if err != nil {
		rc.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{r, rc}, nil
}

// Archive members of at most maxCachedMember bytes, inflating to at most
// maxInflatedMember, are kept decompressed, up to cachedMembers of them,
// while the files they hold are fetched.
const (
	maxCachedMember   = 1 << 20
	maxInflatedMember = 2 << 20
	cachedMembers     = 32
)

// errMemberLarge: a member inflates past maxInflatedMember.
var errMemberLarge = errors.New("the member inflates past the cache's bound")

// memberCache keeps recently read archive members, decompressed, and
// reads each once however many fetches want it at the same time.
type memberCache struct {
	lru *lru.Cache[string, []byte]
	sf  singleflight.Group
}

func newMemberCache() *memberCache {
	c, _ := lru.New[string, []byte](cachedMembers)
	return &memberCache{lru: c}
}

func (c *memberCache) get(ctx context.Context, s store.Store, archive string, off, n int64) ([]byte, error) {
	k := archive + "#" + strconv.FormatInt(off, 10) + "+" + strconv.FormatInt(n, 10)
	if data, ok := c.lru.Get(k); ok {
		return data, nil
	}
	v, err, _ := c.sf.Do(k, func() (any, error) {
		data, err := readExactly(ctx, s, archive, off, n)
		if err != nil {
			return nil, err
		}
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, amlerr.New(amlerr.InvalidStore, archive, "the member at %d is not gzip: %v", off, err)
		}
		zr.Multistream(false)
		data, err = io.ReadAll(io.LimitReader(zr, maxInflatedMember+1))
		if err != nil {
			return nil, amlerr.New(amlerr.InvalidStore, archive, "the member at %d: %v", off, err)
		}
		if len(data) > maxInflatedMember {
			return nil, errMemberLarge
		}
		c.lru.Add(k, data)
		return data, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]byte), nil
}

// indexTail is how much of an archive's end the first read of its index
// takes: most indexes are in it, so one request finds them.
const indexTail = 256 << 10

// archiveIndex reads the index at the end of the archive at key, with one
// or two ranged reads. It returns nil for an archive without one (AML
// wrote it, or an older amlfs), and an error for one whose index lies.
func (w *Workspace) archiveIndex(ctx context.Context, key string) (*format.ArchiveIndex, error) {
	rc, size, err := w.store.ReadRange(ctx, key, -1, indexTail)
	if errors.Is(err, store.ErrNotExist) {
		return nil, amlerr.New(amlerr.InvalidStore, key, "the index refers to it, but it is missing from %s", w.store)
	}
	if err != nil {
		return nil, err
	}
	tail, err := store.ReadAllLimited(rc, indexTail, key)
	rc.Close()
	if err != nil {
		return nil, err
	}
	off, n, err := format.IndexRange(tail, size)
	if err != nil {
		return nil, nil // not composable: read as a stream
	}
	var members []byte
	if at := size - int64(len(tail)); off >= at {
		members = tail[off-at : off-at+n]
	} else {
		var err error
		if members, err = readExactly(ctx, w.store, key, off, n); err != nil {
			return nil, err
		}
	}
	x, err := format.ParseIndexMember(members, size, w.opts.Limits)
	if err != nil {
		return nil, amlerr.Wrap(amlerr.InvalidStore, key, err)
	}
	return x, nil
}

// readExactly reads the n bytes at off of the object key with one ranged
// read; fewer is INVALID_STORE.
func readExactly(ctx context.Context, s store.Store, key string, off, n int64) ([]byte, error) {
	rc, _, err := s.ReadRange(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := store.ReadAllLimited(rc, n, key)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != n {
		return nil, amlerr.New(amlerr.InvalidStore, key, "%d bytes at %d: the archive is shorter", n, off)
	}
	return data, nil
}

// pieceWriter is the Copier a composed archive is written to: written
// bytes go to a spool file, copied ranges are noted, and both become the
// pieces Stager.Compose takes.
type pieceWriter struct {
	f      *os.File
	at     int64
	pieces []store.Piece
}

func newPieceWriter() (*pieceWriter, error) {
	f, err := os.CreateTemp("", "amlfs-compose-*")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name())
	return &pieceWriter{f: f}, nil
}

func (p *pieceWriter) Write(b []byte) (int, error) {
	n, err := p.f.WriteAt(b, p.at)
	if n > 0 {
		if k := len(p.pieces); k > 0 && p.pieces[k-1].Key == "" && p.pieces[k-1].Off+p.pieces[k-1].N == p.at {
			p.pieces[k-1].N += int64(n)
		} else {
			p.pieces = append(p.pieces, store.Piece{Data: p.f, Off: p.at, N: int64(n)})
		}
		p.at += int64(n)
	}
	return n, err
}

func (p *pieceWriter) CopyRange(key string, off, n int64) error {
	if n > 0 {
		p.pieces = append(p.pieces, store.Piece{Key: key, Off: off, N: n})
	}
	return nil
}

func (p *pieceWriter) Close() error { return p.f.Close() }

// spool holds one file's bytes between their stable read and the tar
// stream: an unlinked temporary file, reused for every file.
type spool struct {
	f  *os.File
	st store.Stamp // of the bytes last read
}

func (s *spool) reset() (*os.File, error) {
	if s.f == nil {
		f, err := os.CreateTemp("", "amlfs-archive-*")
		if err != nil {
			return nil, err
		}
		os.Remove(f.Name())
		s.f = f
	}
	if err := s.f.Truncate(0); err != nil {
		return nil, err
	}
	_, err := s.f.Seek(0, io.SeekStart)
	return s.f, err
}

func (s *spool) close() {
	if s.f != nil {
		s.f.Close()
	}
}

// read copies the working-tree file rel of t into the spool, as it was at
// one instant; gone reports a file no longer there.
func (s *spool) read(t *tree, rel string) (*os.File, bool, error) {
	f, gone, err := openSaved(t, rel)
	if err != nil || gone {
		return nil, gone, err
	}
	defer f.Close()
	s.st, err = store.ReadStable(f, func(size int64, attempt int) error {
		out, err := s.reset()
		if err != nil {
			return err
		}
		_, err = store.CopyExactly(out, f, size)
		return err
	})
	return s.f, false, err
}

// readArchive reads an archive revision (format.ReadArchive). With dir
// set it also extracts into dir, which must exist and be empty, the
// entries take selects (all when take is nil).
func readArchive(r io.Reader, dir string, subject string, lim format.Limits, take func(string) bool) ([]format.TreeEntry, error) {
	if dir == "" {
		return format.ReadArchive(r, subject, lim, nil)
	}
	m := materializer{root: dir}
	entries, err := format.ReadArchive(r, subject, lim, func(e format.TreeEntry, content io.Reader) error {
		if take != nil && !take(e.Path) {
			return nil
		}
		return m.add(e, content)
	})
	if err != nil {
		return nil, err
	}
	return entries, m.finish()
}
