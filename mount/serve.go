package mount

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/fuse"
	"github.com/amlfs/amlfs/native"
	"github.com/amlfs/amlfs/revision"
	"golang.org/x/sys/unix"
)

// How the workspace is served (--serve).
const (
	// ServeNative bind-mounts the working directory: the sandbox's system
	// calls never reach the daemon (package native).
	ServeNative = "native"
	// ServeFUSE serves the working directory through FUSE.
	ServeFUSE = "fuse"
	// ServeAuto is native where it can run, else FUSE.
	ServeAuto = "auto"
)

// DefaultServe is --serve's default: native wherever it can run.
const DefaultServe = ServeAuto

// nativeBlocker says what in cfg native serving cannot honour, or "".
func nativeBlocker(cfg *Config) string {
	if !cfg.Access.AllowOther || !cfg.Access.DefaultPermissions {
		return "a bind mount is reached by every local user by the files' owners and modes (allow_other,default_permissions); -o asks for other access"
	}
	for _, o := range cfg.fuseOptions {
		switch o {
		case "allow_other", "default_permissions", "ro", "rw":
		default:
			return fmt.Sprintf("-o %s is a FUSE option", o)
		}
	}
	return ""
}

// chooseServe settles d.serve from --serve and what this host can do. A
// refused --serve native is an error; auto falls back with one log line.
func (d *Daemon) chooseServe() error {
	cfg := &d.cfg
	if cfg.Serve == ServeFUSE {
		d.serve, d.serveWhy = ServeFUSE, "--serve fuse"
		return nil
	}
	ok, why := false, nativeBlocker(cfg)
	if why == "" {
		ok, why = native.Supported(cfg.CacheDir)
	}
	switch {
	case ok:
		d.serve, d.serveWhy = ServeNative, "--serve "+cfg.Serve+": "+why+": a bind mount, with lazy restore by fanotify pre-content events"
		if cfg.Serve == ServeAuto {
			d.log.Info("--serve auto: serving natively", "why", why)
		}
	case cfg.Serve == ServeNative:
		return amlerr.New(amlerr.InvalidConfig, cfg.Mountpoint, "--serve native cannot run here: %s", why)
	default:
		d.serve, d.serveWhy = ServeFUSE, "--serve auto: native serving cannot run here: "+why
		d.log.Info("serving through FUSE: native serving cannot run here", "why", why)
	}
	return nil
}

// checkServe reports how the workspace would be served, and why.
func checkServe(r *CheckReport, cfg Config) {
	d := &Daemon{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	if err := d.chooseServe(); err != nil {
		r.add("serve", "fail", "%v", err)
		return
	}
	r.add("serve", "ok", "%s: %s", d.serve, d.serveWhy)
}

// mountNative populates every directory of a lazy tree (no lookup makes
// them on demand), bind-mounts the working directory, and mounts each live
// mount on its own FUSE connection inside it.
func (d *Daemon) mountNative(ctx context.Context, live []fuse.Live, log *slog.Logger) (server, error) {
	cfg := &d.cfg
	start := time.Now()
	opts := native.Options{Dir: d.workDir, Mountpoint: cfg.Mountpoint, At: d.at, Pending: revision.PendingXattr(),
		Content: d.ws.Placeholders(), ReadOnly: slices.Contains(cfg.fuseOptions, "ro"), Log: log,
		Keeper: cfg.Keeper, KeeperPID: filepath.Join(filepath.Dir(d.slot.Name()), "keeper.pid")}
	// The groups first, so each placeholder is marked as it is made: a
	// tree made here then needs no second walk of its files.
	srv, err := native.New(opts)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		d.ws.Placeholders().OnMade(nil)
		if !started {
			srv.Abandon()
		}
	}()
	// A placeholder marked as it is made holds the daemon's own reads
	// too (the git indexes' refresh): they go through the events, which
	// are answered from now on.
	srv.ServePlaceholders()
	d.ws.Placeholders().FillOnAccess()
	d.ws.Placeholders().OnMade(srv.MarkPlaceholder)
	if err := d.ws.Placeholders().PopulateAll(ctx); err != nil {
		return nil, err
	}
	// A restore made new inodes: git's indexes are pointed at them, so
	// that the first git status neither rehashes nor fetches the tree.
	// It only saves work: a failure is logged, never fatal.
	// A linked worktree records its path as the sandbox sees it.
	seen := cfg.Mountpoint
	if cfg.SandboxPath != "" {
		seen = cfg.SandboxPath
	}
	if gr, err := d.ws.RefreshGitIndexes(ctx, seen); err != nil {
		log.Warn("refresh git indexes after the restore", "err", err)
	} else if gr.Indexes > 0 {
		log.Info("git indexes refreshed after the restore", "indexes", gr.Indexes, "entries", gr.Refreshed, "left alone", gr.Left,
			"racy", gr.Racy, "not saved", gr.NotSaved, "stale", gr.Stale, "unrestored", gr.Unrestored)
	}
	// A tree made here, not resumed or adopted, holds only placeholders
	// made since OnMade: each is marked already.
	if err := d.serveNatively(srv, d.workDir, d.fresh && !d.adopted, live); err != nil {
		return nil, err
	}
	started = true
	log.Info("serving natively", "placeholders", srv.Pending(), "seconds", time.Since(start).Seconds())
	return srv, nil
}

// serveNatively makes the live mounts' prefixes in opts.Dir, names the
// control socket on it, bind-mounts it, and mounts each live mount inside.
func (d *Daemon) serveNatively(srv *native.Server, dir string, premarked bool, live []fuse.Live) error {
	for _, l := range live {
		if err := os.MkdirAll(filepath.Join(dir, filepath.FromSlash(l.Rel)), 0o755); err != nil {
			return err
		}
	}
	// How a client with nothing but the mountpoint finds the daemon, as
	// the FUSE root's virtual xattr tells it: a trusted.* xattr, which
	// only root may set or read, so no sandbox user can plant one. A
	// user.* one an earlier version set is removed.
	unix.Removexattr(dir, fuse.ControlXattr)
	if err := unix.Setxattr(dir, NativeControlXattr, []byte(SocketPath(d.cfg.Mountpoint)), 0); err != nil {
		d.log.Debug("name the control socket on the root", "err", err)
	}
	if err := srv.Start(premarked); err != nil {
		return err
	}
	return d.mountLiveInside(srv, live)
}

// NativeControlXattr names the control socket on a natively served
// root. Only root (CAP_SYS_ADMIN) may set or read trusted.* xattrs.
const NativeControlXattr = "trusted.amlfs.control"

// mountLiveInside mounts each live mount on its own FUSE connection at its
// prefix inside the natively served srv; on a failure it unmounts them
// all, and srv.
func (d *Daemon) mountLiveInside(srv *native.Server, live []fuse.Live) error {
	cfg := &d.cfg
	name := cfg.ID
	if cfg.Store == StoreNone {
		name = StoreNone
	}
	for i, l := range live {
		m := cfg.Live[i]
		// Resolved beneath the workspace's own mount, with no symlink
		// followed: the sandbox may change what is in it.
		at, err := srv.Mount().Beneath(filepath.FromSlash(l.Rel))
		if err != nil {
			d.unmountLive()
			srv.Unmount(time.Second, true)
			srv.Close()
			return fmt.Errorf("live mount %s: %w", m.Prefix, err)
		}
		fs, err := fuse.MountLive(at, l, m.Kind == "s3", fuse.Options{FsName: "amlfs:" + name + ":" + m.Prefix, MountOptions: cfg.fuseOptions,
			Timeout: cfg.Timeout, Debug: cfg.Debug, Log: d.log.With("provider", m.Kind, "mount", m.Prefix), Ops: d.metrics})
		if err != nil {
			d.unmountLive()
			srv.Unmount(time.Second, true)
			srv.Close()
			return fmt.Errorf("live mount %s: %w", m.Prefix, err)
		}
		d.liveFS = append(d.liveFS, fs)
	}
	return nil
}

// mountNoWorkspaceNative serves --store none natively: dir, holding only
// the live mounts' prefixes, bind-mounted read-only, with each live mount
// its own FUSE connection inside it.
func (d *Daemon) mountNoWorkspaceNative(dir string, live []fuse.Live) (server, error) {
	srv, err := native.New(native.Options{Dir: dir, Mountpoint: d.cfg.Mountpoint, At: d.at, ReadOnly: true, Log: d.log})
	if err != nil {
		return nil, err
	}
	if err := d.serveNatively(srv, dir, false, live); err != nil {
		srv.Abandon()
		return nil, err
	}
	return srv, nil
}

// unmountLive unmounts the live mounts' own FUSE connections, innermost
// first.
func (d *Daemon) unmountLive() {
	for i := len(d.liveFS) - 1; i >= 0; i-- {
		if err := d.liveFS[i].Unmount(3*time.Second, true); err != nil {
			d.log.Error("unmount a live mount", "provider", "daemon", "op", "unmount", "err", err)
		}
	}
	d.liveFS = nil
}
