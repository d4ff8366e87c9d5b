package format

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/amlfs/amlfs/amlerr"
)

// Entry types. AML knows files and directories; a symlink lives in the
// manifest's extension (see Manifest), which AML ignores.
const (
	TypeFile    = "file"
	TypeDir     = "directory"
	TypeSymlink = "symlink"
)

// MaxSymlinkTarget bounds a symlink's target, as PATH_MAX does.
const MaxSymlinkTarget = 4095

// MaxManifestBytes bounds manifest.json under AML's default limits; a
// raised entry limit raises it in proportion (Limits.ManifestBytes).
const MaxManifestBytes = 4 << 20

// Limits bound what a revision may hold.
type Limits struct {
	Entries        int
	ExtractedBytes int64
	ArchiveBytes   int64
}

// DefaultLimits are AML's defaults.
var DefaultLimits = Limits{Entries: 100_000, ExtractedBytes: 1 << 30, ArchiveBytes: 256 << 20}

// OrDefault fills each unset limit with AML's default.
func (l Limits) OrDefault() Limits {
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

// ManifestBytes bounds a manifest: AML's 4 MiB, or more in proportion
// to an entry limit raised above AML's.
func (l Limits) ManifestBytes() int {
	l = l.OrDefault()
	if l.Entries <= DefaultLimits.Entries {
		return MaxManifestBytes
	}
	return int(int64(MaxManifestBytes) * int64(l.Entries) / int64(DefaultLimits.Entries))
}

// limitHint is appended to every LIMIT_EXCEEDED message.
const limitHint = "; AML's readers need the same limit to load such a revision"

// CheckManifest returns a LIMIT_EXCEEDED error, naming what to do, when
// the manifest of a folder revision of entries (and fork, if any) would
// be over its bound even without amlfs's stat data: before anything is
// uploaded.
func (l Limits) CheckManifest(entries []TreeEntry, fork *ForkOrigin) error {
	m := NewManifest(entries)
	if fork != nil {
		m.Ext = &ManifestExt{Fork: fork}
	}
	m.DropStat()
	_, err := m.Marshal(l)
	return err
}

// Check returns a LIMIT_EXCEEDED error, naming the flag that raises the
// limit, when a tree is over the limits.
func (l Limits) Check(subject string, entries int, bytes int64) error {
	l = l.OrDefault()
	if entries > l.Entries {
		return amlerr.New(amlerr.LimitExceeded, subject, "%d entries, over the limit of %d (raise it with --max-entries%s)", entries, l.Entries, limitHint)
	}
	if bytes > l.ExtractedBytes {
		return amlerr.New(amlerr.LimitExceeded, subject, "%d bytes of files, over the limit of %d (raise it with --max-bytes%s)", bytes, l.ExtractedBytes, limitHint)
	}
	return nil
}

// TreeEntry is one file, directory or symlink of a revision. For a file or
// directory it is also the manifest entry: fields are in AML's
// (alphabetical) order, and AML ignores the amlfs and mtime keys.
type TreeEntry struct {
	// Stat is the rest of the stat data the mount showed when the entry
	// was saved (see shown.go); zero if unknown.
	Stat  EntryStat `json:"amlfs,omitzero"`
	Mode  uint32    `json:"mode"`
	Mtime Mtime     `json:"mtime,omitempty"`
	Path  string    `json:"path"`
	Size  int64     `json:"size"`
	// Target is a symlink's target, exactly as readlink gives it.
	Target string `json:"target,omitempty"`
	Type   string `json:"type"`
}

// EntryStat is the stat data of a saved entry beyond AML's: what git's
// index compares (with size and mtime) and the owner. In JSON it is one
// compact string, "CTIME INO UID GID" with CTIME as an Mtime is written,
// since a manifest has AML's 4 MiB bound: "1764882000.123456789 1234 1000 1000".
type EntryStat struct {
	Ctime    Mtime  // 0: unknown
	Ino      uint64 // the inode number the mount showed; 0: unknown
	Uid, Gid uint32
}

// MaxShownIno bounds a saved inode number: the mount keeps bits 48-63 for
// its live mounts' numbers.
const MaxShownIno = 1<<48 - 1

func (s EntryStat) MarshalJSON() ([]byte, error) { return s.appendJSON(make([]byte, 0, 64)), nil }

// appendJSON appends s as its JSON string.
func (s EntryStat) appendJSON(b []byte) []byte {
	b = append(s.Ctime.appendTo(append(b, '"')), ' ')
	b = append(strconv.AppendUint(b, s.Ino, 10), ' ')
	b = append(strconv.AppendUint(b, uint64(s.Uid), 10), ' ')
	return append(strconv.AppendUint(b, uint64(s.Gid), 10), '"')
}

// jsonString is the JSON string b: without a copy or a decoder when it
// holds no escape (these strings are digits, dots and spaces).
func jsonString(b []byte) (string, error) {
	if n := len(b); n >= 2 && b[0] == '"' && b[n-1] == '"' && bytes.IndexByte(b[1:n-1], '\\') < 0 && bytes.IndexByte(b[1:n-1], '"') < 0 {
		return string(b[1 : n-1]), nil
	}
	var str string
	err := json.Unmarshal(b, &str)
	return str, err
}

func (s *EntryStat) UnmarshalJSON(b []byte) error {
	str, err := jsonString(b)
	if err != nil {
		return fmt.Errorf("amlfs stat: %w", err)
	}
	f := strings.Split(str, " ")
	if len(f) != 4 {
		return fmt.Errorf("amlfs stat %q is not \"CTIME INO UID GID\"", str)
	}
	var out EntryStat
	if err := out.Ctime.parse(f[0]); err != nil {
		return err
	}
	ino, err1 := strconv.ParseUint(f[1], 10, 64)
	uid, err2 := strconv.ParseUint(f[2], 10, 32)
	gid, err3 := strconv.ParseUint(f[3], 10, 32)
	if err := errors.Join(err1, err2, err3); err != nil || ino > MaxShownIno {
		return fmt.Errorf("amlfs stat %q has a bad number", str)
	}
	out.Ino, out.Uid, out.Gid = ino, uint32(uid), uint32(gid)
	*s = out
	return nil
}

// Mtime is a modification time in nanoseconds since the Unix epoch; 0 is
// unknown (a revision AML wrote). In JSON it is a string of seconds with a
// nine-digit fraction, "1764882000.123456789": exact, compact, and not a
// number a JavaScript reader would round to a double.
type Mtime int64

// MtimeOf returns t as an Mtime.
func MtimeOf(t time.Time) Mtime { return Mtime(t.UnixNano()) }

// Time returns m as a time.Time.
func (m Mtime) Time() time.Time { return time.Unix(0, int64(m)).UTC() }

func (m Mtime) String() string { return string(m.appendTo(nil)) }

// appendTo appends m as SECONDS.NANOSECONDS.
func (m Mtime) appendTo(b []byte) []byte {
	sec, nsec := int64(m)/1e9, int64(m)%1e9
	if nsec < 0 {
		sec, nsec = sec-1, nsec+1e9
	}
	b = append(strconv.AppendInt(b, sec, 10), '.')
	var frac [9]byte
	for i := 8; i >= 0; i-- {
		frac[i] = byte('0' + nsec%10)
		nsec /= 10
	}
	return append(b, frac[:]...)
}

func (m Mtime) MarshalJSON() ([]byte, error) { return append(m.appendTo([]byte{'"'}), '"'), nil }

func (m *Mtime) UnmarshalJSON(b []byte) error {
	s, err := jsonString(b)
	if err != nil {
		return fmt.Errorf("mtime: %w", err)
	}
	return m.parse(s)
}

// parse reads SECONDS.NANOSECONDS.
func (m *Mtime) parse(s string) error {
	sec, frac, ok := strings.Cut(s, ".")
	if !ok || len(frac) != 9 || sec == "" || strings.TrimLeft(sec, "-0123456789") != "" || strings.TrimLeft(frac, "0123456789") != "" {
		return fmt.Errorf("mtime %q is not SECONDS.NANOSECONDS", s)
	}
	si, err := strconv.ParseInt(sec, 10, 64)
	if err != nil || si < -1<<33 || si > 1<<33 {
		return fmt.Errorf("mtime %q is out of range", s)
	}
	ni, _ := strconv.ParseInt(frac, 10, 64)
	*m = Mtime(si*1e9 + ni)
	return nil
}

// Manifest is a folder revision's manifest.json. Entries holds the files
// and directories, as AML reads them; Ext holds what AML cannot: symlinks.
type Manifest struct {
	Entries []TreeEntry  `json:"entries"`
	Ext     *ManifestExt `json:"amlfs,omitempty"`
	Version int          `json:"version"`
}

// ManifestExt is amlfs's extension of the manifest, under the top-level
// key "amlfs", which AML's parser ignores.
type ManifestExt struct {
	// Fork, in a fork's first revision, names the revision it was
	// forked from.
	Fork     *ForkOrigin `json:"fork,omitempty"`
	Symlinks []TreeEntry `json:"symlinks,omitempty"`
}

// ForkOrigin names the workspace and revision a fork began from.
type ForkOrigin struct {
	ID       string `json:"id"`
	Revision string `json:"revision,omitempty"` // "" for a tree never saved
}

// Tree returns every entry: files, directories and symlinks.
func (m *Manifest) Tree() []TreeEntry {
	if m.Ext == nil || len(m.Ext.Symlinks) == 0 {
		return m.Entries
	}
	es := append(append(make([]TreeEntry, 0, len(m.Entries)+len(m.Ext.Symlinks)), m.Entries...), m.Ext.Symlinks...)
	SortEntries(es)
	return es
}

// NewManifest splits a tree into AML's entries and the extension.
func NewManifest(tree []TreeEntry) *Manifest {
	m := &Manifest{Version: 1, Entries: make([]TreeEntry, 0, len(tree))}
	for _, e := range tree {
		if e.Type == TypeSymlink {
			if m.Ext == nil {
				m.Ext = &ManifestExt{}
			}
			m.Ext.Symlinks = append(m.Ext.Symlinks, e)
			continue
		}
		m.Entries = append(m.Entries, e)
	}
	return m
}

func (m *Manifest) hasStat() bool {
	for _, e := range m.Tree() {
		if e.Stat != (EntryStat{}) {
			return true
		}
	}
	return false
}

// DropStat clears every entry's saved stat data.
func (m *Manifest) DropStat() {
	for i := range m.Entries {
		m.Entries[i].Stat = EntryStat{}
	}
	if m.Ext != nil {
		for i := range m.Ext.Symlinks {
			m.Ext.Symlinks[i].Stat = EntryStat{}
		}
	}
}

// ValidPath checks a relative, /-separated revision path.
func ValidPath(p string) error {
	if p == "" {
		return fmt.Errorf("empty path")
	}
	if !utf8.ValidString(p) {
		return fmt.Errorf("path %q is not valid UTF-8", p)
	}
	if len(p) > MaxPathBytes {
		return fmt.Errorf("path %.40q... is %d bytes, over %d", p, len(p), MaxPathBytes)
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

// MaxPathBytes bounds a revision path, as PATH_MAX (less the NUL) does.
const MaxPathBytes = 4095

func Depth(p string) int { return strings.Count(p, "/") }

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

// SortEntries orders entries by depth, then by name. Each path's depth
// and whether it is ASCII are found once, not at every comparison, and a
// list already in order (a manifest's) is left as it is.
func SortEntries(es []TreeEntry) {
	type key struct {
		depth int
		ascii bool
		i     int
	}
	keys := make([]key, len(es))
	for i := range es {
		keys[i] = key{Depth(es[i].Path), isASCII(es[i].Path), i}
	}
	cmp := func(a, b key) int {
		if a.depth != b.depth {
			return a.depth - b.depth
		}
		pa, pb := es[a.i].Path, es[b.i].Path
		switch {
		case a.ascii && b.ascii:
			return strings.Compare(pa, pb)
		case pa == pb:
			return 0
		case jsLess(pa, pb):
			return -1
		}
		return 1
	}
	if slices.IsSortedFunc(keys, cmp) {
		return
	}
	slices.SortStableFunc(keys, cmp)
	out := make([]TreeEntry, len(es))
	for j, k := range keys {
		out[j] = es[k.i]
	}
	copy(es, out)
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
		case TypeSymlink:
			if e.Target == "" || len(e.Target) > MaxSymlinkTarget || strings.ContainsRune(e.Target, 0) {
				return bad("symlink %q has an empty, NUL-containing or over-long target", e.Path)
			}
			if e.Size != 0 {
				return bad("symlink %q has size %d", e.Path, e.Size)
			}
		default:
			return bad("entry %q has type %q; only files and directories are allowed", e.Path, e.Type)
		}
		if e.Type != TypeSymlink && e.Target != "" {
			return bad("entry %q is a %s with a target", e.Path, e.Type)
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
			if t := types[dir]; t == TypeFile || t == TypeSymlink {
				return bad("entry %q is beneath %s %q", e.Path, t, dir)
			}
		}
	}
	return lim.Check(subject, len(es), total)
}

// ParseManifest decodes and validates a manifest.
func ParseManifest(subject string, data []byte, lim Limits) (*Manifest, error) {
	if max := lim.ManifestBytes(); len(data) > max {
		return nil, amlerr.New(amlerr.LimitExceeded, subject, "manifest is %d bytes, over the %d byte limit (it grows with --max-entries%s)", len(data), max, limitHint)
	}
	type rawEntry struct {
		Stat   EntryStat `json:"amlfs"`
		Mode   *uint32   `json:"mode"`
		Mtime  Mtime     `json:"mtime"`
		Path   *string   `json:"path"`
		Size   *int64    `json:"size"`
		Target string    `json:"target"`
		Type   *string   `json:"type"`
	}
	var raw struct {
		Entries *[]rawEntry `json:"entries"`
		Ext     *struct {
			Fork     *ForkOrigin `json:"fork"`
			Symlinks []rawEntry  `json:"symlinks"`
		} `json:"amlfs"`
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
		// AML's rules: only files and directories here, and no target
		// (AML ignores the key, so a symlink disguised as a file would
		// load differently in AML and amlfs).
		if *e.Type != TypeFile && *e.Type != TypeDir {
			return nil, amlerr.New(amlerr.InvalidStore, subject, "entry %q has type %q; only files and directories are allowed", *e.Path, *e.Type)
		}
		m.Entries = append(m.Entries, TreeEntry{Stat: e.Stat, Mode: *e.Mode, Mtime: e.Mtime, Path: *e.Path, Size: *e.Size, Type: *e.Type, Target: e.Target})
	}
	if raw.Ext != nil && raw.Ext.Fork != nil {
		if ValidateID(raw.Ext.Fork.ID) != nil || (raw.Ext.Fork.Revision != "" && ValidateRevisionID(raw.Ext.Fork.Revision) != nil) {
			return nil, amlerr.New(amlerr.InvalidStore, subject, "amlfs.fork names an invalid workspace or revision id")
		}
		m.Ext = &ManifestExt{Fork: raw.Ext.Fork}
	}
	if raw.Ext != nil && len(raw.Ext.Symlinks) > 0 {
		if m.Ext == nil {
			m.Ext = &ManifestExt{}
		}
		for i, e := range raw.Ext.Symlinks {
			if e.Path == nil || e.Type == nil || *e.Type != TypeSymlink {
				return nil, amlerr.New(amlerr.InvalidStore, subject, "amlfs.symlinks[%d] lacks a path or is not of type symlink", i)
			}
			var mode uint32 = 0o777
			if e.Mode != nil {
				mode = *e.Mode
			}
			m.Ext.Symlinks = append(m.Ext.Symlinks, TreeEntry{Stat: e.Stat, Mode: mode, Mtime: e.Mtime, Path: *e.Path, Type: TypeSymlink, Target: e.Target})
		}
	}
	if err := ValidateEntries(subject, m.Tree(), lim); err != nil {
		return nil, err
	}
	return m, nil
}

// Marshal encodes the manifest with entries in AML's order, within lim's
// manifest bound.
func (m *Manifest) Marshal(lim Limits) ([]byte, error) {
	SortEntries(m.Entries)
	if m.Ext != nil {
		SortEntries(m.Ext.Symlinks)
	}
	m.Version = 1
	if m.Entries == nil {
		m.Entries = []TreeEntry{}
	}
	data, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if max := lim.ManifestBytes(); len(data) > max && m.hasStat() {
		// The stat data only speeds up git after a restore: a tree
		// that fits without it is saved without it.
		m.DropStat()
		return m.Marshal(lim)
	}
	if max := lim.ManifestBytes(); len(data) > max {
		return nil, amlerr.New(amlerr.LimitExceeded, "manifest.json", "a folder revision of %d entries needs a manifest.json of %d bytes, over AML's bound of %d: save with --format archive, which has no manifest, or raise --max-entries (the bound grows in proportion above %d entries%s)", len(m.Entries), len(data), max, DefaultLimits.Entries, limitHint)
	}
	return data, nil
}
