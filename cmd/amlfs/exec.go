package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/mount"
	"github.com/google/uuid"
	"github.com/urfave/cli/v2"
)

// execCommand is the container entrypoint: mount, run CMD in the mount,
// save per --save, unmount, and exit with CMD's status.
func execCommand() *cli.Command {
	return withConfigFile(&cli.Command{
		Name:  "exec",
		Usage: "mount, run CMD with its working directory in the mount, save per --save, unmount, and exit with CMD's status",
		Description: "--save on-success (the default) saves only if CMD exits 0, always saves anyway, never does not save. " +
			"SIGTERM and SIGINT are forwarded to CMD: one that exits 0 after it is saved; one still running after --stop-timeout (or at a second signal) is killed. " +
			"If the save fails, amlfs exits 4 and prints the save error and CMD's status.",
		ArgsUsage: "MOUNTPOINT -- CMD [ARGS...]",
		Flags: append(mountFlags(),
			&cli.StringFlag{Name: "cwd", Usage: "CMD's working directory, relative to the mount root"},
			&cli.StringFlag{Name: "revision", Usage: "caller-chosen id for the revision the run saves"},
			&cli.DurationFlag{Name: "stop-timeout", Value: 8 * time.Second, Usage: "after a forwarded SIGTERM or SIGINT, how long CMD may take to exit before its process group is killed (inside Docker's 10 s grace); a second signal kills at once"},
		),
		Action: func(c *cli.Context) error {
			args := c.Args().Slice()
			if len(args) < 2 {
				return amlerr.New(amlerr.InvalidConfig, "", "exec takes MOUNTPOINT -- CMD [ARGS...]")
			}
			mp, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return amlerr.New(amlerr.InvalidConfig, "", "exec needs a command after --")
			}
			cfg := configFrom(c, mp)
			if err := cfg.Normalize(); err != nil {
				return err
			}
			cwd := filepath.Join(cfg.Mountpoint, filepath.Clean("/"+c.String("cwd")))
			if cfg.ID == "" && cfg.Store != mount.StoreNone {
				cfg.ID = uuid.NewString()
				fmt.Fprintf(c.App.ErrWriter, "amlfs: workspace id: %s\n", cfg.ID)
			}
			// CMD runs in a cgroup of its own, which the daemon freezes
			// while a checkpoint reads the tree: the command and every
			// process it starts (a git auto-gc left in the background)
			// stand still, and the checkpoint is the tree at one instant.
			cgroupFD := -1
			if cfg.FreezeCgroup == "" && os.Geteuid() == 0 {
				if dir, fd, remove, err := mount.NewExecCgroup(); err == nil {
					cfg.FreezeCgroup, cgroupFD = dir, fd
					defer remove()
				}
			}
			// Signals that come while mounting are CMD's too: hold them.
			sigs := make(chan os.Signal, 4)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
			defer signal.Stop(sigs)
			if err := daemonize(c, cfg); err != nil {
				return err
			}
			cl, err := mount.NewClient(cfg.Mountpoint)
			if err != nil {
				return err
			}
			if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
				cl.Unmount(context.WithoutCancel(c.Context), true, "")
				return amlerr.New(amlerr.InvalidConfig, c.String("cwd"), "--cwd must name a directory in the mount")
			}
			if cgroupFD >= 0 {
				wctx, stopWatch := context.WithCancel(context.WithoutCancel(c.Context))
				defer stopWatch()
				go mount.WatchFrozen(wctx, cfg.FreezeCgroup, func(ctx context.Context) bool {
					_, err := cl.Status(ctx)
					return err == nil
				})
			}
			status, cancelled, runErr := runIn(cwd, argv, cgroupFD, sigs, c.Duration("stop-timeout"), c)
			// The command's status decides: one that traps SIGTERM,
			// finishes its work and exits 0 has succeeded.
			save := cfg.Save == mount.SaveAlways || cfg.Save == mount.SaveOnSuccess && status == 0
			res, err := cl.Unmount(context.WithoutCancel(c.Context), !save, c.String("revision"))
			if err != nil {
				fmt.Fprintf(c.App.ErrWriter, "amlfs: unmount: %v (command exited %d)\n", err, status)
				return exitStatus(amlerr.ExitSave)
			}
			if runErr != nil {
				fmt.Fprintf(c.App.ErrWriter, "amlfs: %v\n", runErr)
			}
			if res.Error != nil {
				fmt.Fprintf(c.App.ErrWriter, "amlfs: save failed: %s; the command exited %d\n", res.Error.Message, status)
				return exitStatus(amlerr.ExitSave)
			}
			switch {
			case res.Saved != nil:
				fmt.Fprintf(c.App.ErrWriter, "amlfs: saved revision %s; the command exited %d\n", res.Saved.Revision, status)
				if n := res.Saved.Note(); n != "" {
					fmt.Fprintln(c.App.ErrWriter, "amlfs: "+n)
				}
			case save:
				fmt.Fprintf(c.App.ErrWriter, "amlfs: nothing to save; the command exited %d\n", status)
			default:
				fmt.Fprintf(c.App.ErrWriter, "amlfs: not saved (--save %s%s); the command exited %d\n", cfg.Save, map[bool]string{true: ", cancelled by a signal"}[cancelled], status)
			}
			if status != 0 {
				return exitStatus(status)
			}
			return nil
		},
	})
}

// runIn runs argv in dir with the caller's stdio, forwarding SIGTERM and
// SIGINT, in the cgroup cgroupFD if not -1. It returns the exit status
// (128+N for a signal N), and whether a signal came before the command
// ended.
func runIn(dir string, argv []string, cgroupFD int, sigs chan os.Signal, stopTimeout time.Duration, c *cli.Context) (int, bool, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.App.Writer, c.App.ErrWriter
	// Without a terminal (a container), CMD gets a process group of its
	// own and signals go to the whole group, as tini -g does: a shell's
	// children stop too, and release the mount. On a terminal CMD stays
	// in the foreground group, which the terminal signals itself.
	group := !isTTY(os.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	if cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cgroupFD
	}
	cancelled := false
	// A signal that came while mounting ends the command before it starts.
	select {
	case <-sigs:
		return 128 + int(syscall.SIGTERM), true, nil
	default:
	}
	if err := cmd.Start(); err != nil {
		status := 127
		if !errors.Is(err, exec.ErrNotFound) && !errors.Is(err, os.ErrNotExist) {
			status = 126
		}
		return status, false, fmt.Errorf("run %s: %w", strings.Join(argv, " "), err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	send := func(s syscall.Signal) {
		if group {
			syscall.Kill(-cmd.Process.Pid, s)
		} else {
			cmd.Process.Signal(s)
		}
	}
	var deadline <-chan time.Time
	for {
		select {
		case s := <-sigs:
			if cancelled {
				// A second signal: the caller means it now.
				send(syscall.SIGKILL)
				continue
			}
			cancelled = true
			send(s.(syscall.Signal))
			// docker stop waits 10 s, then kills amlfs too: the command
			// gets stopTimeout to finish, then its group is killed, and
			// amlfs still saves per policy before Docker's SIGKILL.
			deadline = time.After(stopTimeout)
		case <-deadline:
			fmt.Fprintf(c.App.ErrWriter, "amlfs: the command did not stop within --stop-timeout %s; killing it\n", stopTimeout)
			send(syscall.SIGKILL)
			deadline = nil
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal()), cancelled, nil
				}
				return ee.ExitCode(), cancelled, nil
			}
			if err != nil {
				return 1, cancelled, err
			}
			return 0, cancelled, nil
		}
	}
}
