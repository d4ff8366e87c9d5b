package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/amlfs/amlfs/amlerr"
)

// FuzzConfigFile feeds arbitrary YAML to --config, through the same flag
// loading and config normalization a mount does (without mounting): a bad
// file is an INVALID_CONFIG error with exit status 2, never a panic, and a
// good one gives a config that passed every check.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"store: s3://bucket/aml/workspaces\nid: demo\n",
		"mount: [\"/data=file:///srv/data,ro\"]\nretention: 3\n",
		"retention: -1\n",
		"include: ['[']\n",
		"mount: [\"/=file:///x\"]\n",
		"cache-size: 12XB\n",
		"kernel-cache: forever\n",
		"store: {a: b}\n",
		"- just\n- a list\n",
		"\x00\x01",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, yaml string) {
		file := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := mountCommand()
		cmd.Action = func(c *cli.Context) error {
			cfg := configFrom(c, "/mnt/fuzz")
			return cfg.Normalize()
		}
		app := &cli.App{Name: "amlfs", Commands: []*cli.Command{cmd}, Writer: io.Discard, ErrWriter: io.Discard,
			ExitErrHandler: func(*cli.Context, error) {}}
		err := app.Run([]string{"amlfs", "mount", "--config", file, "/mnt/fuzz"})
		if err != nil && (amlerr.Code(err) != amlerr.InvalidConfig || amlerr.ExitStatus(err) != amlerr.ExitUsage) {
			t.Fatalf("rejected without INVALID_CONFIG and exit status 2: %v", err)
		}
	})
}

// The command line wins over AMLFS_* variables, which win over --config.
func TestFlagSources(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(file, []byte("store: file:///from/file\nid: file-id\nretention: 7\n"), 0o600)
	t.Setenv("AMLFS_STORE", "file:///from/env")
	t.Setenv("AMLFS_ID", "env-id")
	t.Setenv("AMLFS_CONFIG", file)
	cmd := mountCommand()
	var got [3]string
	cmd.Action = func(c *cli.Context) error {
		cfg := configFrom(c, "/mnt/x")
		got = [3]string{cfg.Store, cfg.ID, fmt.Sprint(cfg.Retention)}
		return nil
	}
	app := &cli.App{Name: "amlfs", Commands: []*cli.Command{cmd}, Writer: io.Discard, ErrWriter: io.Discard}
	if err := app.Run([]string{"amlfs", "mount", "--id", "cli-id", "/mnt/x"}); err != nil {
		t.Fatal(err)
	}
	if got != [3]string{"file:///from/env", "cli-id", "7"} {
		t.Errorf("store, id, retention = %q", got)
	}
}

// A key that names no flag (a typo) fails the command with INVALID_CONFIG,
// naming the key, before anything runs.
func TestConfigUnknownKey(t *testing.T) {
	for _, tc := range []struct{ yaml, bad string }{
		{"store: file:///s\nexlude: ['*.key']\n", "exlude"},
		{"config: other.yaml\n", "config"},
	} {
		file := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(file, []byte(tc.yaml), 0o600)
		cmd := mountCommand()
		ran := false
		cmd.Action = func(c *cli.Context) error { ran = true; return nil }
		app := &cli.App{Name: "amlfs", Commands: []*cli.Command{cmd}, Writer: io.Discard, ErrWriter: io.Discard}
		err := app.Run([]string{"amlfs", "mount", "--config", file, "/mnt/x"})
		if amlerr.Code(err) != amlerr.InvalidConfig || !strings.Contains(err.Error(), tc.bad) || ran {
			t.Errorf("%q: %v (ran %v)", tc.yaml, err, ran)
		}
	}
	// Every flag name is a valid key.
	file := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(file, []byte("exclude: ['*.key']\nstrict-entries: true\nmax-bytes: 2GiB\n"), 0o600)
	cmd := mountCommand()
	cmd.Action = func(c *cli.Context) error { return nil }
	app := &cli.App{Name: "amlfs", Commands: []*cli.Command{cmd}, Writer: io.Discard, ErrWriter: io.Discard}
	if err := app.Run([]string{"amlfs", "mount", "--config", file, "/mnt/x"}); err != nil {
		t.Error(err)
	}
}
