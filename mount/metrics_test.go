package mount

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/amlfs/amlfs/revision"
)

// A running save logs what it has left at its first progress report and
// every saveReportEvery after; every save does, not only the first.
func TestSaveProgressLog(t *testing.T) {
	var buf bytes.Buffer
	d := &Daemon{log: slog.New(slog.NewTextHandler(&buf, nil))}
	save := func(elapsed ...time.Duration) int {
		buf.Reset()
		for _, e := range elapsed {
			d.progress(revision.Progress{Phase: "save", Elapsed: e, TotalBytes: 100})
		}
		d.progress(revision.Progress{Phase: "save", Done: true})
		return strings.Count(buf.String(), "msg=saving")
	}
	ms := time.Millisecond
	if n := save(200*ms, 400*ms, 4*time.Second, 5200*ms, 6*time.Second, 10300*ms); n != 3 {
		t.Errorf("a 10 s save logged %d times, want 3 (at 0.2 s, 5.2 s, 10.3 s)", n)
	}
	if n := save(200 * ms); n != 1 {
		t.Errorf("the next save logged %d times, want 1", n)
	}
}
