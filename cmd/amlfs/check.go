package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/amlfs/amlfs/mount"
)

func checkCommand() *cli.Command {
	return withConfigFile(&cli.Command{
		Name:      "check",
		Usage:     "preflight: config, store reachability and conditional-write support, FUSE, local-only settings",
		ArgsUsage: "[MOUNTPOINT]",
		Flags:     append(mountFlags(), &cli.BoolFlag{Name: "json"}),
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				_, err := oneArg(c, "MOUNTPOINT")
				return err
			}
			cfg := configFrom(c, c.Args().First())
			report, err := mount.Check(c.Context, cfg)
			if c.Bool("json") {
				if perr := printJSON(c.App.Writer, report); perr != nil {
					return perr
				}
			} else {
				for _, it := range report.Items {
					fmt.Fprintf(c.App.Writer, "%-4s  %-18s %s\n", it.Status, it.What, it.Detail)
				}
			}
			return err
		},
	})
}
