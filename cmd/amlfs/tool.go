package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/mount"
	"github.com/amlfs/amlfs/tools"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/urfave/cli/v2"
)

func toolCommand() *cli.Command {
	return &cli.Command{
		Name:      "tool",
		Usage:     "run one file tool (read_file, write_file, edit_file, list_files, delete, file_stat, mkdir, grep) on a mount; JSON arguments from ARGS or stdin",
		ArgsUsage: "MOUNTPOINT NAME [ARGS]",
		Action: func(c *cli.Context) error {
			if c.NArg() < 2 || c.NArg() > 3 {
				return amlerr.New(amlerr.InvalidConfig, "", "tool takes MOUNTPOINT, NAME and optional JSON arguments")
			}
			mp, name := c.Args().Get(0), c.Args().Get(1)
			args := []byte(c.Args().Get(2))
			if c.NArg() == 2 {
				var err error
				if args, err = io.ReadAll(io.LimitReader(os.Stdin, tools.MaxArgsBytes+1)); err != nil {
					return err
				}
			}
			if len(args) > tools.MaxArgsBytes {
				data, _ := json.MarshalIndent(amlerr.Envelope{Error: amlerr.Body{Code: tools.CodeTooLarge,
					Message: fmt.Sprintf("the call's arguments are over %d bytes: write large files in parts, or through the shell", tools.MaxArgsBytes)}}, "", "  ")
				fmt.Fprintln(c.App.Writer, string(data))
				return exitStatus(1)
			}
			cl, err := mount.NewClient(mp)
			if err != nil {
				return err
			}
			out, err := cl.Tool(c.Context, name, args)
			var te *tools.Error
			if errors.As(err, &te) {
				data, _ := json.MarshalIndent(amlerr.Envelope{Error: te.Body()}, "", "  ")
				fmt.Fprintln(c.App.Writer, string(data))
				return exitStatus(1)
			}
			if err != nil {
				return notRunning(mp, err)
			}
			var buf bytes.Buffer
			if json.Indent(&buf, bytes.TrimSpace(out), "", "  ") != nil {
				buf.Write(out)
			}
			fmt.Fprintln(c.App.Writer, buf.String())
			return nil
		},
	}
}

func mcpCommand() *cli.Command {
	return &cli.Command{
		Name:      "mcp",
		Usage:     "serve the file tools of a running mount over MCP on stdin and stdout",
		ArgsUsage: "MOUNTPOINT",
		Action: func(c *cli.Context) error {
			mp, cl, err := daemonClient(c)
			if err != nil {
				return err
			}
			st, err := cl.Status(c.Context)
			if err != nil {
				return notRunning(mp, err)
			}
			// Every path is read-only: no workspace, and only ro live
			// mounts.
			readOnly := st.Store == mount.StoreNone
			for _, m := range st.Mounts {
				readOnly = readOnly && m.RO
			}
			// Frames up to the documented bound are taken whole; a larger
			// one is answered TOO_LARGE, and never kills the server.
			in := tools.LimitFrames(os.Stdin, tools.MaxFrameBytes)
			return tools.NewMCPServer(buildVersion(), cl.Tool, readOnly).Run(c.Context,
				&mcp.IOTransport{Reader: in, Writer: nopWriteCloser{os.Stdout}, MaxLineLength: tools.MaxFrameBytes + 1<<20})
		},
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// buildVersion is the module version amlfs was built as.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "devel"
}
