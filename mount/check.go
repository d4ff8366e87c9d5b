package mount

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/fuse"
	"github.com/amlfs/amlfs/mount/mountpoint"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"golang.org/x/sys/unix"
)

// CheckItem is one line of the preflight report.
type CheckItem struct {
	What   string `json:"what"`
	Status string `json:"status"` // ok, warn or fail
	Detail string `json:"detail"`
}

// CheckReport is the preflight's result.
type CheckReport struct {
	Items []CheckItem  `json:"items"`
	Store *store.Probe `json:"store,omitempty"`
}

// Failed reports whether any item failed.
func (r CheckReport) Failed() bool {
	for _, it := range r.Items {
		if it.Status == "fail" {
			return true
		}
	}
	return false
}

func (r *CheckReport) add(what, status, format string, args ...any) {
	r.Items = append(r.Items, CheckItem{What: what, Status: status, Detail: fmt.Sprintf(format, args...)})
}

// Check is the preflight: configuration, the store's reachability, access
// and conditional-write support, the mountpoint and FUSE, and settings that
// will not survive on, or be reachable from, another host. It never
// changes the store beyond a scratch key it removes.
func Check(ctx context.Context, cfg Config) (CheckReport, error) {
	var r CheckReport
	mp := cfg.Mountpoint
	if mp == "" {
		cfg.Mountpoint = "/" + "nonexistent-amlfs-check" // Normalize needs one
	}
	if err := cfg.Normalize(); err != nil {
		r.add("config", "fail", "%v", err)
		return r, err
	}
	r.add("config", "ok", "flags and globs are valid")
	checkAccess(&r, cfg.Access, os.Geteuid() == 0)
	spec, _ := ParseStore(cfg.Store)
	if spec.Kind == "file" {
		r.add("store locality", "warn", "%s is a local directory: it will not survive this host, and other hosts cannot reach it", cfg.Store)
	}
	for what, raw := range map[string]string{"--s3-endpoint": cfg.S3.Endpoint, "AWS_ENDPOINT_URL": os.Getenv("AWS_ENDPOINT_URL")} {
		if raw != "" && isLocalURL(raw) {
			r.add("endpoint locality", "warn", "%s %s points at this host; another host cannot reach it", what, raw)
		}
	}
	id := cfg.ID
	if id == "" {
		id = "amlfs-check"
	}
	st, err := OpenStore(ctx, cfg.Store, cfg.S3, id)
	if err != nil {
		r.add("store", "fail", "%v", err)
		return r, err
	}
	p := st.Probe(ctx)
	r.Store = &p
	switch {
	case !p.Reachable:
		r.add("store", "fail", "%s is not reachable: %s", st, p.Error)
	case !p.Writable:
		r.add("store", "fail", "%s is reachable but not writable: %s", st, p.Error)
	default:
		r.add("store", "ok", "%s is reachable and writable", st)
		if p.IfNoneMatch && p.IfMatch {
			r.add("conditional writes", "ok", "If-None-Match: * and If-Match are honoured")
		} else if cfg.UnsafeNoConditionalWrites {
			r.add("conditional writes", "warn", "NOT honoured (%s); allowed by --unsafe-no-conditional-writes", p.Error)
		} else {
			r.add("conditional writes", "fail", "NOT honoured (%s): mount will refuse to lock or publish here", p.Error)
		}
	}
	if cfg.ID != "" {
		checkIndex(ctx, &r, st)
	}
	checkFUSE(&r, cfg.fuseOptions)
	checkServe(&r, cfg)
	if mp != "" {
		checkMountpoint(&r, cfg)
	}
	if r.Failed() {
		for _, it := range r.Items {
			if it.Status == "fail" && it.What == "conditional writes" {
				return r, amlerr.New(amlerr.UnsafeStore, st.String(), "%s", it.Detail)
			}
		}
		return r, errors.New("preflight found problems")
	}
	return r, nil
}

// checkFUSE says whether this user can mount: what is missing if
// /dev/fuse or the setuid fusermount3 is, and otherwise the outcome of a
// real mount, with the -o options mount would use, of an empty tree on a
// scratch directory.
func checkFUSE(r *CheckReport, opts []string) {
	root := os.Geteuid() == 0
	if _, err := os.Stat("/dev/fuse"); err != nil {
		r.add("fuse", "fail", "/dev/fuse: %v (a container needs --device /dev/fuse and CAP_SYS_ADMIN)", err)
		return
	}
	how := "as root amlfs mounts /dev/fuse directly"
	if !root {
		p, err := fusermountPath()
		if err != nil {
			r.add("fuse", "fail", "/dev/fuse is present, but a user other than root mounts through the setuid fusermount3, which is missing: apt-get install fuse3")
			return
		}
		if fi, err := os.Stat(p); err != nil || fi.Mode()&os.ModeSetuid == 0 {
			r.add("fuse", "fail", "%s is not setuid root, so it cannot mount for a user other than root", p)
			return
		}
		if err := unix.Access("/dev/fuse", unix.R_OK|unix.W_OK); err != nil {
			mode := ""
			if fi, err := os.Stat("/dev/fuse"); err == nil {
				mode = fmt.Sprintf(" (mode %v)", fi.Mode().Perm())
			}
			r.add("fuse", "fail", "/dev/fuse%s cannot be opened by this user: %v; fusermount3 opens it as the calling user, so it must be mode 0666, as distributions ship it (chmod 0666 /dev/fuse, or --device /dev/fuse in a container)", mode, err)
			return
		}
		how = p + " mounts for this user"
	}
	if err := trialMount(opts); err != nil {
		said := ""
		if strings.Contains(err.Error(), "fusermount") {
			said = " (fusermount3 printed why, above)"
		}
		r.add("fuse", "fail", "a trial mount failed: %v%s", err, said)
		return
	}
	r.add("fuse", "ok", "a trial mount worked (%s)", how)
}

// checkMountpoint says whether mount would take the mountpoint.
func checkMountpoint(r *CheckReport, cfg Config) {
	mp := cfg.Mountpoint
	at, err := mountpoint.Open(mp, mountpoint.Policy{AllowUserOwnedParents: cfg.AllowUserOwnedParents})
	var me *mountpoint.Error
	switch {
	case errors.As(err, &me):
		r.add("mountpoint", "fail", "%s: %s", me.Path, me.Msg)
		return
	case errors.Is(err, os.ErrNotExist):
		r.add("mountpoint", "ok", "%s does not exist; mount will create it", mp)
		return
	case err != nil:
		r.add("mountpoint", "fail", "%v", err)
		return
	}
	defer at.Close()
	if mounted, _ := at.IsMounted(); !mounted {
		r.add("mountpoint", "ok", "%s is free", mp)
		return
	}
	top, err := at.Top()
	if err == nil {
		err = probeFD(top)
		top.Close()
	}
	if isDead(err) {
		r.add("mountpoint", "warn", "%s is a dead mount; mount will clean it", mp)
	} else {
		r.add("mountpoint", "fail", "%s is already a mount point", mp)
	}
}

// trialMount mounts an empty tree on a scratch directory as mount would,
// lists its root through the kernel, and unmounts it. It never leaves the
// mount behind: a root that does not answer within 10 s is detached.
func trialMount(opts []string) error {
	dir, err := os.MkdirTemp("", "amlfs-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	backing, mp := filepath.Join(dir, "tree"), filepath.Join(dir, "mnt")
	for _, d := range []string{backing, mp} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	at, err := mountpoint.Open(mp, mountpoint.Policy{})
	if err != nil {
		return err
	}
	defer at.Close()
	f, err := fuse.Mount(at, fuse.Options{Dir: backing, FsName: "amlfs:check", MountOptions: opts})
	if err != nil {
		return err
	}
	listed := make(chan error, 1)
	go func() {
		_, err := os.ReadDir(mp)
		listed <- err
	}()
	select {
	case err = <-listed:
	case <-time.After(10 * time.Second):
		err = errors.New("the trial mount did not answer within 10 s")
	}
	if uerr := f.Unmount(5*time.Second, true); uerr != nil && err == nil {
		err = fmt.Errorf("unmount the trial mount: %w", uerr)
	}
	return err
}

// checkAccess says who can reach the mount, and what that needs.
func checkAccess(r *CheckReport, a Access, root bool) {
	switch {
	case a.AllowOther && !a.DefaultPermissions:
		r.add("access", "warn", "%s", a)
	case a.AllowOther && !root && !userAllowOther():
		r.add("access", "fail", "%s: a non-root mount needs user_allow_other in /etc/fuse.conf", a)
	default:
		r.add("access", "ok", "%s", a)
	}
}

// userAllowOther reports whether /etc/fuse.conf lets non-root users mount
// with allow_other.
func userAllowOther() bool {
	b, err := os.ReadFile("/etc/fuse.conf")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) == "user_allow_other" {
			return true
		}
	}
	return false
}

// checkIndex reports whether the workspace's index loads.
func checkIndex(ctx context.Context, r *CheckReport, st store.Store) {
	data, _, err := st.ReadIndex(ctx)
	switch {
	case errors.Is(err, store.ErrNotExist):
		r.add("workspace", "ok", "no index yet: a new workspace")
	case err != nil:
		r.add("workspace", "fail", "read index: %v", err)
	default:
		idx, err := format.ParseIndex(data)
		if err != nil {
			r.add("workspace", "fail", "%v", err)
			return
		}
		r.add("workspace", "ok", "current revision %s, %d revisions", idx.Current, len(idx.Revisions))
	}
}

func isLocalURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// fusermountPath finds the helper go-fuse mounts with when not root.
func fusermountPath() (string, error) {
	for _, bin := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(bin); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no fusermount3 or fusermount on PATH")
}
