package main

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/revision"
)

// isTTY reports whether w is a terminal.
func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressLine renders a progress report on one line.
func progressLine(p revision.Progress) string {
	mb := func(n int64) float64 { return float64(n) / 1e6 }
	rate := 0.0
	if s := p.Elapsed.Seconds(); s > 0 {
		rate = mb(p.Bytes) / s
	}
	return fmt.Sprintf("%s: %d/%d files, %.1f/%.1f MB, %.1f MB/s, %.1fs", p.Phase, p.Files, p.TotalFiles, mb(p.Bytes), mb(p.TotalBytes), rate, p.Elapsed.Seconds())
}

// ttyProgress draws reports in place on a terminal, and stays quiet
// elsewhere.
func ttyProgress(w io.Writer) func(revision.Progress) {
	if !isTTY(w) {
		return nil
	}
	return func(p revision.Progress) {
		end := ""
		if p.Done {
			end = "\n"
		}
		fmt.Fprintf(w, "\r\x1b[K%s%s", progressLine(p), end)
	}
}
