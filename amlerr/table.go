package amlerr

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"syscall"

	"golang.org/x/sys/unix"
)

// Row is one line of the error table: a code word and what it becomes on
// each interface amlfs answers on. A file system call returns Errno, the
// control API answers HTTP, and the command line exits with Exit. A tool
// call's error code is the code word itself.
type Row struct {
	Code  string
	Errno syscall.Errno
	HTTP  int
	Exit  int
}

// Codes of the file tools' errors that are not an errno.
const (
	PathEscapes   = "PATH_ESCAPES_MOUNT"
	InvalidArg    = "INVALID_ARGUMENT"
	NoMatch       = "NO_MATCH"
	ManyMatches   = "MULTIPLE_MATCHES"
	TooLarge      = "TOO_LARGE"
	UnknownTool   = "UNKNOWN_TOOL"
	NotRegular    = "NOT_A_REGULAR_FILE"
	Timeout       = "TIMEOUT"
	StoreOffline  = "STORE_UNREACHABLE"
	DaemonStopped = "DAEMON_STOPPING"
)

// table is every code amlfs answers with. An errno not listed here is its
// own name, EIO's row otherwise.
var table = map[string]Row{
	// AML's words and amlfs's.
	WorkspaceConflict:  {WorkspaceConflict, syscall.EBUSY, http.StatusConflict, ExitConflict},
	InvalidConfig:      {InvalidConfig, syscall.EINVAL, http.StatusBadRequest, ExitUsage},
	SaveFailed:         {SaveFailed, syscall.EIO, http.StatusInternalServerError, ExitSave},
	PublishConflict:    {PublishConflict, syscall.EIO, http.StatusConflict, ExitConflict},
	RevisionIDConflict: {RevisionIDConflict, syscall.EEXIST, http.StatusConflict, ExitRevisionID},
	InvalidStore:       {InvalidStore, syscall.EIO, http.StatusInternalServerError, ExitOther},
	RevisionNotFound:   {RevisionNotFound, syscall.ENOENT, http.StatusNotFound, ExitOther},
	LimitExceeded:      {LimitExceeded, syscall.EFBIG, http.StatusInternalServerError, ExitOther},
	UnsupportedEntry:   {UnsupportedEntry, syscall.EIO, http.StatusInternalServerError, ExitOther},
	LockLost:           {LockLost, syscall.EIO, http.StatusInternalServerError, ExitOther},
	UnsafeStore:        {UnsafeStore, syscall.EIO, http.StatusInternalServerError, ExitOther},
	BaseRevisionGone:   {BaseRevisionGone, syscall.EIO, http.StatusInternalServerError, ExitOther},
	StoreOffline:       {StoreOffline, syscall.EIO, http.StatusBadGateway, ExitOther},
	DaemonStopped:      {DaemonStopped, syscall.EIO, http.StatusServiceUnavailable, ExitOther},
	// The file tools'.
	PathEscapes: {PathEscapes, syscall.EXDEV, http.StatusBadRequest, ExitOther},
	InvalidArg:  {InvalidArg, syscall.EINVAL, http.StatusBadRequest, ExitOther},
	NoMatch:     {NoMatch, syscall.ENOENT, http.StatusBadRequest, ExitOther},
	ManyMatches: {ManyMatches, syscall.EINVAL, http.StatusBadRequest, ExitOther},
	TooLarge:    {TooLarge, syscall.EFBIG, http.StatusBadRequest, ExitOther},
	UnknownTool: {UnknownTool, syscall.ENOSYS, http.StatusNotFound, ExitOther},
	NotRegular:  {NotRegular, syscall.EINVAL, http.StatusBadRequest, ExitOther},
	Timeout:     {Timeout, syscall.ETIMEDOUT, http.StatusInternalServerError, ExitOther},
	// Errnos whose status is not 500.
	"ENOENT":       {"ENOENT", syscall.ENOENT, http.StatusNotFound, ExitOther},
	"EISDIR":       {"EISDIR", syscall.EISDIR, http.StatusBadRequest, ExitOther},
	"ENOTDIR":      {"ENOTDIR", syscall.ENOTDIR, http.StatusBadRequest, ExitOther},
	"EINVAL":       {"EINVAL", syscall.EINVAL, http.StatusBadRequest, ExitOther},
	"ENAMETOOLONG": {"ENAMETOOLONG", syscall.ENAMETOOLONG, http.StatusBadRequest, ExitOther},
	"EXDEV":        {"EXDEV", syscall.EXDEV, http.StatusBadRequest, ExitOther},
	"EROFS":        {"EROFS", syscall.EROFS, http.StatusForbidden, ExitOther},
	"EACCES":       {"EACCES", syscall.EACCES, http.StatusForbidden, ExitOther},
	"EPERM":        {"EPERM", syscall.EPERM, http.StatusForbidden, ExitOther},
	"EEXIST":       {"EEXIST", syscall.EEXIST, http.StatusConflict, ExitOther},
	"ENOTEMPTY":    {"ENOTEMPTY", syscall.ENOTEMPTY, http.StatusConflict, ExitOther},
	"EBUSY":        {"EBUSY", syscall.EBUSY, http.StatusConflict, ExitOther},
}

// eio is the row of an error nothing else classifies.
var eio = Row{"EIO", syscall.EIO, http.StatusInternalServerError, ExitOther}

// Coder is an error that names its code itself (the file tools' errors).
type Coder interface {
	error
	ErrorCode() string
}

// Lookup returns code's row; an unknown code is EIO's row under its own
// name.
func Lookup(code string) Row {
	if r, ok := table[code]; ok {
		return r
	}
	if en := errnoValue(code); en != 0 {
		return Row{code, en, http.StatusInternalServerError, ExitOther}
	}
	r := eio
	r.Code = code
	return r
}

// Classify returns err's row: by the first code in its chain (an
// *Error's or a Coder's), else by the errno or standard error it wraps.
// known is false for an error nothing classifies, which is EIO's row.
func Classify(err error) (r Row, known bool) {
	if err == nil {
		return Row{}, true
	}
	if code := firstCode(err); code != "" {
		return Lookup(code), true
	}
	var en syscall.Errno
	switch {
	case errors.As(err, &en):
		return Lookup(unix.ErrnoName(en)), true
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Lookup("EINTR"), true
	case errors.Is(err, fs.ErrNotExist):
		return Lookup("ENOENT"), true
	case errors.Is(err, fs.ErrExist):
		return Lookup("EEXIST"), true
	case errors.Is(err, fs.ErrPermission):
		return Lookup("EACCES"), true
	case errors.Is(err, errors.ErrUnsupported):
		return Lookup("ENOTSUP"), true
	}
	return eio, false
}

// firstCode is the code of the first *Error or Coder in err's chain
// (depth first, as errors.As looks), or "".
func firstCode(err error) string {
	switch x := err.(type) {
	case nil:
		return ""
	case *Error:
		return x.Code
	case Coder:
		return x.ErrorCode()
	case interface{ Unwrap() error }:
		return firstCode(x.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range x.Unwrap() {
			if c := firstCode(e); c != "" {
				return c
			}
		}
	}
	return ""
}

// Errno is what a file system call returns for err: the errno it wraps,
// if any (a system call's own answer), else its row's.
func Errno(err error) syscall.Errno {
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	r, _ := Classify(err)
	return r.Errno
}

// HTTPStatus is the control API's status for err: that of the code that
// decides its exit status, if any, else its row's.
func HTTPStatus(err error) int {
	if err == nil {
		return http.StatusOK
	}
	for _, code := range exitOrder {
		if Has(err, code) {
			return table[code].HTTP
		}
	}
	r, _ := Classify(err)
	return r.HTTP
}

// exitOrder is which code decides the exit status when an error's chain
// carries several.
var exitOrder = []string{InvalidConfig, WorkspaceConflict, PublishConflict, RevisionIDConflict, SaveFailed}

// ExitStatus maps err to the documented process exit status.
func ExitStatus(err error) int {
	if err == nil {
		return ExitOK
	}
	for _, code := range exitOrder {
		if Has(err, code) {
			return table[code].Exit
		}
	}
	return ExitOther
}

// Body is an error as every API answers it: the control API as
// {"error": Body}, a tool call's result, and `amlfs tool`.
type Body struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	Path     string `json:"path,omitempty"`
	ExitCode int    `json:"exitCode,omitempty"`
}

// Bodied is an error that renders its own Body (with a path, say).
type Bodied interface {
	error
	Body() Body
}

// BodyOf renders err.
func BodyOf(err error) Body {
	var b Bodied
	if errors.As(err, &b) {
		body := b.Body()
		body.ExitCode = ExitStatus(err)
		return body
	}
	r, _ := Classify(err)
	return Body{Code: r.Code, Message: err.Error(), ExitCode: ExitStatus(err)}
}

// Envelope is the one JSON shape of an error: {"error": Body}.
type Envelope struct {
	Error Body `json:"error"`
}

// Err rebuilds the error a Body describes, as it crosses a process
// boundary.
func (b Body) Err() error {
	return FromMessage(b.Code, b.Message)
}

// errnoValue is the errno named name, or 0.
func errnoValue(name string) syscall.Errno {
	for en := syscall.Errno(1); en < 256; en++ {
		if unix.ErrnoName(en) == name {
			return en
		}
	}
	return 0
}
