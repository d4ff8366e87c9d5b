package main

import (
	"strings"
	"testing"
)

func TestHelperArgs(t *testing.T) {
	flags := mountCommand().Flags
	for _, tc := range []struct {
		in, want string // want "" means an error
	}{
		{"s3://b/aml/workspaces /workspace -o rw,id=demo,retention=3,_netdev,nofail,x-systemd.automount,allow_other,default_permissions",
			"amlfs mount --daemon /workspace --store s3://b/aml/workspaces --id=demo --retention=3 -o allow_other,default_permissions"},
		{"amlfs /w -o id=x,no-lock,uid=1000,gid=1000,umask=022,config=/etc/amlfs/x.yaml,comment=hi",
			"amlfs mount --daemon /w --id=x --no-lock --config=/etc/amlfs/x.yaml -o uid=1000,gid=1000,umask=022"},
		{"file:///srv/ws /w -n -s -o defaults -t fuse.amlfs", "amlfs mount --daemon /w --store file:///srv/ws"},
		{"file:///srv/ws /w -oid=a,ro", "amlfs mount --daemon /w --store file:///srv/ws --id=a -o ro"},
		{"file:///srv/ws /w -o bogus", ""},
		{"file:///srv/ws /w -o id", ""},
		{"file:///srv/ws /w -o no-lock=yes", ""},
		{"file:///srv/ws /w -o daemon", ""},
		{"file:///srv/ws -o id=a", ""},
		{"file:///srv/ws /w -o", ""},
		{"file:///srv/ws /w --weird", ""},
	} {
		got, err := helperArgs(strings.Fields(tc.in), flags)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%q: want an error, got %q", tc.in, got)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("%q:\n got  %q (%v)\n want %q", tc.in, strings.Join(got, " "), err, tc.want)
		}
	}
}
