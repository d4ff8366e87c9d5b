package revision

import (
	"io"
	"os"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

// writeArchive writes the entries of the tree at dir as AML's archive
// format, composable (format.ComposeWriter: gzip members of whole tar
// entries, and amlfs's index at the end, which keeps the nanosecond
// mtimes and the stat data). Each file is its bytes at one instant
// (store.ReadStable), spooled before its header is written, since a tar header
// gives the size first.
// It returns the number of compressed bytes written and the entries as
// written: sizes and mtimes of the bytes read, without files that were
// gone by the time they were read.
func writeArchive(w io.Writer, dir string, entries []format.TreeEntry, lim format.Limits) (int64, []format.TreeEntry, error) {
	t, err := openTree(dir)
	if err != nil {
		return 0, nil, err
	}
	defer t.Close()
	aw, err := format.NewComposeWriter(w, lim)
	if err != nil {
		return 0, nil, err
	}
	var sp spool
	defer sp.close()
	out := make([]format.TreeEntry, 0, len(entries))
	for _, e := range entries {
		switch e.Type {
		case format.TypeDir:
			if err := aw.Dir(e); err != nil {
				return 0, nil, err
			}
		case format.TypeFile:
			f, gone, err := sp.read(t, e.Path)
			if err != nil {
				return 0, nil, err
			}
			if gone {
				continue
			}
			e.Size, e.Mtime = int64(sp.st.Size), format.Mtime(sp.st.Mtime.Nano())
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return 0, nil, err
			}
			if err := aw.File(e, f); err != nil {
				return 0, nil, err
			}
		default:
			return 0, nil, amlerr.New(amlerr.UnsupportedEntry, e.Path, "a %s cannot be saved in AML's archive format; use --format folder", e.Type)
		}
		out = append(out, e)
	}
	n, _, err := aw.Close()
	if err != nil {
		return n, nil, err
	}
	return n, out, nil
}

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
