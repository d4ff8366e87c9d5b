package tools

import (
	"bytes"
	"context"
	"io"
	"os"
	"path"
	"regexp"
	"regexp/syntax"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
	"golang.org/x/sys/unix"
)

// GrepArgs are grep's arguments.
type GrepArgs struct {
	Pattern    *string `json:"pattern"`
	Path       string  `json:"path,omitempty"`
	Glob       string  `json:"glob,omitempty"`
	MaxResults int     `json:"max_results,omitempty"`
}

// Match is one matching line.
type Match struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Text string `json:"text"`
}

// GrepResult is grep's answer.
type GrepResult struct {
	Matches      []Match `json:"matches"`
	FilesScanned int     `json:"filesScanned"`
	Truncated    bool    `json:"truncated"`
}

// Grep searches files under a path. It runs inside the daemon: one call
// searches the whole tree.
// grepLineCap is how many bytes of a line grep matches pattern against:
// grepLineWork over the size of the pattern's compiled program, within
// [MinGrepLine, MaxGrepLine]. RE2's cost is about the product of the two.
func grepLineCap(pattern string) int {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return MinGrepLine
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return MinGrepLine
	}
	return min(max(grepLineWork/max(len(prog.Inst), 1), MinGrepLine), MaxGrepLine)
}

func (t *FS) Grep(ctx context.Context, a GrepArgs) (*GrepResult, error) {
	if a.Pattern == nil || *a.Pattern == "" {
		return nil, invalid("pattern is required")
	}
	re, err := regexp.Compile(*a.Pattern)
	if err != nil {
		return nil, invalid("pattern: %v", err)
	}
	lineCap := grepLineCap(*a.Pattern)
	r, e := t.rel(a.Path)
	if e != nil {
		return nil, e
	}
	if a.Glob != "" && !doublestar.ValidatePattern(a.Glob) {
		return nil, invalid("glob %q is not valid", a.Glob)
	}
	limit := a.MaxResults
	if limit <= 0 {
		limit = DefaultResults
	}
	limit = min(limit, MaxGrepResults)
	res := &GrepResult{Matches: []Match{}}
	stopped := false
	search := func(p string, fd int) bool {
		f := os.NewFile(uintptr(fd), p)
		defer f.Close()
		data, err := io.ReadAll(io.LimitReader(f, MaxReadBytes))
		if err != nil || bytes.IndexByte(data[:min(len(data), 8192)], 0) >= 0 {
			return true // unreadable or binary
		}
		res.FilesScanned++
		for i, line := range bytes.Split(data, []byte("\n")) {
			if ctx.Err() != nil {
				stopped = true
				return false
			}
			if re.Match(line[:min(len(line), lineCap)]) {
				if len(res.Matches) == limit {
					res.Truncated = true
					return false
				}
				text := string(line)
				if len(text) > 1000 {
					text = text[:1000]
				}
				res.Matches = append(res.Matches, Match{Path: p, Line: i + 1, Text: strings.ToValidUTF8(text, "\uFFFD")})
			}
		}
		return true
	}
	// A file path searches that file.
	if fd, e := t.open(r, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0); e == nil {
		e := t.regular(fd, r)
		if e == nil {
			search(t.show(r), fd)
			if stopped {
				return nil, timedOut(ctx)
			}
			return res, nil
		}
		unix.Close(fd)
		if e.Code == CodeNotRegular {
			return nil, e
		}
	}
	viaMount := false
	werr := t.walk(ctx, r, 0, func(name string) bool { return name == ".git" }, func(sub string, dfd int, name string, st *unix.Stat_t) bool {
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > MaxReadBytes {
			return true
		}
		if a.Glob != "" {
			if ok, _ := doublestar.Match(a.Glob, sub); !ok {
				return true
			}
		}
		fd, err := openBeneath(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			return true
		}
		if t.regular(fd, path.Join(r, sub)) != nil {
			unix.Close(fd) // swapped for a fifo or a device since the listing
			return true
		}
		if t.call != nil && t.direct.Writing(fd) {
			unix.Close(fd) // its bytes may be in the mount's page cache only
			viaMount = true
			return false
		}
		return search(t.show(path.Join(r, sub)), fd)
	})
	if viaMount {
		return nil, errViaMount
	}
	if stopped || ctx.Err() != nil {
		return nil, timedOut(ctx)
	}
	if werr != nil {
		return nil, werr
	}
	return res, nil
}
