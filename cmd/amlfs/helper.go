package main

import (
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/amlfs/amlfs/amlerr"
)

// isMountHelper reports whether amlfs was started as mount(8)'s helper for
// `mount -t fuse.amlfs` and fstab: /sbin/mount.fuse.amlfs, a link to it.
func isMountHelper(argv0 string) bool {
	base := filepath.Base(argv0)
	return base == "mount.fuse.amlfs" || base == "mount.amlfs"
}

// helperIgnored are options mount(8), mount.fuse and systemd add or pass
// that mean nothing to amlfs (FUSE mounts are nosuid and nodev already).
var helperIgnored = map[string]bool{
	"defaults": true, "auto": true, "noauto": true, "user": true, "users": true, "nouser": true,
	"owner": true, "group": true, "_netdev": true, "nofail": true, "rw": true, "dev": true, "nodev": true,
	"suid": true, "nosuid": true, "exec": true, "noexec": true, "async": true, "atime": true,
	"noatime": true, "relatime": true, "norelatime": true, "strictatime": true, "lazytime": true,
	"nolazytime": true, "loud": true, "silent": true,
}

// helperFuse are options passed on to the FUSE mount.
var helperFuse = map[string]bool{"allow_other": true, "default_permissions": true, "noallow_other": true, "no_default_permissions": true, "ro": true, "uid": true, "gid": true, "umask": true}

// helperArgs turns a mount helper call,
//
//	mount.fuse.amlfs SOURCE MOUNTPOINT [-sfnv] [-N NS] [-o OPTS] [-t TYPE]
//
// into the amlfs command line it stands for: `amlfs mount --daemon
// MOUNTPOINT --store SOURCE`, with each -o option that names a mount flag
// (id=demo, retention=3, no-lock, config=/etc/amlfs/demo.yaml) given as
// that flag, FUSE's own options (allow_other, default_permissions, ro,
// uid=, gid=, umask=) as -o, and the options mount(8) and systemd inject
// (defaults, _netdev, nofail, x-systemd.*, comment=...) dropped. SOURCE
// "amlfs" means the default store. A flag's value cannot hold a comma; put
// such values in the config file.
func helperArgs(args []string, flags []cli.Flag) ([]string, error) {
	bad := func(format string, a ...any) ([]string, error) {
		return nil, amlerr.New(amlerr.InvalidConfig, "", "mount helper: "+format, a...)
	}
	var pos, opts []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "-o", "-N", "-t":
			if i+1 == len(args) {
				return bad("%s needs a value", a)
			}
			if a == "-o" {
				opts = append(opts, strings.Split(args[i+1], ",")...)
			}
			i++
		case "-s", "-f", "-n", "-v", "-sloppy":
		default:
			if strings.HasPrefix(a, "-") {
				if strings.HasPrefix(a, "-o") {
					opts = append(opts, strings.Split(a[2:], ",")...)
					continue
				}
				return bad("unknown argument %q", a)
			}
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return bad("want SOURCE MOUNTPOINT, got %q", pos)
	}
	takes := map[string]bool{} // flag name -> takes a value
	for _, f := range flags {
		tv, ok := f.(interface{ TakesValue() bool })
		for _, n := range f.Names() {
			takes[n] = !ok || tv.TakesValue()
		}
	}
	out := []string{"amlfs", "mount", "--daemon", pos[1]}
	if pos[0] != "amlfs" {
		out = append(out, "--store", pos[0])
	}
	var fuseOpts []string
	for _, o := range opts {
		k, v, hasV := strings.Cut(o, "=")
		switch {
		case o == "" || helperIgnored[o] || strings.HasPrefix(o, "x-") || k == "comment":
		case helperFuse[k]:
			fuseOpts = append(fuseOpts, o)
		case k == "o" || k == "daemon" || k == "store":
			return bad("option %q cannot be given here", k)
		default:
			valued, known := takes[k]
			if !known {
				return bad("unknown option %q", o)
			}
			if valued != hasV {
				if valued {
					return bad("option %q needs a value (%s=...)", k, k)
				}
				return bad("option %q takes no value", k)
			}
			if hasV {
				out = append(out, "--"+k+"="+v)
			} else {
				out = append(out, "--"+k)
			}
		}
	}
	if len(fuseOpts) > 0 {
		out = append(out, "-o", strings.Join(fuseOpts, ","))
	}
	return out, nil
}
