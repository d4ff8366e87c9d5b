package main

import (
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/urfave/cli/v2"
)

// flagsOf declares a flag for every field of the struct v points to (and
// of the structs it embeds) that has a `key` tag, with the field's value
// in v as its default and its `usage` tag as its help. The key is the
// flag's name; withConfigFile adds the AMLFS_* variable and the config
// file key of the same name. So a setting is declared once, in its
// struct (mount.Config), and never spelled again here.
func flagsOf(v any) []cli.Flag {
	var flags []cli.Flag
	eachKey(reflect.ValueOf(v).Elem(), func(key, usage string, f reflect.Value) {
		switch x := f.Interface().(type) {
		case string:
			flags = append(flags, &cli.StringFlag{Name: key, Usage: usage, Value: x})
		case bool:
			flags = append(flags, &cli.BoolFlag{Name: key, Usage: usage, Value: x})
		case int:
			flags = append(flags, &cli.IntFlag{Name: key, Usage: usage, Value: x})
		case time.Duration:
			flags = append(flags, &cli.DurationFlag{Name: key, Usage: usage, Value: x})
		case []string:
			flags = append(flags, &cli.StringSliceFlag{Name: key, Usage: usage})
		default:
			panic(fmt.Sprintf("setting %s: no flag for %T", key, x))
		}
	})
	return flags
}

// fill sets every keyed field of the struct v points to from c's flags.
func fill(c *cli.Context, v any) {
	eachKey(reflect.ValueOf(v).Elem(), func(key, _ string, f reflect.Value) {
		setFrom(c, key, f)
	})
}

// fillSet is fill for a command that declares some of the keys only: a
// key it does not declare keeps its value in v.
func fillSet(c *cli.Context, v any) {
	declared := map[string]bool{}
	for _, f := range c.Command.Flags {
		declared[f.Names()[0]] = true
	}
	eachKey(reflect.ValueOf(v).Elem(), func(key, _ string, f reflect.Value) {
		if declared[key] {
			setFrom(c, key, f)
		}
	})
}

// setFrom sets the field f from the flag key.
func setFrom(c *cli.Context, key string, f reflect.Value) {
	switch f.Interface().(type) {
	case string:
		f.SetString(c.String(key))
	case bool:
		f.SetBool(c.Bool(key))
	case int:
		f.SetInt(int64(c.Int(key)))
	case time.Duration:
		f.SetInt(int64(c.Duration(key)))
	case []string:
		f.Set(reflect.ValueOf(c.StringSlice(key)))
	}
}

// eachKey calls fn with every keyed field of the struct sv, walking into
// embedded structs.
func eachKey(sv reflect.Value, fn func(key, usage string, f reflect.Value)) {
	for i := range sv.NumField() {
		sf := sv.Type().Field(i)
		if sf.Anonymous {
			eachKey(sv.Field(i), fn)
			continue
		}
		if key := sf.Tag.Get("key"); key != "" {
			fn(key, sf.Tag.Get("usage"), sv.Field(i))
		}
	}
}

// require marks the flags named keys as required.
func require(flags []cli.Flag, keys ...string) []cli.Flag {
	for _, f := range flags {
		for _, k := range keys {
			if s, ok := f.(*cli.StringFlag); ok && s.Name == k {
				s.Required = true
			}
		}
	}
	return flags
}

// omit returns flags without those named keys.
func omit(flags []cli.Flag, keys ...string) []cli.Flag {
	var out []cli.Flag
	for _, f := range flags {
		if !slices.Contains(keys, f.Names()[0]) {
			out = append(out, f)
		}
	}
	return out
}

// pick returns the flags named keys only.
func pick(flags []cli.Flag, keys ...string) []cli.Flag {
	var out []cli.Flag
	for _, f := range flags {
		if slices.Contains(keys, f.Names()[0]) {
			out = append(out, f)
		}
	}
	return out
}
