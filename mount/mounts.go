package mount

import (
	"net/url"
	"path"
	"sort"
	"strings"

	"github.com/amlfs/amlfs/s3client"
)

// MountSpec is one live mount: --mount /PREFIX=URL[,ro].
type MountSpec struct {
	// Prefix is the absolute, normalized path in the mount ("/data").
	Prefix string
	URL    string
	Kind   string // "file" or "s3"
	Dir    string // file: the host directory
	Bucket string // s3
	Key    string // s3: the key prefix, "" or ending in "/"
	RO     bool
}

// Rel is the prefix relative to the mount root ("data").
func (m MountSpec) Rel() string { return strings.TrimPrefix(m.Prefix, "/") }

// ParseMountSpec parses /PREFIX=URL[,ro]. The prefix must already be
// normalized: absolute, no trailing slash, no empty, "." or ".." segment.
func ParseMountSpec(s string) (MountSpec, error) {
	prefix, rest, ok := strings.Cut(s, "=")
	if !ok || prefix == "" || rest == "" {
		return MountSpec{}, invalid(s, "--mount must be /PREFIX=URL[,ro]")
	}
	if !strings.HasPrefix(prefix, "/") || path.Clean(prefix) != prefix || prefix == "/" || strings.ContainsRune(prefix, 0) {
		return MountSpec{}, invalid(s, "--mount prefix %q must be an absolute, normalized path below / (like /data)", prefix)
	}
	m := MountSpec{Prefix: prefix, URL: rest}
	if u, opts, ok := strings.Cut(rest, ","); ok {
		m.URL = u
		for _, o := range strings.Split(opts, ",") {
			switch o {
			case "ro":
				m.RO = true
			case "rw":
				m.RO = false
			default:
				return MountSpec{}, invalid(s, "--mount option %q: only ro or rw", o)
			}
		}
	}
	u, err := url.Parse(m.URL)
	if err != nil {
		return MountSpec{}, invalid(s, "--mount URL: %v", err)
	}
	switch u.Scheme {
	case "file":
		if m.Dir, err = fileURLDir(u, s, "mount"); err != nil {
			return MountSpec{}, err
		}
		m.Kind = "file"
	case "s3":
		su, err := s3client.ParseURL(m.URL, "")
		if err != nil {
			return MountSpec{}, invalid(s, "%v", err)
		}
		m.Kind, m.Bucket, m.Key = "s3", su.Bucket, su.Prefix
		if m.Key != "" {
			m.Key += "/"
		}
	default:
		return MountSpec{}, invalid(s, "unsupported mount scheme %q (use file:///dir or s3://bucket/prefix)", u.Scheme)
	}
	return m, nil
}

// ParseMounts parses every --mount and rejects duplicates and nesting.
func ParseMounts(specs []string) ([]MountSpec, error) {
	var ms []MountSpec
	for _, s := range specs {
		m, err := ParseMountSpec(s)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Prefix < ms[j].Prefix })
	for i := range ms {
		for j := range ms {
			if i != j && (ms[i].Prefix == ms[j].Prefix || strings.HasPrefix(ms[j].Prefix, ms[i].Prefix+"/")) {
				return nil, invalid(ms[j].Prefix, "live mounts may not be nested or repeated: %s and %s", ms[i].Prefix, ms[j].Prefix)
			}
		}
	}
	return ms, nil
}
