package tools

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/bmatcuk/doublestar/v4"
	"golang.org/x/sys/unix"
)

// ListArgs are list_files' arguments.
type ListArgs struct {
	Path    *string `json:"path"`
	Pattern string  `json:"pattern,omitempty"`
	Depth   *int    `json:"depth,omitempty"`
}

// Entry is one listed path.
type Entry struct {
	Path  string `json:"path"`
	Type  string `json:"type"` // file, directory, symlink, other
	Size  int64  `json:"size"`
	Mode  string `json:"mode,omitempty"`
	MTime string `json:"mtime,omitempty"`
	Link  string `json:"target,omitempty"`
}

// ListResult is list_files' answer.
type ListResult struct {
	Path      string  `json:"path"`
	Entries   []Entry `json:"entries"`
	Truncated bool    `json:"truncated"`
}

func typeOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "other"
}

// walk calls fn for every entry below r (depth levels; 0 for all), in
// name order, with the entry's path relative to r. fn returning false
// stops the walk.
func (t *FS) walk(ctx context.Context, r string, depth int, skip func(name string) bool, fn func(sub string, dfd int, name string, st *unix.Stat_t) bool) *Error {
	fd, e := t.open(r, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if e != nil {
		return e
	}
	stop := false
	var rec func(fd int, prefix string, level int) *Error
	rec = func(fd int, prefix string, level int) *Error {
		f := os.NewFile(uintptr(fd), prefix)
		defer f.Close()
		names, err := f.Readdirnames(-1)
		if err != nil {
			return errno(t.show(path.Join(r, prefix)), err)
		}
		sort.Strings(names)
		for _, name := range names {
			if stop || ctx.Err() != nil {
				stop = true
				return nil
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // gone since the listing
			}
			sub := path.Join(prefix, name)
			if !fn(sub, fd, name, &st) {
				stop = true
				return nil
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR && (depth == 0 || level+1 < depth) && (skip == nil || !skip(name)) {
				cfd, err := openBeneath(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
				if err != nil {
					continue
				}
				if e := rec(cfd, sub, level+1); e != nil {
					return e
				}
			}
		}
		return nil
	}
	return rec(fd, "", 0)
}

// ListFiles lists a directory.
func (t *FS) ListFiles(ctx context.Context, a ListArgs) (*ListResult, error) {
	r, e := t.need(a.Path)
	if e != nil {
		return nil, e
	}
	depth := 1
	if a.Depth != nil {
		if *a.Depth < 0 {
			return nil, invalid("depth must not be negative")
		}
		depth = *a.Depth
	}
	if a.Pattern != "" && !doublestar.ValidatePattern(a.Pattern) {
		return nil, invalid("pattern %q is not a valid glob", a.Pattern)
	}
	res := &ListResult{Path: t.show(r), Entries: []Entry{}}
	e = t.walk(ctx, r, depth, nil, func(sub string, dfd int, name string, st *unix.Stat_t) bool {
		if a.Pattern != "" {
			if ok, _ := doublestar.Match(a.Pattern, sub); !ok {
				return true
			}
		}
		if len(res.Entries) == MaxListEntries {
			res.Truncated = true
			return false
		}
		res.Entries = append(res.Entries, entry(t.show(path.Join(r, sub)), dfd, name, st))
		return true
	})
	if e != nil {
		return nil, e
	}
	return res, nil
}

func entry(p string, dfd int, name string, st *unix.Stat_t) Entry {
	en := Entry{Path: p, Type: typeOf(st.Mode), Size: st.Size, Mode: fmt.Sprintf("%04o", st.Mode&0o7777),
		MTime: time.Unix(st.Mtim.Unix()).UTC().Format(time.RFC3339Nano)}
	if en.Type == "symlink" {
		buf := make([]byte, 4096)
		if n, err := unix.Readlinkat(dfd, name, buf); err == nil {
			en.Link = string(buf[:n])
		}
	}
	return en
}

// --- file_stat ---

// Stat describes a path.
func (t *FS) Stat(a PathArgs) (*Entry, error) {
	r, e := t.need(a.Path)
	if e != nil {
		return nil, e
	}
	if r == "." {
		fd, e := t.open(r, unix.O_PATH|unix.O_DIRECTORY, 0)
		if e != nil {
			return nil, e
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, errno(t.show(r), err)
		}
		en := entry(t.show(r), fd, "", &st)
		return &en, nil
	}
	dfd, name, e := t.parent(r)
	if e != nil {
		return nil, e
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, errno(t.show(r), err)
	}
	en := entry(t.show(r), dfd, name, &st)
	return &en, nil
}

// --- mkdir ---

// MkdirResult is mkdir's answer.
type MkdirResult struct {
	Path    string `json:"path"`
	Created bool   `json:"created"`
}

// Mkdir makes a directory and its missing parents.
func (t *FS) Mkdir(a PathArgs) (*MkdirResult, error) {
	r, e := t.need(a.Path)
	if e != nil {
		return nil, e
	}
	if r == "." {
		return &MkdirResult{Path: "/"}, nil
	}
	created := false
	parts := strings.Split(path.Clean(r), "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		if parts[i] == ".." || parts[i] == "." {
			continue
		}
		dfd, name, e := t.parent(p)
		if e != nil {
			return nil, e
		}
		err := unix.Mkdirat(dfd, name, 0o755)
		if err == nil {
			if uid, gid, ok := t.ownerFor(dfd); ok {
				if cerr := unix.Fchownat(dfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); cerr != nil {
					unix.Close(dfd)
					return nil, errno(t.show(p), cerr)
				}
			}
		}
		if err == unix.EEXIST {
			// An existing directory, or a symlink to one inside the
			// mount, is fine.
			unix.Close(dfd)
			fd, e := t.open(p, unix.O_PATH|unix.O_DIRECTORY, 0)
			if e != nil {
				return nil, e
			}
			unix.Close(fd)
			continue
		} else if err == nil {
			created = true
		}
		unix.Close(dfd)
		if err != nil {
			return nil, errno(t.show(p), err)
		}
	}
	return &MkdirResult{Path: t.show(r), Created: created}, nil
}

// --- delete ---

// DeleteArgs are delete's arguments.
type DeleteArgs struct {
	Path      *string `json:"path"`
	Recursive bool    `json:"recursive,omitempty"`
}

// DeleteResult is delete's answer.
type DeleteResult struct {
	Path    string `json:"path"`
	Removed int    `json:"removed"`
}

// Delete removes a file, symlink or directory.
func (t *FS) Delete(ctx context.Context, a DeleteArgs) (*DeleteResult, error) {
	r, e := t.need(a.Path)
	if e != nil {
		return nil, e
	}
	dfd, name, e := t.parent(r)
	if e != nil {
		return nil, e
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, errno(t.show(r), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(dfd, name, 0); err != nil {
			return nil, errno(t.show(r), err)
		}
		return &DeleteResult{Path: t.show(r), Removed: 1}, nil
	}
	removed := 0
	if a.Recursive {
		// A failed call changes nothing: refuse now what would stop the
		// removal half-way, before anything is gone.
		if e := t.deletable(ctx, r, dfd, name, &st); e != nil {
			return nil, e
		}
		n, err := removeContents(ctx, dfd, name)
		removed += n
		if err != nil {
			return nil, errno(t.show(r), err)
		}
	}
	if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil {
		return nil, errno(t.show(r), err)
	}
	return &DeleteResult{Path: t.show(r), Removed: removed + 1}, nil
}

// deletable checks, before a recursive delete of directory r (name in
// dfd, with st) removes anything, what would stop it half-way: a live
// mount's root at r or anywhere beneath it (its prefix cannot be removed:
// EBUSY, after its host directory had been emptied), and a read-only
// directory (EROFS), probed with a chmod to r's own mode. Mounts are told
// apart by the tag in bits 48-63 of their inode numbers.
func (t *FS) deletable(ctx context.Context, r string, dfd int, name string, st *unix.Stat_t) *Error {
	var pst unix.Stat_t
	if err := unix.Fstat(dfd, &pst); err != nil {
		return errno(t.show(r), err)
	}
	tag := func(ino uint64) uint64 { return ino >> 48 }
	busy := func(p string) *Error {
		return &Error{Code: "EBUSY", Message: fmt.Sprintf("%s is a live mount's root; a recursive delete would empty it and then fail there, so nothing was removed", t.show(p)), Path: t.show(r)}
	}
	if tag(st.Ino) != tag(pst.Ino) {
		return busy(r)
	}
	if err := unix.Fchmodat(dfd, name, st.Mode&0o7777, 0); err != nil {
		return errno(t.show(r), err)
	}
	var found *Error
	if e := t.walk(ctx, r, 0, nil, func(sub string, _ int, _ string, cst *unix.Stat_t) bool {
		if tag(cst.Ino) != tag(st.Ino) {
			found = busy(path.Join(r, sub))
			return false
		}
		return true
	}); e != nil {
		return e
	}
	if ctx.Err() != nil {
		return timedOut(ctx)
	}
	return found
}

// removeContents empties directory name under dfd, never following a
// symlink.
func removeContents(ctx context.Context, dfd int, name string) (int, error) {
	fd, err := openBeneath(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	removed := 0
	for {
		names, err := f.Readdirnames(1024)
		if len(names) == 0 {
			if err == io.EOF || err == nil {
				return removed, nil
			}
			return removed, err
		}
		for _, n := range names {
			if err := ctx.Err(); err != nil {
				return removed, err
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				k, err := removeContents(ctx, fd, n)
				removed += k
				if err != nil {
					return removed, err
				}
				err = unix.Unlinkat(fd, n, unix.AT_REMOVEDIR)
				if err != nil {
					return removed, err
				}
			} else if err := unix.Unlinkat(fd, n, 0); err != nil {
				return removed, err
			}
			removed++
		}
	}
}

// --- grep ---
