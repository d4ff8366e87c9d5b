package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/mount"
)

// destroyCommand removes a workspace's durable state: index, revisions
// and lock. Unmount is stop; this is destroy.
func destroyCommand() *cli.Command {
	return &cli.Command{
		Name:  "destroy",
		Usage: "remove a workspace's durable state (index, revisions, lock); refuses while a live lease is held; safe to repeat",
		Flags: append(omit(storeFlags(), "max-entries", "max-bytes", "max-archive-bytes"),
			&cli.BoolFlag{Name: "yes", Usage: "confirm: every revision of the workspace is removed"},
			&cli.BoolFlag{Name: "purge-cache", Usage: "also remove the local working trees and recovery state under --cache-dir"},
			&cli.StringFlag{Name: "cache-dir", DefaultText: "$XDG_CACHE_HOME/amlfs"},
		),
		Action: func(c *cli.Context) error {
			id := c.String("id")
			if !c.Bool("yes") {
				return amlerr.New(amlerr.InvalidConfig, id, "destroy removes every revision of the workspace; pass --yes")
			}
			sc, _, err := storeFrom(c)
			if err != nil {
				return err
			}
			st, err := mount.OpenStore(c.Context, sc.Store, sc.S3, id)
			if err != nil {
				return err
			}
			cache := c.String("cache-dir")
			if cache == "" {
				cache = mount.DefaultCacheDir()
			}
			// Taking the lease proves no live writer holds it (a stale
			// lease, or one a crashed mount of this host and cache dir
			// left, is taken over, as a mount would).
			lease, err := st.Lock(c.Context, func(error) {}, mount.DeadHolder(cache, st, id))
			if err != nil {
				return err
			}
			err = st.Destroy(c.Context)
			// The lock went with the root: releasing finds nothing.
			lease.Release(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("purge-cache") {
				if err := mount.PurgeCache(cache, st, id); err != nil {
					return err
				}
			}
			fmt.Fprintf(c.App.ErrWriter, "amlfs: destroyed workspace %s in %s\n", id, st)
			return nil
		},
	}
}
