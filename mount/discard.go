package mount

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// RemoveTreeArg runs the amlfs binary as the remover of one discarded tree
// (RunRemoveTree), a process of its own that outlives the daemon.
const RemoveTreeArg = "internal-remove-tree"

// trashPrefix names a slot's discarded trees: a working tree renamed
// aside, to be removed.
const trashPrefix = "trash-"

// discard takes the tree at dir away at once: renamed aside within its
// slot, then removed by a process of its own (exe, the amlfs binary), so
// that neither a stop nor a mount waits while the file system frees a
// large tree (rm -rf of 23,000 files takes about 5 s here, and more on a
// busy disk). Without exe, or if the rename fails, it is removed here.
func discard(dir, exe string, log *slog.Logger) error {
	if exe == "" {
		return os.RemoveAll(dir)
	}
	trash := trashName(filepath.Dir(dir))
	if err := os.Rename(dir, trash); err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return os.RemoveAll(dir)
	}
	removeLater(trash, exe, log)
	return nil
}

// trashName is a new name for a discarded tree in slot.
func trashName(slot string) string {
	return filepath.Join(slot, fmt.Sprintf("%s%d-%d", trashPrefix, os.Getpid(), time.Now().UnixNano()))
}

// removeTrash removes the discarded tree trash: by its own process
// (removeLater) when there is an amlfs binary exe to run, else here.
func removeTrash(trash, exe string, log *slog.Logger) {
	if exe == "" {
		os.RemoveAll(trash)
		return
	}
	removeLater(trash, exe, log)
}

// removeLater starts the remover of trash, in a session of its own (a
// signal to the daemon's group does not end it), and does not wait for it.
// A remover that never ran or was killed leaves the tree to the next
// mount's sweep (sweepTrash).
func removeLater(trash, exe string, log *slog.Logger) {
	cmd := exec.Command(exe, RemoveTreeArg, trash)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		log.Warn("start the remover of a discarded tree; the next mount removes it", "op", "discard", "path", trash, "err", err)
		return
	}
	go cmd.Wait() // reaped if it ends while the daemon still runs
}

// sweepTrash removes the discarded trees a slot still holds (a remover
// that was killed, or a host that went down first).
func sweepTrash(slotDir, exe string, log *slog.Logger) {
	left, _ := filepath.Glob(filepath.Join(slotDir, trashPrefix+"*"))
	for _, t := range left {
		if exe == "" {
			go os.RemoveAll(t)
			continue
		}
		removeLater(t, exe, log)
	}
}

// RunRemoveTree is the remover's main: it removes the one tree it is
// given, which must be a discarded tree (a trash- name).
func RunRemoveTree(args []string) int {
	if len(args) != 1 || !filepath.IsAbs(args[0]) || !strings.HasPrefix(filepath.Base(args[0]), trashPrefix) || filepath.Base(args[0]) == trashPrefix {
		fmt.Fprintln(os.Stderr, "amlfs: internal-remove-tree takes one discarded tree's absolute path")
		return 2
	}
	if err := os.RemoveAll(args[0]); err != nil {
		fmt.Fprintf(os.Stderr, "amlfs: remove %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
