package main

import (
	"strings"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"
)

// interspersed moves a command's flags ahead of its positional arguments,
// so that `amlfs mount /workspace --store ...` works as documented:
// urfave/cli v2 stops parsing flags at the first positional argument.
// Everything after "--" is left alone.
func interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	i := 1
	flags := app.Flags
	cmds := app.Commands
	// Global flags, then the command chain.
	// flag moves the flag at args[i], and its value if it takes one, to out.
	flag := func() {
		a := args[i]
		out = append(out, a)
		i++
		if takesValue(flags, a) && i < len(args) {
			out = append(out, args[i])
			i++
		}
	}
	for i < len(args) {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			flag()
			continue
		}
		var next *cli.Command
		for _, c := range cmds {
			if c.HasName(a) {
				next = c
			}
		}
		if next == nil {
			break
		}
		out = append(out, a)
		i++
		flags, cmds = next.Flags, next.Subcommands
	}
	var pos []string
	for i < len(args) {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i:]...)
			break
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			flag()
			continue
		}
		pos = append(pos, a)
		i++
	}
	return append(out, pos...)
}

// takesValue reports whether a "--name" token needs the next token as its
// value (not for bool flags, nor for "--name=value").
func takesValue(flags []cli.Flag, tok string) bool {
	name := strings.TrimLeft(tok, "-")
	if strings.Contains(name, "=") {
		return false
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return !isBoolFlag(f)
			}
		}
	}
	return false
}

// isBoolFlag reports a flag that takes no value, also when it may come
// from a config file.
func isBoolFlag(f cli.Flag) bool {
	switch f.(type) {
	case *cli.BoolFlag, *altsrc.BoolFlag:
		return true
	}
	return false
}
