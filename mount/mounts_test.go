package mount

import (
	"path"
	"strings"
	"testing"

	"github.com/amlfs/amlfs/amlerr"
)

func TestParseMountSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want MountSpec
		bad  bool
	}{
		{in: "/data=file:///srv/data", want: MountSpec{Prefix: "/data", URL: "file:///srv/data", Kind: "file", Dir: "/srv/data"}},
		{in: "/a/b=file:///x/../y,ro", want: MountSpec{Prefix: "/a/b", URL: "file:///x/../y", Kind: "file", Dir: "/y", RO: true}},
		{in: "/d=s3://bkt/some/prefix", want: MountSpec{Prefix: "/d", URL: "s3://bkt/some/prefix", Kind: "s3", Bucket: "bkt", Key: "some/prefix/"}},
		{in: "/d=s3://bkt,ro", want: MountSpec{Prefix: "/d", URL: "s3://bkt", Kind: "s3", Bucket: "bkt", RO: true}},
		{in: "data=file:///x", bad: true},
		{in: "/data/=file:///x", bad: true},
		{in: "/a/./b=file:///x", bad: true},
		{in: "/a/../b=file:///x", bad: true},
		{in: "/=file:///x", bad: true},
		{in: "/data", bad: true},
		{in: "/data=", bad: true},
		{in: "/data=file://rel", bad: true},
		{in: "/data=file:///x,rx", bad: true},
		{in: "/data=http://x", bad: true},
		{in: "/data=s3://b/../x", bad: true},
	} {
		got, err := ParseMountSpec(tc.in)
		if tc.bad {
			if err == nil || amlerr.ExitStatus(err) != amlerr.ExitUsage {
				t.Errorf("%q: %+v, %v; want INVALID_CONFIG", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseMountsRejectsNesting(t *testing.T) {
	for _, specs := range [][]string{
		{"/a=file:///x", "/a/b=file:///y"},
		{"/a/b/c=file:///x", "/a/b=file:///y"},
		{"/a=file:///x", "/a=file:///y,ro"},
	} {
		if _, err := ParseMounts(specs); err == nil || amlerr.ExitStatus(err) != amlerr.ExitUsage {
			t.Errorf("%q: %v, want INVALID_CONFIG", specs, err)
		}
	}
	ms, err := ParseMounts([]string{"/ab=file:///x", "/a=file:///y", "/a-b/c=file:///z"})
	if err != nil || len(ms) != 3 || ms[0].Prefix != "/a" {
		t.Errorf("siblings sharing a name prefix: %+v %v", ms, err)
	}
}

func FuzzParseMountSpec(f *testing.F) {
	for _, s := range []string{"/data=file:///srv", "/a/b=s3://bkt/p,ro", "/x=file:///y,rw,ro", "x=y", "/=file:///", "/a\x00=file:///x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		m, err := ParseMountSpec(raw)
		if err != nil {
			if amlerr.ExitStatus(err) != amlerr.ExitUsage {
				t.Fatalf("rejection without INVALID_CONFIG: %v", err)
			}
			return
		}
		if !strings.HasPrefix(m.Prefix, "/") || path.Clean(m.Prefix) != m.Prefix || m.Prefix == "/" || strings.ContainsRune(m.Prefix, 0) {
			t.Fatalf("unsafe prefix %q from %q", m.Prefix, raw)
		}
		if m.Rel() == "" || strings.HasPrefix(m.Rel(), "/") {
			t.Fatalf("bad rel %q", m.Rel())
		}
		switch m.Kind {
		case "file":
			if !strings.HasPrefix(m.Dir, "/") || path.Clean(m.Dir) != m.Dir {
				t.Fatalf("unsafe dir %q from %q", m.Dir, raw)
			}
		case "s3":
			if m.Bucket == "" || strings.HasPrefix(m.Key, "/") || (m.Key != "" && !strings.HasSuffix(m.Key, "/")) {
				t.Fatalf("bad s3 mount %+v from %q", m, raw)
			}
		default:
			t.Fatalf("kind %q", m.Kind)
		}
	})
}
