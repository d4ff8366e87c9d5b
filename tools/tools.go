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
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"

	"github.com/amlfs/amlfs/amlerr"
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
	// direct, if set, is the tree the mount serves, on which calls run
	// when it serves their paths as the mount would (ServeDirect).
	direct Direct
	// call is set on the copy of FS that runs one call on the tree.
	call *treeCall
	life *lifecycle
}

// lifecycle is what every call of an FS shares: mu is held (read) through
// every call; Close takes it to wait for the calls under way.
type lifecycle struct {
	mu     sync.RWMutex
	closed bool // GUARDED_BY(mu)
}

// New serves the tree at the path root, opened again for every call,
// which the sandbox sees at sandbox (the same path, if empty).
func New(root, sandbox string) *FS {
	if sandbox == "" {
		sandbox = root
	}
	return &FS{root: root, prefix: path.Clean("/" + sandbox), life: &lifecycle{}}
}

// NewOn serves the tree beneath the root openRoot opens for each call (a
// mount's root, reached through descriptors held since the mount and
// checked by mount id): no path is resolved, so renaming or replacing a
// parent of the mountpoint cannot turn a call onto another tree. The
// sandbox sees the tree at sandbox.
func NewOn(openRoot func() (*os.File, error), sandbox string) *FS {
	return &FS{openRoot: openRoot, prefix: path.Clean("/" + sandbox), life: &lifecycle{}}
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
	t.life.mu.Lock()
	defer t.life.mu.Unlock()
	t.life.closed = true
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
	if t.life.closed {
		return -1, &Error{Code: "ESHUTDOWN", Message: "the daemon is stopping", Path: t.show(r)}
	}
	if t.call != nil {
		return t.call.open(r, flags, mode)
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
	return openat2(dirFD, r, flags, mode, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_MAGICLINKS)
}

// openat2 opens r beneath dirFD with resolve, again while interrupted.
func openat2(dirFD int, r string, flags int, mode uint32, resolve uint64) (int, error) {
	for {
		fd, err := unix.Openat2(dirFD, r, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve})
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
	if t.call != nil && !t.call.entry(path.Clean(dir), name) {
		return -1, "", errViaMount
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

// Call runs tool name with its JSON arguments: on the tree itself when a
// Direct tree serves every path the call resolves as the mount would,
// else through the mount.
func (t *FS) Call(ctx context.Context, name string, args json.RawMessage) (any, error) {
	t.life.mu.RLock()
	defer t.life.mu.RUnlock()
	if t.direct != nil {
		if out, err, done := t.onTree(ctx, name, args); done {
			return out, err
		}
	}
	return t.dispatch(ctx, name, args)
}

// dispatch runs tool name on t's tree.
func (t *FS) dispatch(ctx context.Context, name string, args json.RawMessage) (any, error) {
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
