package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/amlfs/amlfs/amlerr"
)

// withConfigFile adds --config FILE to a command whose flags may all be
// given in a YAML file instead, under their flag names:
//
//	store: s3://bucket/prefix
//	mount: ["/data=file:///srv/data,ro"]
//
// A flag on the command line wins over the file.
func withConfigFile(cmd *cli.Command) *cli.Command {
	flags := make([]cli.Flag, 0, len(cmd.Flags)+1)
	for _, f := range cmd.Flags {
		flags = append(flags, fromFile(f))
	}
	flags = append(flags, &cli.StringFlag{Name: "config", Usage: "YAML file of flag values, keyed by flag name (the command line wins)"})
	cmd.Flags = flags
	load := altsrc.InitInputSourceWithContext(flags, altsrc.NewYamlSourceFromFlagFunc("config"))
	cmd.Before = func(c *cli.Context) error {
		if err := load(c); err != nil {
			return amlerr.New(amlerr.InvalidConfig, c.String("config"), "config file: %v", err)
		}
		return nil
	}
	return cmd
}

func fromFile(f cli.Flag) cli.Flag {
	switch f := f.(type) {
	case *cli.StringFlag:
		return altsrc.NewStringFlag(f)
	case *cli.StringSliceFlag:
		return altsrc.NewStringSliceFlag(f)
	case *cli.BoolFlag:
		return altsrc.NewBoolFlag(f)
	case *cli.IntFlag:
		return altsrc.NewIntFlag(f)
	case *cli.DurationFlag:
		return altsrc.NewDurationFlag(f)
	}
	panic(fmt.Sprintf("flag %T cannot come from a config file", f))
}
