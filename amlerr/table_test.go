package amlerr

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"syscall"
	"testing"
)

type coded struct{ code string }

func (c coded) Error() string     { return c.code }
func (c coded) ErrorCode() string { return c.code }

func TestTable(t *testing.T) {
	for code, r := range table {
		if r.Code != code {
			t.Errorf("row %s names itself %s", code, r.Code)
		}
		if r.Errno == 0 || r.HTTP < 400 || r.Exit == ExitOK {
			t.Errorf("row %s is incomplete: %+v", code, r)
		}
	}
	cases := []struct {
		name  string
		err   error
		errno syscall.Errno
		http  int
		exit  int
		code  string
	}{
		{"nil", nil, 0, http.StatusOK, ExitOK, ""},
		{"errno", &os.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, syscall.ENOENT, http.StatusNotFound, ExitOther, "ENOENT"},
		{"errno not listed", syscall.ELOOP, syscall.ELOOP, http.StatusInternalServerError, ExitOther, "ELOOP"},
		{"fs sentinel", fmt.Errorf("x: %w", fs.ErrExist), syscall.EEXIST, http.StatusConflict, ExitOther, "EEXIST"},
		{"cancelled", context.Canceled, syscall.EINTR, http.StatusInternalServerError, ExitOther, "EINTR"},
		{"unknown", errors.New("boom"), syscall.EIO, http.StatusInternalServerError, ExitOther, "EIO"},
		{"config", New(InvalidConfig, "x", "bad"), syscall.EINVAL, http.StatusBadRequest, ExitUsage, InvalidConfig},
		{"conflict in a save failure", Wrap(SaveFailed, "w", New(PublishConflict, "w", "stale")), syscall.EIO, http.StatusConflict, ExitConflict, SaveFailed},
		{"lease", New(WorkspaceConflict, "w", "held"), syscall.EBUSY, http.StatusConflict, ExitConflict, WorkspaceConflict},
		{"revision id", New(RevisionIDConflict, "r", "taken"), syscall.EEXIST, http.StatusConflict, ExitRevisionID, RevisionIDConflict},
		{"tool code", fmt.Errorf("call: %w", coded{TooLarge}), syscall.EFBIG, http.StatusBadRequest, ExitOther, TooLarge},
		{"tool errno code", coded{"EROFS"}, syscall.EROFS, http.StatusForbidden, ExitOther, "EROFS"},
		{"unknown tool", coded{UnknownTool}, syscall.ENOSYS, http.StatusNotFound, ExitOther, UnknownTool},
		{"coded errno wins for the kernel", Wrap(InvalidStore, "k", syscall.ENOENT), syscall.ENOENT, http.StatusInternalServerError, ExitOther, InvalidStore},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Errno(tc.err); tc.err != nil && got != tc.errno {
				t.Errorf("Errno = %v, want %v", got, tc.errno)
			}
			if got := HTTPStatus(tc.err); got != tc.http {
				t.Errorf("HTTPStatus = %d, want %d", got, tc.http)
			}
			if got := ExitStatus(tc.err); got != tc.exit {
				t.Errorf("ExitStatus = %d, want %d", got, tc.exit)
			}
			if tc.err == nil {
				return
			}
			b := BodyOf(tc.err)
			if b.Code != tc.code || b.ExitCode != tc.exit || b.Message != tc.err.Error() {
				t.Errorf("BodyOf = %+v", b)
			}
			back := b.Err()
			if Code(back) != tc.code && !(Code(back) == "" && tc.code == "") {
				t.Errorf("round trip code %q, want %q", Code(back), tc.code)
			}
		})
	}
}
