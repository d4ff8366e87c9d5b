package revision

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/amlfs/amlfs/amlerr"
)

// Entry types in a manifest.
const (
	TypeFile = "file"
	TypeDir  = "directory"
)

// MaxManifestBytes bounds manifest.json.
const MaxManifestBytes = 4 << 20

// Limits bound what a revision may hold.
type Limits struct {
	Entries        int
	ExtractedBytes int64
	ArchiveBytes   int64
}

// DefaultLimits are AML's defaults.
var DefaultLimits = Limits{Entries: 100_000, ExtractedBytes: 1 << 30, ArchiveBytes: 256 << 20}

func (l Limits) orDefault() Limits {
	if l.Entries <= 0 {
		l.Entries = DefaultLimits.Entries
	}
	if l.ExtractedBytes <= 0 {
		l.ExtractedBytes = DefaultLimits.ExtractedBytes
	}
	if l.ArchiveBytes <= 0 {
		l.ArchiveBytes = DefaultLimits.ArchiveBytes
	}
	return l
}

// Check returns a LIMIT_EXCEEDED error when a tree is over the limits.
func (l Limits) Check(subject string, entries int, bytes int64) error {
	l = l.orDefault()
	if entries > l.Entries {
		return amlerr.New(amlerr.LimitExceeded, subject, "%d entries, over the limit of %d", entries, l.Entries)
	}
	if bytes > l.ExtractedBytes {
		return amlerr.New(amlerr.LimitExceeded, subject, "%d bytes, over the limit of %d", bytes, l.ExtractedBytes)
	}
	return nil
}

// TreeEntry is one file or directory of a revision. It is also the manifest
// entry; fields are in AML's (alphabetical) order.
type TreeEntry struct {
	Mode uint32 `json:"mode"`
	Path string `json:"path"`
	Size int64  `json:"size"`
	Type string `json:"type"`
}

// Manifest is a folder revision's manifest.json.
type Manifest struct {
	Entries []TreeEntry `json:"entries"`
	Version int         `json:"version"`
}

// ValidPath checks a relative, /-separated revision path.
func ValidPath(p string) error {
	if p == "" {
		return fmt.Errorf("empty path")
	}
	if !utf8.ValidString(p) {
		return fmt.Errorf("path %q is not valid UTF-8", p)
	}
	if strings.ContainsRune(p, 0) {
		return fmt.Errorf("path %q contains NUL", p)
	}
	if strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q is absolute", p)
	}
	for _, s := range strings.Split(p, "/") {
		if s == "" || s == "." || s == ".." {
			return fmt.Errorf("path %q has an empty, . or .. segment", p)
		}
	}
	return nil
}

func depth(p string) int { return strings.Count(p, "/") }

// jsLess orders strings as JavaScript's default comparison does (UTF-16 code
// units), so that amlfs and AML agree on "by name".
func jsLess(a, b string) bool {
	if isASCII(a) && isASCII(b) {
		return a < b
	}
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			return ua[i] < ub[i]
		}
	}
	return len(ua) < len(ub)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// SortEntries orders entries by depth, then by name.
func SortEntries(es []TreeEntry) {
	sort.Slice(es, func(i, j int) bool {
		di, dj := depth(es[i].Path), depth(es[j].Path)
		if di != dj {
			return di < dj
		}
		return jsLess(es[i].Path, es[j].Path)
	})
}

// ValidateEntries checks a tree's entries: valid paths, known types,
// permission-only modes, zero-size directories, no duplicates, no file used
// as a directory, and the limits.
func ValidateEntries(subject string, es []TreeEntry, lim Limits) error {
	bad := func(format string, args ...any) error {
		return amlerr.New(amlerr.InvalidStore, subject, format, args...)
	}
	types := make(map[string]string, len(es))
	var total int64
	for _, e := range es {
		if err := ValidPath(e.Path); err != nil {
			return bad("%v", err)
		}
		switch e.Type {
		case TypeFile:
			if e.Size < 0 {
				return bad("entry %q has negative size", e.Path)
			}
			total += e.Size
		case TypeDir:
			if e.Size != 0 {
				return bad("directory %q has size %d", e.Path, e.Size)
			}
		default:
			return bad("entry %q has type %q; only files and directories are allowed", e.Path, e.Type)
		}
		if e.Mode&^0o777 != 0 {
			return bad("entry %q has mode %o beyond the permission bits", e.Path, e.Mode)
		}
		if _, dup := types[e.Path]; dup {
			return bad("duplicate entry %q", e.Path)
		}
		types[e.Path] = e.Type
	}
	for _, e := range es {
		for dir := path.Dir(e.Path); dir != "."; dir = path.Dir(dir) {
			if types[dir] == TypeFile {
				return bad("entry %q is beneath file %q", e.Path, dir)
			}
		}
	}
	return lim.Check(subject, len(es), total)
}

// ParseManifest decodes and validates a manifest.
func ParseManifest(subject string, data []byte, lim Limits) (*Manifest, error) {
	if len(data) > MaxManifestBytes {
		return nil, amlerr.New(amlerr.InvalidStore, subject, "manifest is %d bytes, over the %d byte limit", len(data), MaxManifestBytes)
	}
	var raw struct {
		Entries *[]struct {
			Mode *uint32 `json:"mode"`
			Path *string `json:"path"`
			Size *int64  `json:"size"`
			Type *string `json:"type"`
		} `json:"entries"`
		Version *int `json:"version"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return nil, amlerr.New(amlerr.InvalidStore, subject, "malformed manifest JSON: %v", err)
	}
	if dec.More() {
		return nil, amlerr.New(amlerr.InvalidStore, subject, "trailing data after the manifest")
	}
	if raw.Version == nil || *raw.Version != 1 {
		return nil, amlerr.New(amlerr.InvalidStore, subject, "manifest version missing or not 1")
	}
	if raw.Entries == nil {
		return nil, amlerr.New(amlerr.InvalidStore, subject, "manifest lacks entries")
	}
	m := &Manifest{Version: 1, Entries: make([]TreeEntry, 0, len(*raw.Entries))}
	for i, e := range *raw.Entries {
		if e.Mode == nil || e.Path == nil || e.Size == nil || e.Type == nil {
			return nil, amlerr.New(amlerr.InvalidStore, subject, "entries[%d] lacks mode, path, size or type", i)
		}
		m.Entries = append(m.Entries, TreeEntry{Mode: *e.Mode, Path: *e.Path, Size: *e.Size, Type: *e.Type})
	}
	if err := ValidateEntries(subject, m.Entries, lim); err != nil {
		return nil, err
	}
	return m, nil
}

// Marshal encodes the manifest with entries in AML's order.
func (m *Manifest) Marshal() ([]byte, error) {
	SortEntries(m.Entries)
	m.Version = 1
	if m.Entries == nil {
		m.Entries = []TreeEntry{}
	}
	data, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(data) > MaxManifestBytes {
		return nil, amlerr.New(amlerr.LimitExceeded, "manifest.json", "manifest would be %d bytes, over the %d byte limit", len(data), MaxManifestBytes)
	}
	return data, nil
}
