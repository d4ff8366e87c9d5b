// Package amlerr holds the error codes amlfs shares with AML and the exit
// status each maps to. It is the bottom of the dependency graph: every other
// package may wrap its errors in an *Error, and only cmd/amlfs turns them into
// exit codes.
package amlerr

import (
	"errors"
	"fmt"
	"strings"
)

// Codes. The first two are AML's own words; the rest are amlfs's.
const (
	// WorkspaceConflict: another writer holds the workspace lease.
	WorkspaceConflict = "AML_WORKSPACE_CONFLICT"
	// InvalidConfig: bad flags, mount specs or config.
	InvalidConfig = "INVALID_CONFIG"
	// SaveFailed: snapshot, upload or publication failed; the previous
	// revision is still current.
	SaveFailed = "SAVE_FAILED"
	// PublishConflict: the index changed since it was loaded (a stale writer).
	// It is a kind of save failure and exits like one.
	PublishConflict = "AML_PUBLISH_CONFLICT"
	// RevisionIDConflict: a caller-chosen revision id exists with other content.
	RevisionIDConflict = "REVISION_ID_CONFLICT"
	// InvalidStore: the durable store holds something malformed or missing.
	InvalidStore = "INVALID_STORE"
	// RevisionNotFound: the revision asked for (--load, --from) is not in
	// the workspace's index, or the workspace has none yet.
	RevisionNotFound = "REVISION_NOT_FOUND"
	// LimitExceeded: a tree or artifact exceeds the configured limits.
	LimitExceeded = "LIMIT_EXCEEDED"
	// UnsupportedEntry: a symlink or special file is in the save selection.
	UnsupportedEntry = "UNSUPPORTED_ENTRY"
	// LockLost: the lease was lost while the daemon believed it held it.
	LockLost = "AML_LOCK_LOST"
	// UnsafeStore: the store ignores conditional writes.
	UnsafeStore = "UNSAFE_STORE"
	// BaseRevisionGone: a lazily restored file's bytes are gone from the
	// store (another writer pruned its revision) before it was fetched.
	BaseRevisionGone = "BASE_REVISION_GONE"
)

// Error is an error with a stable code word and the subject at fault (a path,
// a workspace id or a revision id).
type Error struct {
	Code    string
	Subject string
	Err     error
}

func (e *Error) Error() string {
	msg := e.Code
	if e.Subject != "" {
		msg += " " + e.Subject
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// New returns an *Error with a formatted cause.
func New(code, subject, format string, args ...any) *Error {
	return &Error{Code: code, Subject: subject, Err: fmt.Errorf(format, args...)}
}

// Wrap attaches a code to err. A nil err stays nil.
func Wrap(code, subject string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Code: code, Subject: subject, Err: err}
}

// FromMessage rebuilds a coded error from its rendered message (as it
// crosses a process boundary), without repeating the code word.
func FromMessage(code, msg string) error {
	if code == "" {
		return errors.New(msg)
	}
	msg = strings.TrimPrefix(strings.TrimPrefix(msg, code), " ")
	return &Error{Code: code, Err: errors.New(msg)}
}

// Code returns the outermost code in err's chain, or "".
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Has reports whether any error in err's chain carries code.
func Has(err error, code string) bool {
	for err != nil {
		var e *Error
		if !errors.As(err, &e) {
			return false
		}
		if e.Code == code {
			return true
		}
		err = e.Err
	}
	return false
}

// Exit statuses from the command-line contract.
const (
	ExitOK         = 0
	ExitOther      = 1
	ExitUsage      = 2
	ExitConflict   = 3
	ExitSave       = 4
	ExitRevisionID = 5
)
