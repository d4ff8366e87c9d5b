package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"
	"gopkg.in/yaml.v3"

	"github.com/amlfs/amlfs/amlerr"
)

// withConfigFile adds --config FILE to a command whose flags may all be
// given in a YAML file instead, under their flag names:
//
//	store: s3://bucket/prefix
//	mount: ["/data=file:///srv/data,ro"]
//
// Every flag may also come from the environment, as AMLFS_ and its name in
// capitals with underscores (AMLFS_STORE, AMLFS_CACHE_SIZE), which is how
// containers are configured. The command line wins, then the environment,
// then the file.
func withConfigFile(cmd *cli.Command) *cli.Command {
	flags := make([]cli.Flag, 0, len(cmd.Flags)+1)
	for _, f := range append(cmd.Flags, &cli.StringFlag{Name: "config", Usage: "YAML file of flag values, keyed by flag name (the command line and AMLFS_* variables win)"}) {
		fromEnv(f)
		if f.Names()[0] == "config" {
			flags = append(flags, f)
			continue
		}
		flags = append(flags, fromFile(f))
	}
	cmd.Flags = flags
	load := altsrc.InitInputSourceWithContext(flags, altsrc.NewYamlSourceFromFlagFunc("config"))
	known := map[string]bool{}
	for _, f := range flags {
		known[f.Names()[0]] = true
	}
	cmd.Before = func(c *cli.Context) error {
		if err := unknownKeys(c.String("config"), known); err != nil {
			return err
		}
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

// envName is the environment variable a flag may come from.
func envName(flag string) string {
	return "AMLFS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func fromEnv(f cli.Flag) {
	env := []string{envName(f.Names()[0])}
	switch f := f.(type) {
	case *cli.StringFlag:
		f.EnvVars = env
	case *cli.StringSliceFlag:
		f.EnvVars = env
	case *cli.BoolFlag:
		f.EnvVars = env
	case *cli.IntFlag:
		f.EnvVars = env
	case *cli.DurationFlag:
		f.EnvVars = env
	}
}

// unknownKeys refuses a config file with a key that names no flag: a typo
// such as "exlude:" must not silently save what it meant to leave out.
func unknownKeys(file string, known map[string]bool) error {
	if file == "" {
		return nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return amlerr.New(amlerr.InvalidConfig, file, "config file: %v", err)
	}
	var keys map[string]any
	if err := yaml.Unmarshal(data, &keys); err != nil {
		return amlerr.New(amlerr.InvalidConfig, file, "config file: %v", err)
	}
	var bad []string
	for k := range keys {
		if !known[k] || k == "config" {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return amlerr.New(amlerr.InvalidConfig, file, "config file: unknown key(s) %s; keys are the flag names without their dashes, such as store, exclude, mount", strings.Join(bad, ", "))
	}
	return nil
}
