package format

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/amlfs/amlfs/amlerr"
)

// Revision formats.
const (
	FormatFolder  = "folder"
	FormatArchive = "archive"
)

// IndexKey is the key of the index under a workspace root.
const IndexKey = "workspace.json"

// MaxIndexBytes bounds workspace.json.
const MaxIndexBytes = 4 << 20

// createdAtLayout is JavaScript's Date.prototype.toISOString.
const createdAtLayout = "2006-01-02T15:04:05.000Z"

// Index is AML's workspace.json. Fields are declared in the order AML writes
// them (alphabetical) so that encoding/json reproduces its output.
type Index struct {
	Current   string  `json:"current"`
	Revisions []Entry `json:"revisions"`
	Version   int     `json:"version"`
}

// Entry is one revision record in the index.
type Entry struct {
	CreatedAt string `json:"createdAt"`
	Format    string `json:"format"`
	ID        string `json:"id"`
	Path      string `json:"path"`
}

// Time parses CreatedAt.
func (e Entry) Time() time.Time {
	t, _ := time.Parse(createdAtLayout, e.CreatedAt)
	return t
}

// FormatCreatedAt renders t the way JavaScript's toISOString does.
func FormatCreatedAt(t time.Time) string {
	return t.UTC().Truncate(time.Millisecond).Format(createdAtLayout)
}

// ArchiveExt ends an archive revision's path.
const ArchiveExt = ".tar.gz"

// RevisionPath is the artifact path AML derives from an id and format.
func RevisionPath(id, format string) string {
	if format == FormatArchive {
		return "revisions/" + id + ArchiveExt
	}
	return "revisions/" + id + "/"
}

// ValidateRevisionID checks that id is usable as a revision id and as one
// path segment: non-empty, unpadded, no separators, control characters or
// dot segments.
func ValidateRevisionID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("revision id is empty")
	case strings.TrimSpace(id) != id:
		return fmt.Errorf("revision id %q is padded with whitespace", id)
	case id == "." || id == "..":
		return fmt.Errorf("revision id %q is a dot segment", id)
	case len(id) > 200:
		return fmt.Errorf("revision id is longer than 200 bytes")
	case strings.HasPrefix(id, "."):
		return fmt.Errorf("revision id %q starts with a dot", id)
	}
	for _, r := range id {
		if r == '/' || r == '\\' || r == 0 || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("revision id %q contains %q", id, r)
		}
	}
	return nil
}

// ParseIndex decodes and validates workspace.json. Any violation of AML's
// rules is an INVALID_STORE error: a store is never silently treated as new.
func ParseIndex(data []byte) (*Index, error) {
	if len(data) > MaxIndexBytes {
		return nil, amlerr.New(amlerr.InvalidStore, IndexKey, "index is %d bytes, over the %d byte limit", len(data), MaxIndexBytes)
	}
	var raw struct {
		Current   *string `json:"current"`
		Revisions *[]struct {
			CreatedAt *string `json:"createdAt"`
			Format    *string `json:"format"`
			ID        *string `json:"id"`
			Path      *string `json:"path"`
		} `json:"revisions"`
		Version *int `json:"version"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return nil, amlerr.New(amlerr.InvalidStore, IndexKey, "malformed JSON: %v", err)
	}
	if dec.More() {
		return nil, amlerr.New(amlerr.InvalidStore, IndexKey, "trailing data after the JSON object")
	}
	switch {
	case raw.Version == nil:
		return nil, amlerr.New(amlerr.InvalidStore, IndexKey, "missing version")
	case *raw.Version != 1:
		return nil, amlerr.New(amlerr.InvalidStore, IndexKey, "unsupported version %d", *raw.Version)
	case raw.Current == nil:
		return nil, amlerr.New(amlerr.InvalidStore, IndexKey, "missing current")
	case raw.Revisions == nil:
		return nil, amlerr.New(amlerr.InvalidStore, IndexKey, "missing revisions")
	}
	idx := &Index{Current: *raw.Current, Version: 1}
	for i, r := range *raw.Revisions {
		if r.CreatedAt == nil || r.Format == nil || r.ID == nil || r.Path == nil {
			return nil, amlerr.New(amlerr.InvalidStore, IndexKey, "revisions[%d] lacks createdAt, format, id or path", i)
		}
		idx.Revisions = append(idx.Revisions, Entry{CreatedAt: *r.CreatedAt, Format: *r.Format, ID: *r.ID, Path: *r.Path})
	}
	if err := idx.Validate(); err != nil {
		return nil, err
	}
	return idx, nil
}

// Validate checks AML's index rules.
func (idx *Index) Validate() error {
	if idx.Version != 1 {
		return amlerr.New(amlerr.InvalidStore, IndexKey, "unsupported version %d", idx.Version)
	}
	seen := make(map[string]bool, len(idx.Revisions))
	for i, e := range idx.Revisions {
		if err := ValidateRevisionID(e.ID); err != nil {
			return amlerr.Wrap(amlerr.InvalidStore, IndexKey, fmt.Errorf("revisions[%d]: %w", i, err))
		}
		if seen[e.ID] {
			return amlerr.New(amlerr.InvalidStore, IndexKey, "duplicate revision id %q", e.ID)
		}
		seen[e.ID] = true
		if e.Format != FormatFolder && e.Format != FormatArchive {
			return amlerr.New(amlerr.InvalidStore, IndexKey, "revision %q has unknown format %q", e.ID, e.Format)
		}
		if want := RevisionPath(e.ID, e.Format); e.Path != want {
			return amlerr.New(amlerr.InvalidStore, IndexKey, "revision %q has path %q, want %q", e.ID, e.Path, want)
		}
		if _, err := time.Parse(createdAtLayout, e.CreatedAt); err != nil {
			return amlerr.New(amlerr.InvalidStore, IndexKey, "revision %q has createdAt %q, not an ISO-8601 UTC timestamp with milliseconds", e.ID, e.CreatedAt)
		}
	}
	if !seen[idx.Current] {
		return amlerr.New(amlerr.InvalidStore, IndexKey, "current revision %q is not in revisions", idx.Current)
	}
	return nil
}

// Find returns the entry for id.
func (idx *Index) Find(id string) (Entry, bool) {
	for _, e := range idx.Revisions {
		if e.ID == id {
			return e, true
		}
	}
	return Entry{}, false
}

// Resolve finds rev, or the current revision for "" or "current".
func (idx *Index) Resolve(rev string) (Entry, bool) {
	if rev == "" || rev == "current" {
		rev = idx.Current
	}
	return idx.Find(rev)
}

// Marshal encodes the index as AML writes it.
func (idx *Index) Marshal() ([]byte, error) {
	if err := idx.Validate(); err != nil {
		return nil, err
	}
	data, err := json.Marshal(idx)
	if err != nil {
		return nil, err
	}
	if len(data) > MaxIndexBytes {
		return nil, amlerr.New(amlerr.LimitExceeded, IndexKey, "index would be %d bytes, over the %d byte limit", len(data), MaxIndexBytes)
	}
	return data, nil
}

// WithNew returns the index after publishing e as current, keeping at most
// retention entries (newest first), and the entries it drops.
func (idx *Index) WithNew(e Entry, retention int) (next *Index, pruned []Entry) {
	if retention < 1 {
		retention = 1
	}
	next = &Index{Current: e.ID, Version: 1, Revisions: []Entry{e}}
	if idx != nil {
		for _, old := range idx.Revisions {
			if old.ID == e.ID {
				continue
			}
			if len(next.Revisions) < retention {
				next.Revisions = append(next.Revisions, old)
			} else {
				pruned = append(pruned, old)
			}
		}
	}
	return next, pruned
}
