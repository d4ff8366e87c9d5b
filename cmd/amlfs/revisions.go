package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/mount"
	"github.com/amlfs/amlfs/revision"
	"github.com/amlfs/amlfs/revision/format"
)

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// revisionFlags are storeFlags and --json.
func revisionFlags() []cli.Flag {
	return append(storeFlags(), &cli.BoolFlag{Name: "json"})
}

// openWorkspace opens the workspace named by --store and --id. Readers
// take no lease; a writer (lock, or publishing unlocked) first checks that
// the store honours conditional writes.
func openWorkspace(c *cli.Context, lock bool, opts revision.Options) (*revision.Workspace, error) {
	return openWorkspaceFor(c, lock, false, opts)
}

func openWorkspaceFor(c *cli.Context, lock, publish bool, opts revision.Options) (*revision.Workspace, error) {
	sc, lc, err := storeFrom(c)
	if err != nil {
		return nil, err
	}
	st, err := mount.OpenStore(c.Context, sc.Store, sc.S3, sc.ID)
	if err != nil {
		return nil, err
	}
	if lock || publish {
		notify := func(format string, args ...any) { fmt.Fprintf(c.App.ErrWriter, "amlfs: "+format+"\n", args...) }
		memo := mount.NewProbeMemo(mount.DefaultCacheDir(), sc.Store, sc.S3Endpoint)
		if err := mount.CheckConditionalWrites(c.Context, st, memo, sc.UnsafeNoConditionalWrites, notify); err != nil {
			return nil, err
		}
	}
	opts.ID = sc.ID
	opts.NoLock = !lock
	opts.Limits = lc.Limits
	ws, err := revision.Open(c.Context, st, opts)
	if err != nil {
		return nil, err
	}
	if ws.Index() == nil {
		ws.Close(c.Context)
		return nil, amlerr.New(amlerr.InvalidStore, opts.ID, "workspace has no revisions in %s", st)
	}
	return ws, nil
}

type revisionInfo struct {
	format.Entry
	Current bool  `json:"current"`
	Entries int   `json:"entries"`
	Files   int   `json:"files"`
	Bytes   int64 `json:"bytes"`
	// ForkOf names the revision of another workspace this one, a fork's
	// first revision, began from.
	ForkOf *format.ForkOrigin `json:"forkOf,omitempty"`
}

func describe(ctx context.Context, ws *revision.Workspace, e format.Entry) (revisionInfo, []format.TreeEntry, error) {
	tree, fork, err := ws.Describe(ctx, e)
	if err != nil {
		return revisionInfo{}, nil, err
	}
	info := revisionInfo{Entry: e, Current: ws.Index().Current == e.ID, Entries: len(tree), ForkOf: fork}
	for _, te := range tree {
		if te.Type == format.TypeFile {
			info.Files++
			info.Bytes += te.Size
		}
	}
	return info, tree, nil
}

func revisionsCommand() *cli.Command {
	return &cli.Command{
		Name:  "revisions",
		Usage: "list, show and restore a workspace's revisions",
		Subcommands: []*cli.Command{
			{
				Name:  "list",
				Usage: "list revisions, newest first, with entry counts and bytes from the store",
				Flags: revisionFlags(),
				Action: func(c *cli.Context) error {
					ws, err := openWorkspace(c, false, revision.Options{})
					if err != nil {
						return err
					}
					defer ws.Close(c.Context)
					var out []revisionInfo
					for _, e := range ws.Index().Revisions {
						info, _, err := describe(c.Context, ws, e)
						if err != nil {
							return err
						}
						out = append(out, info)
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, out)
					}
					for _, r := range out {
						mark := " "
						if r.Current {
							mark = "*"
						}
						fmt.Fprintf(c.App.Writer, "%s %s  %s  %-7s  %6d entries  %12d bytes\n", mark, r.ID, r.CreatedAt, r.Format, r.Entries, r.Bytes)
					}
					return nil
				},
			},
			{
				Name:      "show",
				Usage:     "list a revision's entries",
				ArgsUsage: "REVISION",
				Flags:     revisionFlags(),
				Action: func(c *cli.Context) error {
					rev, err := oneArg(c, "REVISION")
					if err != nil {
						return err
					}
					ws, err := openWorkspace(c, false, revision.Options{})
					if err != nil {
						return err
					}
					defer ws.Close(c.Context)
					e, err := ws.Resolve(rev)
					if err != nil {
						return err
					}
					info, tree, err := describe(c.Context, ws, e)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, struct {
							revisionInfo
							Tree []format.TreeEntry `json:"tree"`
						}{info, tree})
					}
					fmt.Fprintf(c.App.Writer, "revision %s (%s, %s): %d entries, %d bytes\n", e.ID, e.Format, e.CreatedAt, info.Entries, info.Bytes)
					if f := info.ForkOf; f != nil {
						from := f.Revision
						if from == "" {
							from = "a tree never saved"
						}
						fmt.Fprintf(c.App.Writer, "forked from workspace %q, revision %s\n", f.ID, from)
					}
					for _, te := range tree {
						kind, name := "f", te.Path
						switch te.Type {
						case format.TypeDir:
							kind = "d"
						case format.TypeSymlink:
							kind, name = "l", te.Path+" -> "+te.Target
						}
						fmt.Fprintf(c.App.Writer, "%s %04o %12d  %s\n", kind, te.Mode, te.Size, name)
					}
					return nil
				},
			},
			{
				Name:      "diff",
				Usage:     "the paths added, removed and changed from revision A to revision B, with sizes (A or B may be \"current\")",
				ArgsUsage: "A B",
				Flags:     revisionFlags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return amlerr.New(amlerr.InvalidConfig, "", "diff takes two revisions, A and B")
					}
					ws, err := openWorkspace(c, false, revision.Options{})
					if err != nil {
						return err
					}
					defer ws.Close(c.Context)
					a, err := ws.Resolve(c.Args().Get(0))
					if err != nil {
						return err
					}
					b, err := ws.Resolve(c.Args().Get(1))
					if err != nil {
						return err
					}
					changes, err := ws.Diff(c.Context, a, b)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						if changes == nil {
							changes = []revision.Change{}
						}
						return printJSON(c.App.Writer, changes)
					}
					for _, ch := range changes {
						fmt.Fprintln(c.App.Writer, describeChange(ch))
					}
					return nil
				},
			},
			{
				Name:      "restore",
				Usage:     "publish an older revision's content as a new current revision; prints its id",
				ArgsUsage: "REVISION",
				Flags: append(revisionFlags(),
					append(pick(storeWriterFlags(), writerKeys...),
						&cli.IntFlag{Name: "retention", Value: 1, Usage: "revisions kept, counting the new current one"},
						&cli.StringFlag{Name: "format", Usage: "format of the new revision: archive or folder (default: the current revision's)"},
						&cli.StringFlag{Name: "cache-dir", DefaultText: "$XDG_CACHE_HOME/amlfs"})...,
				),
				Action: func(c *cli.Context) error {
					rev, err := oneArg(c, "REVISION")
					if err != nil {
						return err
					}
					ws, err := openWorkspaceFor(c, !c.Bool("no-lock"), true, revision.Options{Retention: c.Int("retention"), Format: c.String("format")})
					if err != nil {
						return err
					}
					e, err := ws.Resolve(rev)
					if err != nil {
						ws.Close(c.Context)
						return err
					}
					cache := c.String("cache-dir")
					if cache == "" {
						cache = mount.DefaultCacheDir()
					}
					if err := os.MkdirAll(cache, 0o700); err != nil {
						ws.Close(c.Context)
						return err
					}
					tmp, err := os.MkdirTemp(cache, "restore-")
					if err != nil {
						ws.Close(c.Context)
						return err
					}
					defer os.RemoveAll(tmp)
					tree := filepath.Join(tmp, "tree")
					if _, err := ws.Restore(c.Context, e.ID, tree, format.Selection{}); err != nil {
						ws.Close(c.Context)
						return err
					}
					// The restored tree is saved whole: no .gitignore filtering.
					res, err := ws.Save(c.Context, tree, format.Selection{NoGitignore: true}, "")
					if cerr := ws.Close(c.Context); err == nil && cerr != nil {
						err = cerr
					}
					if err != nil {
						return err
					}
					fmt.Fprintln(c.App.Writer, res.Entry.ID)
					return nil
				},
			},
		},
	}
}

// describeChange is one line of `revisions diff`: A (added), D (removed)
// or M (changed), the path, and its sizes, modes or types.
func describeChange(ch revision.Change) string {
	switch ch.Kind {
	case "added":
		return fmt.Sprintf("A  %s  %s", ch.Path, sizeOf(ch.NewType, ch.NewSize))
	case "removed":
		return fmt.Sprintf("D  %s  %s", ch.Path, sizeOf(ch.OldType, ch.OldSize))
	}
	line := fmt.Sprintf("M  %s  %s -> %s", ch.Path, sizeOf(ch.OldType, ch.OldSize), sizeOf(ch.NewType, ch.NewSize))
	if ch.OldMode != ch.NewMode {
		line += fmt.Sprintf("  mode %04o -> %04o", ch.OldMode, ch.NewMode)
	}
	if ch.OldSize == ch.NewSize && ch.OldMode == ch.NewMode && ch.OldType == ch.NewType {
		line += "  (content)"
	}
	return line
}

func sizeOf(typ string, size int64) string {
	switch typ {
	case format.TypeDir:
		return "directory"
	case format.TypeSymlink:
		return "symlink"
	}
	return fmt.Sprintf("%d bytes", size)
}
