package mount

import "slices"

// Access is who may reach a mount, from the FUSE options and whether the
// daemon runs as root.
type Access struct {
	// AllowOther lets every local user in, not only the one who mounted.
	AllowOther bool
	// DefaultPermissions has the kernel check each access against the
	// files' owner and mode, as on a local filesystem. Without it, with
	// AllowOther, any user can read and change every file.
	DefaultPermissions bool
}

// String says what the access means, for check and the log.
func (a Access) String() string {
	switch {
	case a.AllowOther && a.DefaultPermissions:
		return "every local user, by the files' owners and modes (allow_other,default_permissions)"
	case a.AllowOther:
		return "every local user, with NO permission check: anyone can read and change every file (allow_other,no_default_permissions, as asked)"
	default:
		return "only the user who mounted (no allow_other)"
	}
}

// fuseAccess settles the access options. As root, amlfs mounts with
// allow_other,default_permissions unless told noallow_other: sandboxes run
// their commands as a non-root user, who would otherwise be refused every
// file. allow_other always brings default_permissions with it unless
// no_default_permissions asks for exactly that. The no* words are amlfs's;
// FUSE gets only real options.
func fuseAccess(opts []string, root bool) ([]string, Access, error) {
	has := func(o string) bool { return slices.Contains(opts, o) }
	if has("allow_other") && has("noallow_other") {
		return nil, Access{}, invalid("allow_other", "-o allow_other and noallow_other contradict each other")
	}
	if has("default_permissions") && has("no_default_permissions") {
		return nil, Access{}, invalid("default_permissions", "-o default_permissions and no_default_permissions contradict each other")
	}
	a := Access{AllowOther: has("allow_other") || (root && !has("noallow_other"))}
	a.DefaultPermissions = has("default_permissions") || (a.AllowOther && !has("no_default_permissions"))
	if !a.AllowOther && has("no_default_permissions") && !has("noallow_other") {
		// Harmless, but say it does nothing.
		return nil, Access{}, invalid("no_default_permissions", "-o no_default_permissions means something only with allow_other")
	}
	var out []string
	for _, o := range opts {
		switch o {
		case "allow_other", "noallow_other", "default_permissions", "no_default_permissions", "nonempty", "":
		default:
			out = append(out, o)
		}
	}
	if a.AllowOther {
		out = append(out, "allow_other")
	}
	if a.DefaultPermissions {
		out = append(out, "default_permissions")
	}
	return out, a, nil
}
