package format

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/amlfs/amlfs/amlerr"
)

// countingWriter counts the bytes written through it, and fails
// past its limit.
type countingWriter struct {
	w     io.Writer
	n     int64
	limit int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.n+int64(len(p)) > c.limit {
		return 0, archiveTooLarge(c.limit)
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ErrArchiveTooLarge is wrapped by the LIMIT_EXCEEDED error of an archive
// over Limits.ArchiveBytes.
var ErrArchiveTooLarge = errors.New("archive over its bound")

func archiveTooLarge(limit int64) error {
	return amlerr.Wrap(amlerr.LimitExceeded, "archive", fmt.Errorf("%w: over %d bytes (raise it with --max-archive-bytes, or save with --format folder%s)", ErrArchiveTooLarge, limit, limitHint))
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
		return n, archiveTooLarge(l.limit)
	}
	return n, err
}

// ReadArchive reads an archive revision and validates it: every member
// name, type and size, the entry and byte limits, and the gzip and tar
// framing to the end. It returns the tree entries. each, when not nil,
// is called with every entry as it is read, and for a file with a reader
// of its bytes (nil for a directory); an error from each ends the read.
// subject names the archive in errors.
func ReadArchive(r io.Reader, subject string, lim Limits, each func(e TreeEntry, content io.Reader) error) ([]TreeEntry, error) {
	lim = lim.OrDefault()
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
	)
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
		var content io.Reader
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
			content = tr
		default:
			return nil, bad(fmt.Errorf("member %q has type %q; only files and directories are allowed", p, hdr.Typeflag))
		}
		entries = append(entries, e)
		if err := lim.Check(subject, len(entries), total); err != nil {
			return nil, err
		}
		if each != nil {
			if err := each(e, content); err != nil {
				return nil, err
			}
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
	return entries, nil
}
