package format

import (
	"path"
	"strings"

	"github.com/bmatcuk/doublestar/v4"

	"github.com/amlfs/amlfs/amlerr"
)

// Selection decides which paths of a working tree a save or restore takes.
//
// Rules, in order: a path under Hidden is never taken (live mounts); a path
// matching an Exclude glob is never taken; when Include globs are given, only
// paths matching one are taken (and the directories above them), and such an
// explicit include overrides .gitignore; otherwise a path is taken unless
// .gitignore (honoured unless NoGitignore) ignores it. A glob that matches a
// directory covers everything beneath it.
type Selection struct {
	Include     []string
	Exclude     []string
	NoGitignore bool
	// Hidden are relative paths never taken, whatever the globs say.
	Hidden []string
}

// Validate checks the globs.
func (s Selection) Validate() error {
	for _, g := range append(append([]string{}, s.Include...), s.Exclude...) {
		if g == "" || !doublestar.ValidatePattern(g) {
			return amlerr.New(amlerr.InvalidConfig, g, "invalid glob")
		}
	}
	return nil
}

// MatchAny reports whether p, or a directory above it, matches one of globs.
func MatchAny(globs []string, p string) bool {
	for _, g := range globs {
		g = strings.TrimPrefix(strings.TrimSuffix(g, "/"), "/")
		for q := p; q != "."; q = path.Dir(q) {
			if ok, _ := doublestar.Match(g, q); ok {
				return true
			}
		}
	}
	return false
}

// Takes reports whether a single path is selected, ignoring .gitignore. It
// is used to filter a manifest on restore.
func (s Selection) Takes(p string) bool {
	if s.IsHidden(p) || MatchAny(s.Exclude, p) {
		return false
	}
	return len(s.Include) == 0 || MatchAny(s.Include, p)
}

// Filter returns the entries Takes selects, keeping the directories above
// selected files.
func (s Selection) Filter(es []TreeEntry) []TreeEntry {
	if len(s.Include) == 0 && len(s.Exclude) == 0 && len(s.Hidden) == 0 {
		return es
	}
	keep := map[string]bool{}
	for _, e := range es {
		if s.Takes(e.Path) {
			keep[e.Path] = true
			for d := path.Dir(e.Path); d != "."; d = path.Dir(d) {
				if s.Takes(d) || len(s.Include) > 0 {
					keep[d] = true
				}
			}
		}
	}
	var out []TreeEntry
	for _, e := range es {
		if keep[e.Path] {
			out = append(out, e)
		}
	}
	return out
}

// IsHidden reports whether p is, or is beneath, one of the Hidden paths.
func (s Selection) IsHidden(p string) bool {
	for _, h := range s.Hidden {
		if p == h || strings.HasPrefix(p, h+"/") {
			return true
		}
	}
	return false
}
