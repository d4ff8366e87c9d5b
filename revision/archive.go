package revision

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/amlfs/amlfs/amlerr"
)

// WriteArchive writes the entries of the tree at dir as AML's archive format:
// a gzip-compressed tar rooted at ".", holding only directories and regular
// files. Each file is its bytes at one instant (readStable), spooled before
// its header is written, since a tar header gives the size first. It
// returns the number of compressed bytes written and the entries as
// written: sizes and mtimes of the bytes read, without files that were
// gone by the time they were read.
func WriteArchive(w io.Writer, dir string, entries []TreeEntry, lim Limits) (int64, []TreeEntry, error) {
	lim = lim.orDefault()
	t, err := openTree(dir)
	if err != nil {
		return 0, nil, err
	}
	defer t.Close()
	cw := &countingWriter{w: w, limit: lim.ArchiveBytes}
	gz := gzip.NewWriter(cw)
	tw := tar.NewWriter(gz)
	now := time.Now()
	if err := tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now, Format: tar.FormatPAX}); err != nil {
		return cw.n, nil, err
	}
	var sp spool
	defer sp.close()
	out := make([]TreeEntry, 0, len(entries))
	for _, e := range entries {
		mtime := now
		if e.Mtime != 0 {
			mtime = e.Mtime.Time()
		}
		hdr := &tar.Header{Name: "./" + e.Path, Mode: int64(e.Mode), ModTime: mtime, Format: tar.FormatPAX}
		switch e.Type {
		case TypeDir:
			hdr.Name += "/"
			hdr.Typeflag = tar.TypeDir
			if err := tw.WriteHeader(hdr); err != nil {
				return cw.n, nil, err
			}
		case TypeFile:
			stp, gone, err := writeTarFile(tw, hdr, t, e.Path, &sp)
			if err != nil {
				return cw.n, nil, err
			}
			if gone {
				continue
			}
			e.Size, e.Mtime = int64(stp.size), Mtime(stp.mtime.Nano())
		default:
			return cw.n, nil, amlerr.New(amlerr.UnsupportedEntry, e.Path, "a %s cannot be saved in AML's archive format; use --format folder", e.Type)
		}
		out = append(out, e)
	}
	if err := tw.Close(); err != nil {
		return cw.n, nil, err
	}
	if err := gz.Close(); err != nil {
		return cw.n, nil, err
	}
	return cw.n, out, nil
}

// spool holds one file's bytes between their stable read and the tar
// stream: an unlinked temporary file, reused for every file.
type spool struct{ f *os.File }

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

func writeTarFile(tw *tar.Writer, hdr *tar.Header, t *tree, rel string, sp *spool) (stamp, bool, error) {
	f, gone, err := openSaved(t, rel)
	if err != nil || gone {
		return stamp{}, gone, err
	}
	defer f.Close()
	stp, err := readStable(f, func(size int64, attempt int) error {
		out, err := sp.reset()
		if err != nil {
			return err
		}
		_, err = copyExactly(out, f, size)
		return err
	})
	if err != nil {
		return stamp{}, false, err
	}
	hdr.Typeflag = tar.TypeReg
	hdr.Size = int64(stp.size)
	hdr.ModTime = time.Unix(0, stp.mtime.Nano())
	if err := tw.WriteHeader(hdr); err != nil {
		return stamp{}, false, err
	}
	if _, err := copyExactly(tw, sp.f, hdr.Size); err != nil {
		return stamp{}, false, err
	}
	return stp, false, nil
}

type countingWriter struct {
	w     io.Writer
	n     int64
	limit int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.n+int64(len(p)) > c.limit {
		return 0, amlerr.New(amlerr.LimitExceeded, "archive", "archive exceeds %d bytes (raise it with --max-archive-bytes%s)", c.limit, limitHint)
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// archiveName turns a tar member name into a revision path: "" for the root,
// or an error for anything absolute, traversing or otherwise unsafe.
func archiveName(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("member %q contains NUL", name)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("member %q is an absolute path", name)
	}
	p := strings.TrimSuffix(name, "/")
	for p == "." || strings.HasPrefix(p, "./") {
		p = strings.TrimPrefix(strings.TrimPrefix(p, "."), "/")
	}
	if p == "" {
		return "", nil
	}
	if err := ValidPath(p); err != nil {
		return "", fmt.Errorf("member %q: %w", name, err)
	}
	return p, nil
}

// limitedReader fails once more than n bytes have been read from r.
type limitedReader struct {
	r     io.Reader
	n     int64
	limit int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.n += int64(n)
	if l.n > l.limit {
		return n, amlerr.New(amlerr.LimitExceeded, "archive", "archive exceeds %d bytes (raise it with --max-archive-bytes%s)", l.limit, limitHint)
	}
	return n, err
}

// ReadArchive reads an archive revision. With dir == "" it only validates:
// every member name, type and size, the entry and byte limits, and the gzip
// and tar framing to the end. With dir set it also extracts into dir, which
// must exist and be empty. It returns the tree entries.
//
// take, when not nil, filters which entries are extracted.
func ReadArchive(r io.Reader, dir string, subject string, lim Limits, take func(string) bool) ([]TreeEntry, error) {
	lim = lim.orDefault()
	bad := func(err error) error { return amlerr.Wrap(amlerr.InvalidStore, subject, err) }
	gz, err := gzip.NewReader(&limitedReader{r: r, limit: lim.ArchiveBytes})
	if err != nil {
		return nil, bad(fmt.Errorf("not a gzip stream: %w", err))
	}
	defer gz.Close()
	tr := tar.NewReader(gz)
	var (
		entries []TreeEntry
		seen    = map[string]bool{}
		total   int64
		m       materializer
	)
	if dir != "" {
		m.root = dir
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if amlerr.Code(err) != "" {
				return nil, err
			}
			return nil, bad(fmt.Errorf("corrupt archive: %w", err))
		}
		p, err := archiveName(hdr.Name)
		if err != nil {
			return nil, bad(err)
		}
		if p == "" {
			if hdr.Typeflag != tar.TypeDir {
				return nil, bad(fmt.Errorf("root member %q is not a directory", hdr.Name))
			}
			continue
		}
		if seen[p] {
			return nil, bad(fmt.Errorf("duplicate member %q", p))
		}
		seen[p] = true
		e := TreeEntry{Path: p, Mode: uint32(hdr.Mode) & 0o777}
		if !hdr.ModTime.IsZero() {
			e.Mtime = MtimeOf(hdr.ModTime)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			e.Type = TypeDir
		case tar.TypeReg, tar.TypeRegA:
			e.Type = TypeFile
			e.Size = hdr.Size
			if e.Size < 0 {
				return nil, bad(fmt.Errorf("member %q has negative size", p))
			}
			total += e.Size
		default:
			return nil, bad(fmt.Errorf("member %q has type %q; only files and directories are allowed", p, hdr.Typeflag))
		}
		entries = append(entries, e)
		if err := lim.Check(subject, len(entries), total); err != nil {
			return nil, err
		}
		if dir == "" || (take != nil && !take(p)) {
			continue
		}
		if err := m.add(e, tr); err != nil {
			return nil, err
		}
	}
	// Drain the gzip stream so trailing garbage and checksum errors surface.
	if _, err := io.Copy(io.Discard, gz); err != nil {
		if amlerr.Code(err) != "" {
			return nil, err
		}
		return nil, bad(fmt.Errorf("corrupt archive: %w", err))
	}
	if err := ValidateEntries(subject, entries, lim); err != nil {
		return nil, err
	}
	if dir != "" {
		if err := m.finish(); err != nil {
			return nil, err
		}
	}
	return entries, nil
}
