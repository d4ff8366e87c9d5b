package mount

import (
	"log/slog"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// raiseFileLimit lifts the daemon's descriptor limit as far as it may go:
// the serving layer holds one O_PATH descriptor per inode the kernel
// knows, and a git repository or node_modules has tens of thousands. The
// soft limit goes to the hard one (Go does that much itself); as root,
// the hard limit goes to fs.nr_open. Commands the daemon runs get the
// original soft limit back from the Go runtime.
func raiseFileLimit(log *slog.Logger) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return
	}
	want := r
	if os.Geteuid() == 0 {
		if data, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
			if n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64); err == nil && n > want.Max {
				want.Max = n
			}
		}
	}
	want.Cur = want.Max
	if want == r {
		return
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want); err != nil {
		log.Warn("raise the descriptor limit", "op", "setrlimit", "want", want.Max, "err", err)
		return
	}
	log.Debug("descriptor limit raised", "from", r.Cur, "to", want.Cur)
}
