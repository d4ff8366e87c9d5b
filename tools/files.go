package tools

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// ReadArgs are read_file's arguments.
type ReadArgs struct {
	Path   *string `json:"path"`
	Offset int     `json:"offset,omitempty"`
	Limit  int     `json:"limit,omitempty"`
}

// ReadResult is read_file's answer.
type ReadResult struct {
	Path       string `json:"path"`
	Content    string `json:"content"`
	Encoding   string `json:"encoding"` // utf-8 or base64
	Size       int64  `json:"size"`
	TotalLines int    `json:"totalLines,omitempty"`
	StartLine  int    `json:"startLine,omitempty"`
	Lines      int    `json:"lines,omitempty"`
	Truncated  bool   `json:"truncated"`
}

// readAll reads a regular file whole, refusing one over MaxReadBytes.
func (t *FS) readAll(r string) ([]byte, *Error) {
	// O_NONBLOCK: opening a fifo must not wait for a writer. It is
	// cleared once the file is known to be regular.
	fd, e := t.open(r, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if e != nil {
		return nil, e
	}
	f := os.NewFile(uintptr(fd), r)
	defer f.Close()
	if e := t.regular(fd, r); e != nil {
		return nil, e
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, errno(t.show(r), err)
	}
	if fi.IsDir() {
		return nil, errno(t.show(r), syscall.EISDIR)
	}
	if !fi.Mode().IsRegular() {
		return nil, &Error{Code: CodeNotRegular, Message: "not a regular file", Path: t.show(r)}
	}
	if fi.Size() > MaxReadBytes {
		return nil, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("%d bytes; the limit is %d", fi.Size(), MaxReadBytes), Path: t.show(r)}
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxReadBytes+1))
	if err != nil {
		return nil, errno(t.show(r), err)
	}
	if len(data) > MaxReadBytes {
		return nil, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("over the %d-byte limit", MaxReadBytes), Path: t.show(r)}
	}
	return data, nil
}

// isText reports whether data reads as text: valid UTF-8 without NUL.
func isText(data []byte) bool {
	return utf8.Valid(data) && bytes.IndexByte(data, 0) < 0
}

// ReadFile reads a file.
func (t *FS) ReadFile(a ReadArgs) (*ReadResult, error) {
	r, e := t.need(a.Path)
	if e != nil {
		return nil, e
	}
	if a.Offset < 0 || a.Limit < 0 {
		return nil, invalid("offset and limit must not be negative")
	}
	data, e := t.readAll(r)
	if e != nil {
		return nil, e
	}
	res := &ReadResult{Path: t.show(r), Size: int64(len(data))}
	if !isText(data) {
		res.Encoding, res.Content = "base64", base64.StdEncoding.EncodeToString(data)
		return res, nil
	}
	res.Encoding = "utf-8"
	lines := strings.SplitAfter(string(data), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	res.TotalLines = len(lines)
	start := max(a.Offset, 1)
	if start > len(lines) && len(lines) > 0 {
		return nil, invalid("offset %d is past the last line (%d)", a.Offset, len(lines))
	}
	end := len(lines)
	if a.Limit > 0 {
		end = min(end, start-1+a.Limit)
	}
	if len(lines) > 0 {
		res.Content = strings.Join(lines[start-1:end], "")
		res.StartLine, res.Lines = start, end-start+1
		res.Truncated = start > 1 || end < len(lines)
	}
	return res, nil
}

// --- write_file ---

// WriteArgs are write_file's arguments.
type WriteArgs struct {
	Path      *string `json:"path"`
	Content   *string `json:"content"`
	Overwrite *bool   `json:"overwrite,omitempty"`
	Encoding  string  `json:"encoding,omitempty"`
}

// WriteResult answers write_file and edit_file.
type WriteResult struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	Created bool   `json:"created,omitempty"`
}

// WriteFile replaces a file atomically: the bytes go to a temporary file
// in the same directory, which is renamed over the path (with
// RENAME_NOREPLACE when overwrite is false).
func (t *FS) WriteFile(a WriteArgs) (*WriteResult, error) {
	r, e := t.need(a.Path)
	if e != nil {
		return nil, e
	}
	if a.Content == nil {
		return nil, invalid("content is required")
	}
	data := []byte(*a.Content)
	switch a.Encoding {
	case "", "utf-8", "utf8":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(*a.Content); err != nil {
			return nil, invalid("content is not base64: %v", err)
		}
	default:
		return nil, invalid("encoding must be utf-8 or base64")
	}
	overwrite := a.Overwrite == nil || *a.Overwrite
	if dir := path.Dir(r); dir != "." {
		if _, err := t.Mkdir(PathArgs{Path: &dir}); err != nil {
			return nil, err
		}
	}
	dfd, name, e := t.parent(r)
	if e != nil {
		return nil, e
	}
	defer unix.Close(dfd)
	mode := uint32(0o644)
	created := true
	uid, gid, chown := t.ownerFor(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		created = false
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return nil, errno(t.show(r), syscall.EISDIR)
		}
		if !overwrite {
			return nil, errno(t.show(r), syscall.EEXIST)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			// A rewrite keeps the file's owner, group and mode.
			mode = st.Mode & 0o7777
			uid, gid = int(st.Uid), int(st.Gid)
		}
	}
	if !chown {
		uid, gid = -1, -1
	}
	tmp, err := writeTemp(dfd, name, data, mode, uid, gid)
	if err != nil {
		return nil, errno(t.show(r), err)
	}
	flags := uint(0)
	if !overwrite {
		flags = unix.RENAME_NOREPLACE
	}
	if err := unix.Renameat2(dfd, tmp, dfd, name, flags); err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return nil, errno(t.show(r), err)
	}
	return &WriteResult{Path: t.show(r), Size: int64(len(data)), Created: created}, nil
}

// writeTemp writes data to a new hidden file beside name, of mode, owned
// by uid and gid (-1: as made).
func writeTemp(dfd int, name string, data []byte, mode uint32, uid, gid int) (string, error) {
	for i := 0; ; i++ {
		tmp := fmt.Sprintf(".%s.amlfs-tool-%d-%d", truncName(name), os.Getpid(), time.Now().UnixNano()+int64(i))
		fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, mode)
		if err == unix.EEXIST && i < 10 {
			continue
		}
		if err != nil {
			return "", err
		}
		f := os.NewFile(uintptr(fd), tmp)
		_, werr := f.Write(data)
		if werr == nil && (uid >= 0 || gid >= 0) {
			werr = unix.Fchown(fd, uid, gid)
		}
		if werr == nil {
			// After the chown, which clears setuid and setgid; the
			// create's mode was cut by the umask too.
			werr = unix.Fchmod(fd, mode&0o7777)
		}
		cerr := f.Close()
		if werr == nil {
			werr = cerr
		}
		if werr != nil {
			unix.Unlinkat(dfd, tmp, 0)
			return "", werr
		}
		return tmp, nil
	}
}

func truncName(name string) string {
	if len(name) > 100 {
		return name[:100]
	}
	return name
}

// --- edit_file ---

// EditArgs are edit_file's arguments.
type EditArgs struct {
	Path    *string `json:"path"`
	OldText *string `json:"old_text"`
	NewText *string `json:"new_text"`
}

// EditFile replaces the one occurrence of old_text. The file is rewritten
// in place, so a process that holds it open reads the new bytes next.
func (t *FS) EditFile(a EditArgs) (*WriteResult, error) {
	r, e := t.need(a.Path)
	if e != nil {
		return nil, e
	}
	if a.OldText == nil || a.NewText == nil {
		return nil, invalid("old_text and new_text are required")
	}
	if *a.OldText == "" {
		return nil, invalid("old_text must not be empty")
	}
	data, e := t.readAll(r)
	if e != nil {
		return nil, e
	}
	switch n := bytes.Count(data, []byte(*a.OldText)); n {
	case 0:
		return nil, &Error{Code: CodeNoMatch, Message: "old_text does not occur in the file; nothing was changed", Path: t.show(r)}
	case 1:
	default:
		return nil, &Error{Code: CodeManyMatch, Message: fmt.Sprintf("old_text occurs %d times; it must occur exactly once (add context); nothing was changed", n), Path: t.show(r)}
	}
	out := bytes.Replace(data, []byte(*a.OldText), []byte(*a.NewText), 1)
	fd, e := t.open(r, unix.O_WRONLY|unix.O_NONBLOCK, 0)
	if e != nil {
		return nil, e
	}
	f := os.NewFile(uintptr(fd), r)
	defer f.Close()
	if e := t.regular(fd, r); e != nil {
		return nil, e
	}
	// Write over the old bytes, then cut the rest: the file is never
	// shorter than what has been written.
	if _, err := f.WriteAt(out, 0); err != nil {
		return nil, errno(t.show(r), err)
	}
	if err := f.Truncate(int64(len(out))); err != nil {
		return nil, errno(t.show(r), err)
	}
	return &WriteResult{Path: t.show(r), Size: int64(len(out))}, nil
}

// --- list_files ---
