package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/urfave/cli/v2"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/mount"
	"github.com/amlfs/amlfs/revision"
)

// mountFlags are every setting of mount.Config, declared there.
func mountFlags() []cli.Flag {
	def := mount.DefaultConfig()
	return flagsOf(&def)
}

// storeFlags are the settings of a command that reads a store: where it
// is, which workspace (required), and the limits its revisions keep to.
func storeFlags() []cli.Flag {
	return omit(storeWriterFlags(), writerKeys...)
}

// writerKeys are the store settings only a writer takes.
var writerKeys = []string{"no-lock", "unsafe-no-conditional-writes"}

// storeWriterFlags are storeFlags and those of a command that publishes.
func storeWriterFlags() []cli.Flag {
	def := mount.DefaultConfig()
	v := struct {
		mount.StoreConfig
		mount.LimitConfig
	}{def.StoreConfig, def.LimitConfig}
	return require(flagsOf(&v), "id")
}

// storeFrom reads storeFlags, validated.
func storeFrom(c *cli.Context) (mount.StoreConfig, mount.LimitConfig, error) {
	def := mount.DefaultConfig()
	v := struct {
		mount.StoreConfig
		mount.LimitConfig
	}{def.StoreConfig, def.LimitConfig}
	fillSet(c, &v)
	v.IDGiven = c.IsSet("id")
	if err := v.StoreConfig.Validate(); err != nil {
		return v.StoreConfig, v.LimitConfig, err
	}
	return v.StoreConfig, v.LimitConfig, v.LimitConfig.Validate()
}

// configFrom reads mountFlags.
func configFrom(c *cli.Context, mountpoint string) mount.Config {
	cfg := mount.Config{Mountpoint: mountpoint}
	fill(c, &cfg)
	cfg.IDGiven = c.IsSet("id")
	cfg.Keeper = executable()
	return cfg
}

const readyFdEnv = "AMLFS_READY_FD"

func mountCommand() *cli.Command {
	return withConfigFile(&cli.Command{
		Name:      "mount",
		Usage:     "mount a workspace and serve it until unmounted or signalled",
		ArgsUsage: "MOUNTPOINT",
		Flags: append(mountFlags(),
			&cli.BoolFlag{Name: "daemon", Usage: "detach once the mount is ready"},
			&cli.BoolFlag{Name: "json", Usage: "with --daemon: once the mount is ready, print its status as `amlfs status --json` does (a caller then needs no second command)"},
		),
		Action: func(c *cli.Context) error {
			mp, err := oneArg(c, "MOUNTPOINT")
			if err != nil {
				return err
			}
			cfg := configFrom(c, mp)
			if err := cfg.Normalize(); err != nil {
				return err
			}
			if c.Bool("json") && !c.Bool("daemon") {
				return amlerr.New(amlerr.InvalidConfig, "--json", "--json prints the status once a --daemon mount is ready: it needs --daemon")
			}
			if cfg.ID != "" && alreadyMounted(c, cfg) {
				// A retried mount: the same workspace is served here.
				fmt.Fprintf(c.App.ErrWriter, "amlfs: %s already serves workspace %s; nothing to do\n", cfg.Mountpoint, cfg.ID)
				return printReadyStatus(c, cfg)
			}
			if cfg.ID == "" && cfg.Store != mount.StoreNone {
				cfg.ID = uuid.NewString()
				if !c.Bool("json") { // the status names it
					fmt.Fprintf(c.App.Writer, "workspace id: %s\n", cfg.ID)
				}
			}
			if c.Bool("daemon") && os.Getenv(readyFdEnv) == "" {
				return daemonize(c, cfg)
			}
			log, err := logger(c, c.App.ErrWriter)
			if err != nil {
				return err
			}
			var hooks mount.Hooks
			var readyPipe *os.File
			if fd, err := strconv.Atoi(os.Getenv(readyFdEnv)); err == nil {
				// A --daemon child reports to its parent through the pipe.
				readyPipe = os.NewFile(uintptr(fd), "ready")
				hooks.Notify = func(msg string) { fmt.Fprintf(readyPipe, "note\t%s\n", msg) }
				var ready atomic.Bool
				var pipeMu sync.Mutex // the pipe is closed at ready
				hooks.Ready = func(string) {
					pipeMu.Lock()
					defer pipeMu.Unlock()
					ready.Store(true)
					fmt.Fprintln(readyPipe, "ready")
					readyPipe.Close()
				}
				hooks.Progress = func(p revision.Progress) {
					pipeMu.Lock()
					defer pipeMu.Unlock()
					if !ready.Load() { // the parent is listening only until ready
						fmt.Fprintf(readyPipe, "progress\t%s\t%v\n", progressLine(p), p.Done)
					}
				}
			} else {
				hooks.Progress = ttyProgress(c.App.ErrWriter)
				hooks.Ready = func(mp string) {
					fmt.Fprintf(c.App.ErrWriter, "amlfs: %s mounted (%s); unmount with `amlfs unmount %s` or Ctrl-C\n", mp, what(cfg), mp)
				}
				hooks.Notify = func(msg string) { fmt.Fprintf(c.App.ErrWriter, "amlfs: %s\n", msg) }
			}
			err = mount.Run(c.Context, cfg, log, hooks)
			if err != nil && readyPipe != nil {
				fmt.Fprintf(readyPipe, "error\t%d\t%s\n", amlerr.ExitStatus(err), err)
				readyPipe.Close()
			}
			return err
		},
	})
}

// daemonize re-executes amlfs detached, with its logs in the runtime dir,
// and returns once the child reports the mount ready, or fails with the
// child's error and exit status.
func daemonize(c *cli.Context, cfg mount.Config) error {
	if _, err := mount.EnsureRuntimeDir(); err != nil {
		return err
	}
	logPath := mount.LogPath(cfg.Mountpoint)
	// Never through a symlink: the runtime dir is ours (EnsureRuntimeDir),
	// and the log is a plain file in it.
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	// The child gets the same flags, the normalized config's identity and
	// mountpoint, and no --daemon.
	args := []string{"--log-level", c.String("log-level"), "--log-format", c.String("log-format"), "mount"}
	for _, f := range c.Command.Flags {
		name := f.Names()[0]
		if name == "daemon" || name == "json" || name == "id" || name == "cwd" || name == "revision" || name == "stop-timeout" || !c.IsSet(name) {
			continue
		}
		switch v := c.Value(name).(type) {
		case cli.StringSlice:
			for _, s := range v.Value() {
				args = append(args, "--"+name, s)
			}
		case bool:
			args = append(args, fmt.Sprintf("--%s=%v", name, v))
		default:
			args = append(args, "--"+name, fmt.Sprint(v))
		}
	}
	if cfg.ID != "" { // --store none has none
		args = append(args, "--id", cfg.ID)
	}
	if cfg.FreezeCgroup != "" && !c.IsSet("freeze-cgroup") { // amlfs exec's own
		args = append(args, "--freeze-cgroup", cfg.FreezeCgroup)
	}
	args = append(args, cfg.Mountpoint)
	cmd := exec.Command("/proc/self/exe", args...)
	cmd.Env = append(os.Environ(), readyFdEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// Stopped before the mount is ready (a caller cancelling it), this
	// command stops the daemon: it cancels the mount, takes nothing and
	// leaves nothing behind, and its error is reported here. The signals
	// are caught before the daemon starts: one that came in between would
	// end this command and leave the daemon (in a session of its own) to
	// mount after its caller's cleanup.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return err
	}
	w.Close()
	// Once the mount is ready, a signal is no longer passed on: the
	// daemon would stop while this command returns, still holding the
	// lease, and the caller's cleanup (an unmount, which waits for the
	// daemon to be gone) would find nothing to stop. One passed on before
	// is waited for.
	var fwd sync.Mutex
	readied, forwarded := false, false
	waiting := make(chan struct{})
	defer close(waiting)
	go func() {
		select {
		case s := <-sigs:
			fwd.Lock()
			if !readied {
				forwarded = true
				cmd.Process.Signal(s)
			}
			fwd.Unlock()
		case <-waiting:
		}
	}()
	br := bufio.NewReader(r)
	tty := isTTY(c.App.ErrWriter)
	var line string
	for {
		l, err := br.ReadString('\n')
		line = strings.TrimRight(l, "\n")
		if msg, ok := strings.CutPrefix(line, "note\t"); ok {
			fmt.Fprintf(c.App.ErrWriter, "amlfs: %s\n", msg)
			continue
		}
		if msg, ok := strings.CutPrefix(line, "progress\t"); ok {
			if tty {
				text, done, _ := strings.Cut(msg, "\t")
				end := ""
				if done == "true" {
					end = "\n"
				}
				fmt.Fprintf(c.App.ErrWriter, "\r\x1b[K%s%s", text, end)
			}
			continue
		}
		if err != nil || line != "" {
			break
		}
	}
	r.Close()
	fwd.Lock()
	readied = true
	stopped := forwarded
	fwd.Unlock()
	if line == "ready" && stopped {
		cmd.Wait()
		return fmt.Errorf("stopped by a signal as the mount became ready; the daemon stopped too (see %s)", logPath)
	}
	if line == "ready" {
		fmt.Fprintf(c.App.ErrWriter, "amlfs: %s mounted (%s, pid %d, log %s)\n", cfg.Mountpoint, what(cfg), cmd.Process.Pid, logPath)
		cmd.Process.Release()
		return printReadyStatus(c, cfg)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	if parts := strings.SplitN(line, "\t", 3); len(parts) == 3 && parts[0] == "error" {
		fmt.Fprintf(c.App.ErrWriter, "amlfs: %s\n", parts[2])
		code, _ := strconv.Atoi(parts[1])
		return exitStatus(code)
	}
	return fmt.Errorf("the daemon exited before the mount was ready; see %s", logPath)
}

// printReadyStatus prints, with --json, the status of the mount at
// cfg.Mountpoint, as `amlfs status --json` does.
func printReadyStatus(c *cli.Context, cfg mount.Config) error {
	if !c.Bool("json") {
		return nil
	}
	cl, err := mount.NewClient(cfg.Mountpoint)
	if err != nil {
		return err
	}
	st, err := cl.StatusCheckingLease(context.WithoutCancel(c.Context))
	if err != nil {
		return notRunning(cfg.Mountpoint, err)
	}
	return printJSON(c.App.Writer, st)
}

func unmountCommand() *cli.Command {
	return &cli.Command{
		Name:      "unmount",
		Usage:     "save per the mount's policy, unmount and release the lock",
		ArgsUsage: "MOUNTPOINT",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "no-save", Usage: "do not save; discard unsaved changes"},
			&cli.StringFlag{Name: "revision", Usage: "caller-chosen id for the final revision (idempotent: a retry with the same id and tree writes nothing)"}},
		Action: func(c *cli.Context) error {
			mp, cl, err := daemonClient(c)
			if err != nil {
				return err
			}
			res, err := cl.Unmount(c.Context, c.Bool("no-save"), c.String("revision"))
			dead := false
			if err == mount.ErrNotRunning {
				var derr error
				// The daemon died (kill -9, a crash): nothing can save
				// now, but the dead mount must not stay behind.
				if dead, derr = mount.DetachIfDead(mp); derr != nil {
					return derr
				}
			}
			if dead {
				fmt.Fprintf(c.App.ErrWriter, "amlfs: %s was a dead mount (its daemon is gone); unmounted it without saving. The working tree is kept in the cache dir: the next mount of the workspace resumes it\n", mp)
				return nil
			}
			if err == mount.ErrNotRunning {
				// A retried unmount: report the final state, change
				// nothing, and exit 0.
				if last, ok := mount.ReadLastStop(mp); ok {
					state := "nothing saved"
					if last.Saved != nil {
						state = "saved revision " + last.Saved.Revision
						fmt.Fprintln(c.App.Writer, last.Saved.Revision)
					} else if last.Error != nil {
						state = "its save failed: " + last.Error.Message
					}
					fmt.Fprintf(c.App.ErrWriter, "amlfs: %s was already unmounted at %s (workspace %s, %s); nothing to do\n", mp, last.StoppedAt.Format(time.RFC3339), last.ID, state)
					return nil
				}
				fmt.Fprintf(c.App.ErrWriter, "amlfs: %s is not mounted by amlfs; nothing to do\n", mp)
				return nil
			}
			if err != nil {
				return err
			}
			if res.Error != nil {
				return res.Error.Err()
			}
			if res.Saved != nil {
				fmt.Fprintln(c.App.Writer, res.Saved.Revision)
				if n := res.Saved.Note(); n != "" {
					fmt.Fprintln(c.App.ErrWriter, "amlfs: "+n)
				}
			}
			return nil
		},
	}
}

func commitCommand() *cli.Command {
	return &cli.Command{
		Name:      "commit",
		Usage:     "checkpoint the workspace as a revision now, without unmounting; prints its id",
		ArgsUsage: "MOUNTPOINT",
		Flags: []cli.Flag{&cli.StringFlag{Name: "revision", Usage: "caller-chosen revision id"},
			&cli.StringFlag{Name: "fork", Usage: "publish the tree as the first revision of the new workspace NEWID on the same store instead, leaving the mounted one as it is"},
			&cli.StringSliceFlag{Name: "include", Usage: "for this commit, glob of paths to save, instead of the mount's (repeatable)"},
			&cli.StringSliceFlag{Name: "exclude", Usage: "for this commit, glob of paths never saved, instead of the mount's (repeatable; wins over include)"},
			&cli.BoolFlag{Name: "gitignore", Usage: "for this commit, whether .gitignore rules apply (--gitignore=false saves what they ignore)"},
			&cli.IntFlag{Name: "retention", Usage: "for this commit, revisions kept, counting the new one, instead of the mount's"}},
		Action: func(c *cli.Context) error {
			mp, cl, err := daemonClient(c)
			if err != nil {
				return err
			}
			var opts mount.CommitOptions
			if c.IsSet("include") || c.IsSet("exclude") {
				opts.Include, opts.Exclude = c.StringSlice("include"), c.StringSlice("exclude")
				if opts.Include == nil {
					opts.Include = []string{}
				}
				if opts.Exclude == nil {
					opts.Exclude = []string{}
				}
			}
			if c.IsSet("gitignore") {
				g := c.Bool("gitignore")
				opts.Gitignore = &g
			}
			if c.IsSet("retention") {
				if opts.Retention = c.Int("retention"); opts.Retention < 1 {
					return amlerr.New(amlerr.InvalidConfig, "--retention", "must be at least 1")
				}
			}
			info, err := cl.CommitWith(c.Context, c.String("revision"), c.String("fork"), opts)
			if err != nil {
				return notRunning(mp, err)
			}
			fmt.Fprintln(c.App.Writer, info.Revision)
			if info.Fork != "" {
				fmt.Fprintf(c.App.ErrWriter, "amlfs: published as the first revision of workspace %q (%d files: %d uploaded, %d copied from this workspace's objects); the mounted workspace is unchanged\n", info.Fork, info.Files, info.Uploaded, info.Reused)
			}
			if n := info.Note(); n != "" {
				fmt.Fprintln(c.App.ErrWriter, "amlfs: "+n)
			}
			return nil
		},
	}
}

func refreshCommand() *cli.Command {
	return &cli.Command{
		Name:      "refresh",
		Usage:     "drop the kernel's cached entries, attributes and data of PATH in the live mounts (all of them without PATH; also SIGHUP)",
		ArgsUsage: "MOUNTPOINT [PATH]",
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 || c.NArg() > 2 {
				return amlerr.New(amlerr.InvalidConfig, "", "refresh takes MOUNTPOINT and an optional PATH")
			}
			mp := c.Args().Get(0)
			cl, err := mount.NewClient(mp)
			if err != nil {
				return err
			}
			// PATH is relative to the mount root; a path inside the
			// mountpoint is taken as such.
			p := c.Args().Get(1)
			if abs, err := filepath.Abs(mp); err == nil && strings.HasPrefix(p, abs+"/") {
				p = strings.TrimPrefix(p, abs)
			}
			done, err := cl.Refresh(c.Context, p)
			if err != nil {
				return notRunning(mp, err)
			}
			for _, m := range done {
				fmt.Fprintln(c.App.Writer, m)
			}
			return nil
		},
	}
}

// daemonClient returns the MOUNTPOINT argument and a client for the daemon
// serving it.
func daemonClient(c *cli.Context) (string, *mount.Client, error) {
	mp, err := oneArg(c, "MOUNTPOINT")
	if err != nil {
		return "", nil, err
	}
	cl, err := mount.NewClient(mp)
	return mp, cl, err
}

func notRunning(mp string, err error) error {
	if err == mount.ErrNotRunning {
		return fmt.Errorf("%s: %w", mp, err)
	}
	return err
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "show a mount's workspace, revision, changes and lock",
		ArgsUsage: "MOUNTPOINT",
		Flags:     []cli.Flag{&cli.BoolFlag{Name: "json"}},
		Action: func(c *cli.Context) error {
			mp, cl, err := daemonClient(c)
			if err != nil {
				return err
			}
			st, err := cl.StatusCheckingLease(context.WithoutCancel(c.Context))
			if err != nil {
				return notRunning(mp, err)
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, st)
			}
			w := c.App.Writer
			fmt.Fprintf(w, "mountpoint:  %s\nworkspace:   %s\nstore:       %s\nphase:       %s\n", st.Mountpoint, st.ID, st.Store, st.Phase)
			base := orNone(st.BaseRevision)
			if f := st.ForkOf; f != nil {
				base += fmt.Sprintf(" (of workspace %q: a fork, not saved yet)", f.ID)
			}
			fmt.Fprintf(w, "current:     %s\nbase:        %s\ndirty:       %v (%d changes)\nlock:        %s\n", orNone(st.CurrentRevision), base, st.Dirty, st.Changes, st.Lock)
			fmt.Fprintf(w, "save policy: %s\nserve:       %s (%s)\npassthrough: %v\nworking dir: %s\npid:         %d\n", st.SavePolicy, st.Serve, st.ServeWhy, st.Passthrough, st.WorkDir, st.PID)
			if st.PendingFiles > 0 {
				fmt.Fprintf(w, "lazy:        %d files (%d bytes) not fetched yet\n", st.PendingFiles, st.PendingBytes)
			}
			fmt.Fprintf(w, "health:      %s\n", st.Health)
			for _, m := range st.Mounts {
				mode := "rw"
				if m.RO {
					mode = "ro"
				}
				fmt.Fprintf(w, "mount:       %s = %s (%s): %s\n", m.Prefix, m.URL, mode, m.Health)
			}
			if st.LastSave != nil {
				fmt.Fprintf(w, "last save:   %s at %s (%d files, %d symlinks, %d bytes; %d special files left out)\n", st.LastSave.Revision, st.LastSave.At.Format(time.RFC3339),
					st.LastSave.Files, st.LastSave.Symlinks, st.LastSave.Bytes, st.LastSave.SpecialFilesSkipped)
				if n := st.LastSave.Note(); n != "" {
					fmt.Fprintf(w, "             %s\n", n)
				}
			}
			return nil
		},
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// what names what a mount serves, for its "mounted" line.
func what(cfg mount.Config) string {
	if cfg.Store == mount.StoreNone {
		return "live mounts only"
	}
	return "workspace " + cfg.ID
}

// alreadyMounted reports whether a daemon serves cfg's workspace (same id
// and store) at cfg's mountpoint.
func alreadyMounted(c *cli.Context, cfg mount.Config) bool {
	cl, err := mount.NewClient(cfg.Mountpoint)
	if err != nil {
		return false
	}
	st, err := cl.Status(c.Context)
	return err == nil && st.Phase == "serving" && st.ID == cfg.ID &&
		strings.HasPrefix(st.Store, strings.TrimSuffix(cfg.Store, "/")+"/")
}

// executable is this binary, which native serving runs again as its
// keeper; "" if it cannot be found.
func executable() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return exe
}
