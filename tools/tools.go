// Package tools is amlfs's file-tool API: the operations an agent calls
// (read_file, write_file, edit_file, list_files, delete, file_stat, mkdir,
// grep), with the semantics of Mastra's workspace file tools.
//
// Every operation works through the mounted file system itself: paths
// are resolved with openat2(RESOLVE_BENEATH) from a descriptor of the
// mount's root, and every change is a system call on the mount. So a tool
// call sees exactly what the shell sees, the workspace and every live
// mount, and the kernel's caches of what a tool changes are updated by
// the kernel as the change is made: there is no second path to the files
// that could leave a stale size, entry or page behind. A ".." or symlink
// that would leave the mount fails with PATH_ESCAPES_MOUNT, and every
// other failure carries the errno the mount gave (ENOENT, EROFS, ...).
package tools

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"regexp/syntax"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/bmatcuk/doublestar/v4"
	"golang.org/x/sys/unix"
)

// Limits on what one call returns.
const (
	MaxReadBytes = 10 << 20 // read_file, edit_file, and files grep searches
	// MaxArgsBytes bounds a call's JSON arguments: a write_file of
	// MaxReadBytes as base64, with room to spare.
	MaxArgsBytes   = 2 * MaxReadBytes
	MaxListEntries = 10000
	MaxGrepResults = 10000
	DefaultResults = 100
	// MaxGrepLine bounds the bytes of one line grep matches against: RE2
	// is linear in the input, but a line of megabytes against a pattern
	// of many states still takes minutes, and a line is the unit at which
	// a call's deadline is checked. A pattern of many instructions gets
	// fewer bytes (grepLineCap), down to MinGrepLine, so that one line's
	// match costs about the same whatever the pattern.
	MaxGrepLine = 64 << 10
	MinGrepLine = 4 << 10
	// grepLineWork is the bytes × program instructions one line's match
	// may cost: about 50 ms of RE2's NFA here.
	grepLineWork = 8 << 20
)

// Error is a failed call: a code (an errno name such as ENOENT, or one of
// the codes below) and a message.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Path    string `json:"path,omitempty"`
}

// Codes of errors that are not an errno, from the one error table.
const (
	CodeEscape     = amlerr.PathEscapes
	CodeInvalid    = amlerr.InvalidArg
	CodeNoMatch    = amlerr.NoMatch
	CodeManyMatch  = amlerr.ManyMatches
	CodeTooLarge   = amlerr.TooLarge
	CodeUnknown    = amlerr.UnknownTool
	CodeNotRegular = amlerr.NotRegular
	CodeTimeout    = amlerr.Timeout
)

// ErrorCode is e's code word (amlerr.Coder).
func (e *Error) ErrorCode() string { return e.Code }

// Body is e as every API answers it (amlerr.Bodied).
func (e *Error) Body() amlerr.Body {
	return amlerr.Body{Code: e.Code, Message: e.Message, Path: e.Path}
}

// timedOut is the error of a call that ran past its deadline, or whose
// client went away.
func timedOut(ctx context.Context) *Error {
	return &Error{Code: CodeTimeout, Message: fmt.Sprintf("the call was stopped: %v (the daemon's --tool-timeout, or the client went away)", context.Cause(ctx))}
}

func (e *Error) Error() string {
	if e.Path != "" {
		return fmt.Sprintf("%s: %s: %s", e.Code, e.Path, e.Message)
	}
	return e.Code + ": " + e.Message
}

func invalid(format string, args ...any) *Error {
	return &Error{Code: CodeInvalid, Message: fmt.Sprintf(format, args...)}
}

// errno wraps a system call's error for p.
func errno(p string, err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return &Error{Code: unix.ErrnoName(en), Message: en.Error(), Path: p}
	}
	r, _ := amlerr.Classify(err)
	return &Error{Code: r.Code, Message: err.Error(), Path: p}
}

// FS runs tool calls against the tree under a directory (the mount's
// root).
type FS struct {
	root   string // the root's path, if no descriptor is held
	prefix string // where the sandbox sees root: paths in calls and results
	// openRoot, if set, opens the root for a call (NewOn).
	openRoot func() (*os.File, error)
	// owner, if set, owns what the tools make (SetOwner); otherwise a
	// new file or directory takes its parent directory's owner.
	owner *[2]int
	// mu is held (read) through every call; Close takes it to wait for
	// the calls under way.
	mu     sync.RWMutex
	closed bool // GUARDED_BY(mu)
}

// New serves the tree at the path root, opened again for every call,
// which the sandbox sees at sandbox (the same path, if empty).
func New(root, sandbox string) *FS {
	if sandbox == "" {
		sandbox = root
	}
	return &FS{root: root, prefix: path.Clean("/" + sandbox)}
}

// NewOn serves the tree beneath the root openRoot opens for each call (a
// mount's root, reached through descriptors held since the mount and
// checked by mount id): no path is resolved, so renaming or replacing a
// parent of the mountpoint cannot turn a call onto another tree. The
// sandbox sees the tree at sandbox.
func NewOn(openRoot func() (*os.File, error), sandbox string) *FS {
	return &FS{openRoot: openRoot, prefix: path.Clean("/" + sandbox)}
}

// SetOwner makes uid and gid (the sandbox's user) own every file and
// directory the tools make. Without it, a new one takes the owner and
// group of the directory it is made in. A rewritten file keeps its own
// owner, group and mode either way. Owners are set only when the daemon
// runs as root: otherwise what it makes is its user's, as for any
// process.
func (t *FS) SetOwner(uid, gid int) { t.owner = &[2]int{uid, gid} }

// ownerFor is who owns a new entry of the directory open as dfd.
func (t *FS) ownerFor(dfd int) (int, int, bool) {
	if os.Geteuid() != 0 {
		return 0, 0, false
	}
	if t.owner != nil {
		return t.owner[0], t.owner[1], true
	}
	var st unix.Stat_t
	if unix.Fstat(dfd, &st) != nil {
		return 0, 0, false
	}
	return int(st.Uid), int(st.Gid), true
}

// Close waits for the calls under way (their descriptors would hold the
// mount busy); later calls fail with ESHUTDOWN.
func (t *FS) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
}

// rel turns a tool path into a path relative to the root ("." for the
// root). A path is what the sandbox's shell would use: absolute under the
// mount's sandbox path (/workspace/a/b), or relative to the mount root
// (a/b). An absolute path anywhere else leaves the mount. Escapes by ..
// or symlinks are left for openat2 to refuse.
func (t *FS) rel(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", invalid("path contains a NUL byte")
	}
	if strings.HasPrefix(p, "/") {
		c := path.Clean(p)
		switch {
		case c == t.prefix:
			return ".", nil
		case t.prefix == "/":
			p = strings.TrimPrefix(c, "/")
		case strings.HasPrefix(c, t.prefix+"/"):
			p = strings.TrimPrefix(c, t.prefix+"/")
		default:
			return "", &Error{Code: CodeEscape, Message: fmt.Sprintf("an absolute path must be under the mount, %s (or give a path relative to it)", t.prefix), Path: p}
		}
	}
	if p == "" {
		return ".", nil
	}
	return p, nil
}

// show is how a path appears in results: absolute, as the sandbox's shell
// sees it.
func (t *FS) show(r string) string {
	if r == "." || r == "" {
		return t.prefix
	}
	return path.Join(t.prefix, path.Clean(r))
}

// open resolves r beneath the root with openat2.
func (t *FS) open(r string, flags int, mode uint32) (int, *Error) {
	if t.closed {
		return -1, &Error{Code: "ESHUTDOWN", Message: "the daemon is stopping", Path: t.show(r)}
	}
	var rootFD int
	if t.openRoot != nil {
		root, err := t.openRoot()
		if err != nil {
			return -1, &Error{Code: "ENODEV", Message: err.Error(), Path: t.show(r)}
		}
		defer root.Close()
		rootFD = int(root.Fd())
	} else {
		var err error
		if rootFD, err = unix.Open(t.root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return -1, errno(t.show(r), err)
		}
		defer unix.Close(rootFD)
	}
	fd, err := openBeneath(rootFD, r, flags, mode)
	if err != nil {
		return -1, t.resolveErr(r, err)
	}
	return fd, nil
}

func openBeneath(dirFD int, r string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat2(dirFD, r, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// resolveErr maps openat2's refusal to leave the root.
func (t *FS) resolveErr(r string, err error) *Error {
	if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) && strings.Contains(r, "..") {
		return &Error{Code: CodeEscape, Message: "the path leaves the mount (a .. or a symlink pointing outside)", Path: t.show(r)}
	}
	return errno(t.show(r), err)
}

// regular checks that fd, opened with O_NONBLOCK so that a fifo could not
// hang the open, is a regular file, and makes it blocking again.
func (t *FS) regular(fd int, r string) *Error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return errno(t.show(r), err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return errno(t.show(r), syscall.EISDIR)
	default:
		return &Error{Code: CodeNotRegular, Message: "not a regular file (a fifo, socket or device): tools read and write regular files only", Path: t.show(r)}
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		return errno(t.show(r), err)
	}
	return nil
}

// parent opens the directory holding r and returns it with r's last name.
func (t *FS) parent(r string) (int, string, *Error) {
	dir, name := path.Split(r)
	if name == "" || name == "." || name == ".." {
		return -1, "", &Error{Code: CodeInvalid, Message: "the path must name an entry, not the mount root or ..", Path: t.show(r)}
	}
	if dir == "" {
		dir = "."
	}
	fd, e := t.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	return fd, name, e
}

// Tool describes one operation for clients (the MCP server).
type Tool struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	InputSchema map[string]any `json:"inputSchema"`
}

// Hints are a tool's annotations, as MCP's: readOnly changes nothing;
// destructive may replace or remove what is there; idempotent has no
// further effect when repeated with the same arguments.
func Hints(name string) (readOnly, destructive, idempotent bool) {
	h := map[string][3]bool{
		"read_file": {true, false, true}, "list_files": {true, false, true}, "file_stat": {true, false, true}, "grep": {true, false, true},
		"write_file": {false, true, true}, "edit_file": {false, true, false}, "delete": {false, true, true}, "mkdir": {false, false, true},
	}[name]
	return h[0], h[1], h[2]
}

func obj(required []string, props map[string]any) map[string]any {
	return map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": false}
}

func prop(typ, desc string) map[string]any { return map[string]any{"type": typ, "description": desc} }

const pathDesc = "a path as the sandbox's shell sees it: absolute under the mount (such as /workspace/a/b.txt), or relative to the mount root (a/b.txt); results give absolute paths"

// Tools lists the operations, with their JSON schemas.
var Tools = []Tool{
	{"read_file", "Read a file. Text comes back as is, binary as base64. offset (1-based first line) and limit (lines) page through large text files.",
		obj([]string{"path"}, map[string]any{"path": prop("string", pathDesc), "offset": prop("integer", "first line to return, from 1"), "limit": prop("integer", "most lines to return")})},
	{"write_file", "Create or replace a file atomically, making missing parent directories. With overwrite false, an existing file is an error (EEXIST).",
		obj([]string{"path", "content"}, map[string]any{"path": prop("string", pathDesc), "content": prop("string", "the new contents"),
			"overwrite": prop("boolean", "replace an existing file (default true)"), "encoding": prop("string", "utf-8 (default) or base64")})},
	{"edit_file", "Replace old_text with new_text in a file. old_text must occur exactly once.",
		obj([]string{"path", "old_text", "new_text"}, map[string]any{"path": prop("string", pathDesc), "old_text": prop("string", "text to find, exactly once"), "new_text": prop("string", "its replacement")})},
	{"list_files", "List a directory's files and directories, to depth levels (default 1; 0 for all), optionally only paths matching a glob pattern (** allowed).",
		obj([]string{"path"}, map[string]any{"path": prop("string", pathDesc), "pattern": prop("string", "glob on the path below path, like **/*.go"), "depth": prop("integer", "levels to descend (default 1, 0 for no limit)")})},
	{"delete", "Delete a file, symlink or empty directory; with recursive, a directory and everything in it.",
		obj([]string{"path"}, map[string]any{"path": prop("string", pathDesc), "recursive": prop("boolean", "delete a directory's contents too")})},
	{"file_stat", "Type, size, mode and modification time of a path (a symlink is described, not followed).",
		obj([]string{"path"}, map[string]any{"path": prop("string", pathDesc)})},
	{"mkdir", "Create a directory and any missing parents. An existing directory is not an error.",
		obj([]string{"path"}, map[string]any{"path": prop("string", pathDesc)})},
	{"grep", "Search file contents with a regular expression (RE2 syntax), under path (default the root), in files matching glob. Binary files and .git directories are skipped.",
		obj([]string{"pattern"}, map[string]any{"pattern": prop("string", "regular expression"), "path": prop("string", pathDesc), "glob": prop("string", "glob on the path below path, like **/*.go"),
			"max_results": prop("integer", "most matching lines to return (default 100)")})},
}

// Mutates reports whether tool name may change the tree.
func Mutates(name string) bool {
	switch name {
	case "write_file", "edit_file", "delete", "mkdir":
		return true
	}
	return false
}

// Call runs tool name with its JSON arguments.
func (t *FS) Call(ctx context.Context, name string, args json.RawMessage) (any, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	switch name {
	case "read_file":
		return run(args, t.ReadFile)
	case "write_file":
		return run(args, t.WriteFile)
	case "edit_file":
		return run(args, t.EditFile)
	case "list_files":
		return run(args, func(a ListArgs) (*ListResult, error) { return t.ListFiles(ctx, a) })
	case "delete":
		return run(args, func(a DeleteArgs) (*DeleteResult, error) { return t.Delete(ctx, a) })
	case "file_stat":
		return run(args, t.Stat)
	case "mkdir":
		return run(args, t.Mkdir)
	case "grep":
		return run(args, func(a GrepArgs) (*GrepResult, error) { return t.Grep(ctx, a) })
	}
	return nil, &Error{Code: CodeUnknown, Message: fmt.Sprintf("no tool %q", name)}
}

// run decodes a tool's arguments and calls it.
func run[A, R any](args json.RawMessage, tool func(A) (R, error)) (any, error) {
	var a A
	if err := decode(args, &a); err != nil {
		return nil, err
	}
	out, err := tool(a)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// decode parses arguments strictly: unknown fields and trailing data are
// errors.
func decode(data json.RawMessage, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("malformed arguments: %v", err)
	}
	if dec.More() {
		return invalid("malformed arguments: trailing data")
	}
	return nil
}

// PathArgs are the arguments of file_stat and mkdir.
type PathArgs struct {
	Path *string `json:"path"`
}

func (t *FS) need(p *string) (string, *Error) {
	if p == nil {
		return "", invalid("path is required")
	}
	r, err := t.rel(*p)
	if err != nil {
		return "", err.(*Error)
	}
	return r, nil
}

// --- read_file ---

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
			return nil, errno("/", err)
		}
		en := entry("/", fd, "", &st)
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
		return search(t.show(path.Join(r, sub)), fd)
	})
	if stopped || ctx.Err() != nil {
		return nil, timedOut(ctx)
	}
	if werr != nil {
		return nil, werr
	}
	return res, nil
}
