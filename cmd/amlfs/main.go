// Command amlfs mounts a revision-backed AML workspace (through FUSE, or
// natively as a bind mount), with live mounts beside it, and manages its
// revisions: the CLI over package mount.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/mount"
	"github.com/amlfs/amlfs/native"
)

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 1 && args[1] == native.KeeperArg {
		return native.RunKeeper(args[2:])
	}
	if len(args) > 1 && args[1] == mount.RemoveTreeArg {
		return mount.RunRemoveTree(args[2:])
	}
	if len(args) > 0 && isMountHelper(args[0]) {
		a, err := helperArgs(args[1:], mountCommand().Flags)
		if err != nil {
			fmt.Fprintf(stderr, "amlfs: %v\n", err)
			return amlerr.ExitStatus(err)
		}
		args = a
	}
	app := newApp(stdout, stderr)
	err := app.RunContext(context.Background(), interspersed(app, args))
	if err == nil {
		return 0
	}
	var ex exitStatus
	if errors.As(err, &ex) {
		return int(ex)
	}
	fmt.Fprintf(stderr, "amlfs: %v\n", err)
	return amlerr.ExitStatus(err)
}

// exitStatus ends the program with a status, having printed already.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func usageError(c *cli.Context, err error, isSubcommand bool) error {
	return amlerr.Wrap(amlerr.InvalidConfig, "", err)
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name: "amlfs",
		// --mount /p=URL,ro and globs like {a,b} hold commas: never split.
		DisableSliceFlagSeparator: true,
		Usage:                     "a durable, revision-backed working directory for agent sandboxes, through FUSE",
		Writer:                    stdout,
		ErrWriter:                 stderr,
		OnUsageError:              usageError,
		HideHelpCommand:           true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json"},
		},
		Commands: []*cli.Command{
			mountCommand(),
			unmountCommand(),
			commitCommand(),
			refreshCommand(),
			toolCommand(),
			mcpCommand(),
			execCommand(),
			destroyCommand(),
			statusCommand(),
			revisionsCommand(),
			checkCommand(),
		},
		ExitErrHandler: func(*cli.Context, error) {},
	}
	var setUsage func([]*cli.Command)
	setUsage = func(cmds []*cli.Command) {
		for _, c := range cmds {
			c.OnUsageError = usageError
			setUsage(c.Subcommands)
		}
	}
	setUsage(app.Commands)
	return app
}

func logger(c *cli.Context, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, amlerr.New(amlerr.InvalidConfig, c.String("log-level"), "--log-level must be debug, info, warn or error")
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, amlerr.New(amlerr.InvalidConfig, c.String("log-format"), "--log-format must be text or json")
}

// oneArg returns the single positional argument a command takes.
func oneArg(c *cli.Context, name string) (string, error) {
	if c.NArg() != 1 {
		return "", amlerr.New(amlerr.InvalidConfig, "", "%s takes exactly one argument, %s (got %d: %s)", c.Command.FullName(), name, c.NArg(), strings.Join(c.Args().Slice(), " "))
	}
	return c.Args().First(), nil
}
