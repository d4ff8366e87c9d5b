package mount

import (
	"slices"
	"testing"
)

func TestFuseAccess(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []string
		root    bool
		want    []string
		allow   bool
		perms   bool
		invalid bool
	}{
		{"root default", nil, true, []string{"allow_other", "default_permissions"}, true, true, false},
		{"root private", []string{"noallow_other"}, true, nil, false, false, false},
		{"root private with checks", []string{"noallow_other", "default_permissions"}, true, []string{"default_permissions"}, false, true, false},
		{"root open, no checks", []string{"no_default_permissions"}, true, []string{"allow_other"}, true, false, false},
		{"user default", nil, false, nil, false, false, false},
		{"user allow_other brings checks", []string{"allow_other"}, false, []string{"allow_other", "default_permissions"}, true, true, false},
		{"user other options kept", []string{"ro", "uid=1"}, false, []string{"ro", "uid=1"}, false, false, false},
		{"root other options kept", []string{"ro"}, true, []string{"ro", "allow_other", "default_permissions"}, true, true, false},
		{"no duplicate", []string{"allow_other", "default_permissions"}, true, []string{"allow_other", "default_permissions"}, true, true, false},
		{"contradiction allow", []string{"allow_other", "noallow_other"}, true, nil, false, false, true},
		{"contradiction perms", []string{"default_permissions", "no_default_permissions"}, false, nil, false, false, true},
		{"no checks without allow_other", []string{"no_default_permissions"}, false, nil, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, a, err := fuseAccess(tc.opts, tc.root)
			if tc.invalid {
				if err == nil {
					t.Fatalf("fuseAccess(%q) = %q, want an error", tc.opts, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) || a.AllowOther != tc.allow || a.DefaultPermissions != tc.perms {
				t.Fatalf("fuseAccess(%q, root=%v) = %q %+v, want %q allow_other=%v default_permissions=%v", tc.opts, tc.root, got, a, tc.want, tc.allow, tc.perms)
			}
		})
	}
}

func TestCheckAccess(t *testing.T) {
	for _, tc := range []struct {
		a      Access
		root   bool
		status string
	}{
		{Access{true, true}, true, "ok"},
		{Access{false, false}, true, "ok"},
		{Access{true, false}, true, "warn"},
	} {
		var r CheckReport
		checkAccess(&r, tc.a, tc.root)
		if len(r.Items) != 1 || r.Items[0].Status != tc.status {
			t.Errorf("checkAccess(%+v, root=%v) = %+v, want %s", tc.a, tc.root, r.Items, tc.status)
		}
	}
}
