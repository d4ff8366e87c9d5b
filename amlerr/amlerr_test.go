package amlerr

import (
	"errors"
	"fmt"
	"testing"
)

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("x"), 1},
		{New(InvalidConfig, "f", "bad"), 2},
		{fmt.Errorf("wrapped: %w", New(WorkspaceConflict, "id", "held")), 3},
		{Wrap(SaveFailed, "id", New(PublishConflict, "id", "stale")), 3},
		{New(PublishConflict, "id", "stale"), 3},
		{Wrap(SaveFailed, "id", New(LockLost, "l", "gone")), 4},
		{New(RevisionIDConflict, "r", "exists"), 5},
		{New(InvalidStore, "workspace.json", "bad"), 1},
	} {
		if got := ExitStatus(tc.err); got != tc.want {
			t.Errorf("ExitStatus(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestFromMessage(t *testing.T) {
	orig := New(WorkspaceConflict, `"w"`, "locked")
	back := FromMessage(Code(orig), orig.Error())
	if Code(back) != WorkspaceConflict || back.Error() != `AML_WORKSPACE_CONFLICT: "w": locked` {
		t.Errorf("got %q", back)
	}
	if Code(FromMessage("", "plain")) != "" {
		t.Error("plain message gained a code")
	}
}
