package format

import (
	"archive/tar"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/amlfs/amlfs/amlerr"
)

// A composable archive is AML's archive format (a gzip-compressed tar
// rooted at ".") written as a sequence of gzip members: each holds whole
// tar entries (one large file, or a run of small ones), so that a member
// can be copied from one archive into the next by its byte range, without
// being decompressed. After the members come the tar's end-of-archive, in
// a member of its own, and empty members whose headers' extra fields
// hold amlfs's index (ArchiveIndex): where each entry's member lies, and
// what a tar entry cannot say for AML (symlinks, which AML's reader
// refuses, nanosecond mtimes and the saved stat data). The index is
// deflated and cut into extra fields of up to 64 KiB (a header comment
// would be one string, but Go's gzip reader refuses one over 511 bytes);
// the last member, of a fixed size, says where those members start. Any
// gzip and tar reader, AML's node-tar included, reads the whole as one
// archive and skips the extra fields.

// Members are compressed at gzip's fastest level: a checkpoint's time
// matters more than a few percent of its size.

// MemberTarget is the uncompressed size a member of small files grows to
// before the next file starts a new one; a file at least this large has a
// member of its own.
const MemberTarget = 256 << 10

// The index's extra subfields: "ai" holds a piece of the deflated index,
// and "ae", in the last member, the offset and length of the members
// holding the pieces (8 bytes each, little-endian).
const (
	indexPiece = "ai"
	indexEnd   = "ae"
	// pieceMax is the most index bytes one extra field holds (XLEN is 16
	// bits, and a subfield takes 4 of them).
	pieceMax = 65535 - 4
	// gzipTail is what ends an empty member as Go's gzip writer makes it:
	// an empty final stored block, CRC-32 and size 0.
	gzipTail = "\x01\x00\x00\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00"
	// TailBytes is the size of the last member, which finds the index:
	// the gzip header (10), XLEN (2), the subfield (4 + 16), the tail.
	TailBytes = 10 + 2 + 4 + 16 + len(gzipTail)
	// MaxArchiveIndexBytes bounds the deflated index.
	MaxArchiveIndexBytes = 64 << 20
)

// ArchiveIndex is what a composable archive says of itself.
type ArchiveIndex struct {
	Version int `json:"version"`
	// Entries are the tar's entries in archive order, with where each
	// lies.
	Entries []ArchiveEntry `json:"entries"`
	// Symlinks are kept here only: AML's reader refuses symlink entries.
	Symlinks []TreeEntry `json:"symlinks,omitempty"`
	Fork     *ForkOrigin `json:"fork,omitempty"`
	// End is where the member holding the tar's end-of-archive starts,
	// and EndLen its length.
	End    int64 `json:"end"`
	EndLen int64 `json:"endLen"`
}

// ArchiveEntry is a directory or file of a composable archive.
type ArchiveEntry struct {
	TreeEntry
	// Member and MemberLen are the byte range of the gzip member holding
	// the entry; Data is where the entry's bytes start in that member's
	// decompressed tar stream (after its header).
	Member    int64 `json:"member"`
	MemberLen int64 `json:"memberLen"`
	Data      int64 `json:"data"`
}

// Tree is the archive's tree, symlinks included, in manifest order.
func (x *ArchiveIndex) Tree() []TreeEntry {
	out := make([]TreeEntry, 0, len(x.Entries)+len(x.Symlinks))
	for _, e := range x.Entries {
		out = append(out, e.TreeEntry)
	}
	out = append(out, x.Symlinks...)
	SortEntries(out)
	return out
}

// ComposeWriter writes a composable archive. A member holds files or
// directories, never both: a save writes the files first and the
// directories (whose mtimes change with every file added or removed in
// them) after, so that the members of unchanged files stay as they were.
type ComposeWriter struct {
	out     io.Writer
	w       *countingWriter
	lim     Limits
	tw      *tar.Writer
	sink    countingWriter // the open member's uncompressed tar stream
	gz      *gzip.Writer   // the open member, if any
	kind    string         // the open member's entries' type
	open    []int          // indexes in idx.Entries of the open member's entries
	start   int64          // the open member's offset
	rooted  bool           // the root entry "./" is written
	idx     ArchiveIndex
	now     time.Time
	entries int
	bytes   int64
}

// A Copier is where a composed archive goes (Stager.Compose): it takes
// written bytes, and ranges of an existing archive that it appends
// without their passing through it.
type Copier interface {
	io.Writer
	CopyRange(key string, off, n int64) error
}

// NewComposeWriter starts a composable archive on w. Members of an
// existing archive are reused (Reuse) only when w is a Copier.
func NewComposeWriter(w io.Writer, lim Limits) (*ComposeWriter, error) {
	lim = lim.OrDefault()
	c := &ComposeWriter{out: w, w: &countingWriter{w: w, limit: lim.ArchiveBytes}, lim: lim, now: time.Now(), idx: ArchiveIndex{Version: 1}}
	c.tw = tar.NewWriter(&c.sink)
	return c, nil
}

// A Member is the byte range of one gzip member of an archive and the
// index's entries it holds.
type Member struct {
	Off, Len int64
	Entries  []ArchiveEntry
	// At is where Entries start in the index's entries (Members).
	At int
}

// Members groups the index's entries by member, in archive order. Each
// member's Entries are the index's own, not a copy (with no room to grow
// into the next member's).
func (x *ArchiveIndex) Members() []Member {
	var out []Member
	start := 0
	for i := range x.Entries {
		if i+1 < len(x.Entries) && x.Entries[i+1].Member == x.Entries[i].Member {
			continue
		}
		e := &x.Entries[start]
		out = append(out, Member{Off: e.Member, Len: e.MemberLen, Entries: x.Entries[start : i+1 : i+1], At: start})
		start = i + 1
	}
	return out
}

// Reuse appends the members [off, off+n) of the existing archive key,
// which hold exactly entries (its index's, in order), without reading
// them: the Copier copies the range. Each entry keeps its place in its
// member; its member's offset becomes the new one.
func (c *ComposeWriter) Reuse(key string, off, n int64, entries []ArchiveEntry) error {
	cp, ok := c.out.(Copier)
	if !ok {
		return errors.New("this archive cannot reuse members: its writer copies no ranges")
	}
	if err := c.end(); err != nil {
		return err
	}
	for _, e := range entries {
		if e.Member < off || e.Member+e.MemberLen > off+n {
			return fmt.Errorf("entry %q lies outside the reused range", e.Path)
		}
		if err := c.count(e.TreeEntry); err != nil {
			return err
		}
	}
	if c.w.n+n > c.w.limit {
		return archiveTooLarge(c.w.limit)
	}
	at := c.w.n
	if err := cp.CopyRange(key, off, n); err != nil {
		return err
	}
	c.w.n += n
	for _, e := range entries {
		e.Member = at + e.Member - off
		c.idx.Entries = append(c.idx.Entries, e)
	}
	return nil
}

// root writes the archive's root entry "./" into the open member.
func (c *ComposeWriter) root() error {
	c.rooted = true
	return c.tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: c.now, Format: tar.FormatPAX})
}

// begin opens a member.
func (c *ComposeWriter) begin() error {
	c.start = c.w.n
	gz, err := gzip.NewWriterLevel(c.w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	c.gz, c.sink = gz, countingWriter{w: gz, limit: math.MaxInt64}
	return nil
}

// end closes the open member and records its range in its entries.
func (c *ComposeWriter) end() error {
	if c.gz == nil {
		return nil
	}
	if err := c.tw.Flush(); err != nil {
		return err
	}
	if err := c.gz.Close(); err != nil {
		return err
	}
	for _, i := range c.open {
		c.idx.Entries[i].Member, c.idx.Entries[i].MemberLen = c.start, c.w.n-c.start
	}
	c.gz, c.open = nil, nil
	return nil
}

func (c *ComposeWriter) header(e TreeEntry) *tar.Header {
	mtime := c.now
	if e.Mtime != 0 {
		mtime = e.Mtime.Time()
	}
	return &tar.Header{Name: "./" + e.Path, Mode: int64(e.Mode), ModTime: mtime, Format: tar.FormatPAX}
}

func (c *ComposeWriter) count(e TreeEntry) error {
	c.entries++
	c.bytes += e.Size
	return c.lim.Check("archive", c.entries, c.bytes)
}

// add writes one tar entry into a member, starting a new one first if the
// open one is full or the entry is large.
func (c *ComposeWriter) add(e TreeEntry, hdr *tar.Header, r io.Reader) error {
	if err := c.count(e); err != nil {
		return err
	}
	if c.gz != nil && (c.sink.n >= MemberTarget || e.Size >= MemberTarget && len(c.open) > 0 || c.kind != e.Type) {
		if err := c.end(); err != nil {
			return err
		}
	}
	if c.gz == nil {
		if err := c.begin(); err != nil {
			return err
		}
		c.kind = e.Type
		if e.Type == TypeDir && !c.rooted {
			if err := c.root(); err != nil {
				return err
			}
		}
	}
	if err := c.tw.Flush(); err != nil { // the previous entry's padding
		return err
	}
	if err := c.tw.WriteHeader(hdr); err != nil {
		return err
	}
	c.idx.Entries = append(c.idx.Entries, ArchiveEntry{TreeEntry: e, Data: c.sink.n})
	c.open = append(c.open, len(c.idx.Entries)-1)
	if r != nil {
		n, err := io.Copy(c.tw, io.LimitReader(r, e.Size))
		if err == nil && n != e.Size {
			err = fmt.Errorf("%s: %d of %d bytes", e.Path, n, e.Size)
		}
		if err != nil {
			return err
		}
	}
	if e.Size >= MemberTarget {
		return c.end()
	}
	return nil
}

// Dir adds the directory e.
func (c *ComposeWriter) Dir(e TreeEntry) error {
	hdr := c.header(e)
	hdr.Name += "/"
	hdr.Typeflag = tar.TypeDir
	e.Type, e.Size = TypeDir, 0
	return c.add(e, hdr, nil)
}

// File adds the regular file e, whose e.Size bytes r gives.
func (c *ComposeWriter) File(e TreeEntry, r io.Reader) error {
	hdr := c.header(e)
	hdr.Typeflag = tar.TypeReg
	hdr.Size = e.Size
	e.Type = TypeFile
	return c.add(e, hdr, r)
}

// Symlink adds the symlink e, to the index only.
func (c *ComposeWriter) Symlink(e TreeEntry) error {
	if err := c.count(e); err != nil {
		return err
	}
	e.Type = TypeSymlink
	c.idx.Symlinks = append(c.idx.Symlinks, e)
	return nil
}

// SetFork records the fork a first revision was made from.
func (c *ComposeWriter) SetFork(f *ForkOrigin) { c.idx.Fork = f }

// Close ends the archive: the tar's end-of-archive in a member of its
// own, then the index member. It returns the archive's size and index.
func (c *ComposeWriter) Close() (int64, *ArchiveIndex, error) {
	if err := c.end(); err != nil {
		return c.w.n, nil, err
	}
	if err := c.begin(); err != nil {
		return c.w.n, nil, err
	}
	if !c.rooted {
		// No directory but the root: it goes with the end-of-archive.
		if err := c.root(); err != nil {
			return c.w.n, nil, err
		}
	}
	c.idx.End = c.start
	if err := c.tw.Close(); err != nil {
		return c.w.n, nil, err
	}
	if err := c.gz.Close(); err != nil {
		return c.w.n, nil, err
	}
	c.idx.EndLen = c.w.n - c.start
	c.gz = nil
	if err := WriteIndexMember(c.w, &c.idx, c.w.n); err != nil {
		return c.w.n, nil, err
	}
	return c.w.n, &c.idx, nil
}

// WriteIndexMember writes the index x as the archive's last members, the
// first of which starts at offset at.
func WriteIndexMember(w io.Writer, x *ArchiveIndex, at int64) error {
	data, err := x.appendJSON(nil)
	if err != nil {
		return err
	}
	var z bytes.Buffer
	fw, _ := flate.NewWriter(&z, flate.BestSpeed) // as the members: written at every save
	fw.Write(data)
	if err := fw.Close(); err != nil {
		return err
	}
	if z.Len() > MaxArchiveIndexBytes {
		return amlerr.New(amlerr.LimitExceeded, "archive index", "the index is %d bytes deflated, over %d", z.Len(), MaxArchiveIndexBytes)
	}
	cw := &countingWriter{w: w, limit: math.MaxInt64}
	for rest := z.Bytes(); len(rest) > 0; {
		n := min(len(rest), pieceMax)
		if err := emptyMember(cw, indexPiece, rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	var loc [16]byte
	binary.LittleEndian.PutUint64(loc[:8], uint64(at))
	binary.LittleEndian.PutUint64(loc[8:], uint64(cw.n))
	return emptyMember(w, indexEnd, loc[:])
}

// emptyMember writes a gzip member with no data whose extra field is one
// subfield id holding data.
func emptyMember(w io.Writer, id string, data []byte) error {
	gz := gzip.NewWriter(w) // with no input: gzipTail
	extra := make([]byte, 4, 4+len(data))
	copy(extra, id)
	binary.LittleEndian.PutUint16(extra[2:], uint16(len(data)))
	gz.Extra = append(extra, data...)
	return gz.Close()
}

// subfield returns the data of subfield id in a gzip extra field.
func subfield(extra []byte, id string) ([]byte, bool) {
	for len(extra) >= 4 {
		n := int(binary.LittleEndian.Uint16(extra[2:]))
		if 4+n > len(extra) {
			return nil, false
		}
		if string(extra[:2]) == id {
			return extra[4 : 4+n], true
		}
		extra = extra[4+n:]
	}
	return nil, false
}

// IndexRange finds the index's members from tail, the archive's last
// TailBytes (or more) bytes, given the archive's size: it returns their
// byte range.
func IndexRange(tail []byte, size int64) (off, n int64, err error) {
	bad := func(why string) error {
		return amlerr.New(amlerr.InvalidStore, "archive", "no amlfs index at its end: %s", why)
	}
	if len(tail) < TailBytes || int64(len(tail)) > size {
		return 0, 0, bad("too short")
	}
	last := tail[len(tail)-TailBytes:]
	zr, err := gzip.NewReader(bytes.NewReader(last))
	if err != nil {
		return 0, 0, bad("the last member is not gzip")
	}
	zr.Multistream(false)
	if k, err := io.Copy(io.Discard, zr); err != nil || k != 0 {
		return 0, 0, bad("the last member is not empty")
	}
	loc, ok := subfield(zr.Extra, indexEnd)
	if !ok || len(loc) != 16 {
		return 0, 0, bad("no index location")
	}
	off, n = int64(binary.LittleEndian.Uint64(loc[:8])), int64(binary.LittleEndian.Uint64(loc[8:]))
	if off < 0 || n <= 0 || n > MaxArchiveIndexBytes*2 || off+n != size-int64(TailBytes) {
		return 0, 0, bad("an index range that does not end at the last member")
	}
	return off, n, nil
}

// ParseIndexMember reads the index from its members' bytes (IndexRange),
// and checks it against the archive's size and the limits.
func ParseIndexMember(members []byte, size int64, lim Limits) (*ArchiveIndex, error) {
	lim = lim.OrDefault()
	bad := func(format string, args ...any) error {
		return amlerr.New(amlerr.InvalidStore, "archive index", format, args...)
	}
	var z []byte
	br := bytes.NewReader(members)
	for br.Len() > 0 {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, bad("an index member is not gzip: %v", err)
		}
		zr.Multistream(false)
		if n, err := io.Copy(io.Discard, zr); err != nil || n != 0 {
			return nil, bad("an index member is not empty")
		}
		piece, ok := subfield(zr.Extra, indexPiece)
		if !ok {
			return nil, bad("an index member holds no piece of it")
		}
		if z = append(z, piece...); len(z) > MaxArchiveIndexBytes {
			return nil, bad("the index is over %d bytes", MaxArchiveIndexBytes)
		}
	}
	// An entry takes well under 1 KiB of JSON: bound the inflated index
	// by the entry limit.
	max := int64(lim.Entries+1)*1024 + 1<<20
	data, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(z)), max+1))
	if err != nil {
		return nil, bad("the index does not inflate: %v", err)
	}
	if int64(len(data)) > max {
		return nil, amlerr.New(amlerr.LimitExceeded, "archive index", "the index inflates past %d bytes", max)
	}
	var x ArchiveIndex
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&x); err != nil {
		return nil, bad("the index is not valid JSON: %v", err)
	}
	if x.Version != 1 {
		return nil, bad("index version %d", x.Version)
	}
	if err := x.check(size-int64(len(members))-int64(TailBytes), lim); err != nil {
		return nil, err
	}
	return &x, nil
}

// check validates the index of an archive whose index member starts at
// indexAt: every range lies before the end-of-archive member, in order
// and without overlap; the entries are a valid tree within the limits.
func (x *ArchiveIndex) check(indexAt int64, lim Limits) error {
	bad := func(format string, args ...any) error {
		return amlerr.New(amlerr.InvalidStore, "archive index", format, args...)
	}
	if x.End < 0 || x.EndLen <= 0 || x.End+x.EndLen != indexAt {
		return bad("the end-of-archive member [%d, +%d) does not end where the index starts (%d)", x.End, x.EndLen, indexAt)
	}
	var next int64 // where the next member may start
	for i, e := range x.Entries {
		switch {
		case e.Type != TypeFile && e.Type != TypeDir:
			return bad("entry %q has type %q", e.Path, e.Type)
		case e.Size < 0 || e.Type == TypeDir && e.Size != 0:
			return bad("entry %q has size %d", e.Path, e.Size)
		case e.Member < 0 || e.MemberLen <= 0 || e.Member+e.MemberLen > x.End || e.Data < 0:
			return bad("entry %q lies outside the archive's members", e.Path)
		}
		if i > 0 && e.Member == x.Entries[i-1].Member {
			if e.MemberLen != x.Entries[i-1].MemberLen || e.Data <= x.Entries[i-1].Data {
				return bad("entry %q disagrees with the one before it on its member", e.Path)
			}
			continue
		}
		if e.Member < next {
			return bad("entry %q's member overlaps the one before it", e.Path)
		}
		next = e.Member + e.MemberLen
	}
	for _, s := range x.Symlinks {
		if s.Type != TypeSymlink || s.Target == "" || len(s.Target) > MaxSymlinkTarget {
			return bad("symlink %q is not one", s.Path)
		}
	}
	return ValidateEntries("archive index", x.Tree(), lim)
}

// OpenEntry reads the bytes of the file e of an archive from ra: it
// decompresses e's member from its start and checks, at the offset the
// index gives, the tar header for e's path and size, so that an index
// that lies gives an error, never another file's bytes.
func OpenEntry(ra io.ReaderAt, e ArchiveEntry) (io.Reader, error) {
	return EntryIn(io.NewSectionReader(ra, e.Member, e.MemberLen), e)
}

// EntryIn is OpenEntry from the bytes of e's member alone.
func EntryIn(member io.Reader, e ArchiveEntry) (io.Reader, error) {
	return entry(member, e, MemberEntries)
}

// EntryInTar is OpenEntry from e's member decompressed.
func EntryInTar(stream io.Reader, e ArchiveEntry) (io.Reader, error) {
	return entry(stream, e, TarEntries)
}

func entry(r io.Reader, e ArchiveEntry, read func(io.Reader, []ArchiveEntry, func(ArchiveEntry, io.Reader) error) error) (io.Reader, error) {
	if e.Type != TypeFile {
		return nil, amlerr.New(amlerr.InvalidStore, e.Path, "archive member: not a file")
	}
	var out io.Reader
	err := read(r, []ArchiveEntry{e}, func(_ ArchiveEntry, r io.Reader) error {
		out = r
		return errStop
	})
	if err != nil && err != errStop {
		return nil, err
	}
	return out, nil
}

var errStop = errors.New("stop")

// MemberEntries reads one member's bytes from member and calls each, in
// order, for each of es (entries of that member, in the index's order)
// with the entry's content (nil for a directory). Each entry's tar header
// is checked at the offset the index gives, for its path, type and size:
// an index that lies gives an error, never another file's bytes. An error
// from each ends the reading and is returned.
func MemberEntries(member io.Reader, es []ArchiveEntry, each func(e ArchiveEntry, r io.Reader) error) error {
	if len(es) == 0 {
		return nil
	}
	zr, err := gzip.NewReader(member)
	if err != nil {
		return amlerr.New(amlerr.InvalidStore, es[0].Path, "archive member: not gzip: %v", err)
	}
	zr.Multistream(false)
	return TarEntries(zr, es, each)
}

// TarEntries is MemberEntries from a member's decompressed tar stream.
func TarEntries(stream io.Reader, es []ArchiveEntry, each func(e ArchiveEntry, r io.Reader) error) error {
	bad := func(p string, format string, args ...any) error {
		return amlerr.New(amlerr.InvalidStore, p, "archive member: "+format, args...)
	}
	cr := &countingReader{r: stream}
	tr := tar.NewReader(cr)
	for len(es) > 0 {
		e := es[0]
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return bad(e.Path, "no entry for it in its member")
		}
		if err != nil {
			return bad(e.Path, "%v", err)
		}
		p, err := archiveName(hdr.Name)
		if err != nil || p != e.Path {
			if cr.n >= e.Data {
				return bad(e.Path, "the index says it is at %d, the member holds %q there", e.Data, hdr.Name)
			}
			continue
		}
		typ := TypeFile
		if hdr.Typeflag == tar.TypeDir {
			typ = TypeDir
		} else if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA {
			typ = ""
		}
		if cr.n != e.Data || hdr.Size != e.Size || typ != e.Type {
			return bad(e.Path, "the index says a %s of %d bytes at %d, the member holds a %q of %d at %d", e.Type, e.Size, e.Data, hdr.Typeflag, hdr.Size, cr.n)
		}
		var r io.Reader
		if e.Type == TypeFile {
			r = io.LimitReader(tr, e.Size)
		}
		if err := each(e, r); err != nil {
			return err
		}
		es = es[1:]
	}
	return nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// appendJSON appends x as encoding/json writes it, byte for byte
// (TestIndexJSONAsEncodingJSON), without reflection: a one-file save of a
// 100k-file tree writes the whole index again.
func (x *ArchiveIndex) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"version":`...)
	b = strconv.AppendInt(b, int64(x.Version), 10)
	b = append(b, `,"entries":`...)
	if x.Entries == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range x.Entries {
			if i > 0 {
				b = append(b, ',')
			}
			b = x.Entries[i].appendJSON(b)
		}
		b = append(b, ']')
	}
	for _, f := range []struct {
		key  string
		v    any
		omit bool
	}{{"symlinks", x.Symlinks, len(x.Symlinks) == 0}, {"fork", x.Fork, x.Fork == nil}} {
		if f.omit {
			continue
		}
		v, err := json.Marshal(f.v)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, `,"`...), f.key...), `":`...)
		b = append(b, v...)
	}
	b = append(b, `,"end":`...)
	b = strconv.AppendInt(b, x.End, 10)
	b = append(b, `,"endLen":`...)
	b = strconv.AppendInt(b, x.EndLen, 10)
	return append(b, '}'), nil
}

func (e *ArchiveEntry) appendJSON(b []byte) []byte {
	b = append(b, '{')
	if e.Stat != (EntryStat{}) {
		b = append(e.Stat.appendJSON(append(b, `"amlfs":`...)), ',')
	}
	b = append(b, `"mode":`...)
	b = strconv.AppendUint(b, uint64(e.Mode), 10)
	if e.Mtime != 0 {
		b = append(b, `,"mtime":"`...)
		b = append(e.Mtime.appendTo(b), '"')
	}
	b = appendJSONString(append(b, `,"path":`...), e.Path)
	b = append(b, `,"size":`...)
	b = strconv.AppendInt(b, e.Size, 10)
	if e.Target != "" {
		b = appendJSONString(append(b, `,"target":`...), e.Target)
	}
	b = appendJSONString(append(b, `,"type":`...), e.Type)
	b = append(b, `,"member":`...)
	b = strconv.AppendInt(b, e.Member, 10)
	b = append(b, `,"memberLen":`...)
	b = strconv.AppendInt(b, e.MemberLen, 10)
	b = append(b, `,"data":`...)
	b = strconv.AppendInt(b, e.Data, 10)
	return append(b, '}')
}

// appendJSONString appends s quoted as encoding/json quotes it: plain
// printable ASCII as it is, anything else through encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}
