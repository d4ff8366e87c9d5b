package mount

import (
	"strings"
	"testing"

	"github.com/amlfs/amlfs/amlerr"
)

func TestNormalize(t *testing.T) {
	ok := func() Config {
		return Config{Mountpoint: "/tmp/x/../ws", StoreConfig: StoreConfig{Store: "file:///var/lib/amlfs", ID: "a"}, CacheConfig: CacheConfig{CacheDir: "/var/cache/amlfs"}}
	}
	c := ok()
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	if c.Mountpoint != "/tmp/ws" || c.Load != "current" || c.Format != "" || c.Save != SaveOnSuccess || c.Retention != 1 {
		t.Errorf("defaults: %+v", c)
	}
	for name, spoil := range map[string]func(*Config){
		"no mountpoint":  func(c *Config) { c.Mountpoint = "" },
		"relative store": func(c *Config) { c.Store = "file://relative/dir" },
		"ftp store":      func(c *Config) { c.Store = "ftp://x/y" },
		"s3 dot prefix":  func(c *Config) { c.Store = "s3://bucket/a/../b" },
		"s3 no bucket":   func(c *Config) { c.Store = "s3:///prefix" },
		"bad restore":    func(c *Config) { c.Restore = "eager" },
		"bad format":     func(c *Config) { c.Format = "zip" },
		"bad save":       func(c *Config) { c.Save = "sometimes" },
		"bad retention":  func(c *Config) { c.Retention = -1 },
		"bad load":       func(c *Config) { c.Load = "../x" },
		"bad glob":       func(c *Config) { c.Include = []string{"[a"} },
		"cache in mount": func(c *Config) { c.CacheDir = "/tmp/ws/cache" },
	} {
		c := ok()
		spoil(&c)
		if err := c.Normalize(); amlerr.ExitStatus(err) != amlerr.ExitUsage {
			t.Errorf("%s: got %v, want INVALID_CONFIG", name, err)
		}
	}
}

func FuzzParseStore(f *testing.F) {
	for _, s := range []string{"file:///var/lib/amlfs", "s3://bucket/aml/workspaces", "s3://b", "s3://b/../x", "file://host/x", "ftp://x", "s3://b/a//c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		spec, err := ParseStore(raw)
		if err != nil {
			if amlerr.ExitStatus(err) != amlerr.ExitUsage {
				t.Fatalf("rejection without INVALID_CONFIG: %v", err)
			}
			return
		}
		switch spec.Kind {
		case "file":
			if !strings.HasPrefix(spec.Dir, "/") || strings.Contains(spec.Dir, "/../") {
				t.Fatalf("unsafe dir %q from %q", spec.Dir, raw)
			}
		case "s3":
			if spec.Bucket == "" || strings.HasPrefix(spec.Prefix, "/") || strings.HasSuffix(spec.Prefix, "/") {
				t.Fatalf("bad s3 spec %+v from %q", spec, raw)
			}
			for _, seg := range strings.Split(spec.Prefix, "/") {
				if seg == "" || seg == "." || seg == ".." {
					t.Fatalf("bad prefix segment in %+v from %q", spec, raw)
				}
			}
		default:
			t.Fatalf("kind %q", spec.Kind)
		}
	})
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"1048576": 1 << 20, "512MiB": 512 << 20, "10GiB": 10 << 30, "10G": 10 << 30, "3KB": 3 << 10, "2TiB": 2 << 40, " 7 MiB ": 7 << 20,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5G", "10XB", "99999999999999999999", "9999999999TiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"10GiB", "1", "512 MiB", "3T", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}

func TestBadOwnerOptionRefusedEarly(t *testing.T) {
	for _, o := range []string{"uid=abc", "gid=-1", "umask=999", "uid=1,gid=x"} {
		c := Config{Mountpoint: "/mnt/x", StoreConfig: StoreConfig{Store: "file:///s"}, ServeConfig: ServeConfig{FuseOptions: strings.Split(o, ",")}}
		if err := c.Normalize(); amlerr.Code(err) != amlerr.InvalidConfig {
			t.Errorf("-o %s: %v", o, err)
		}
	}
	c := Config{Mountpoint: "/mnt/x", StoreConfig: StoreConfig{Store: "file:///s"}, ServeConfig: ServeConfig{FuseOptions: []string{"uid=1000", "gid=1000", "umask=022"}}}
	if err := c.Normalize(); err != nil {
		t.Error(err)
	}
}

func TestParseUser(t *testing.T) {
	for _, tc := range []struct {
		in       string
		uid, gid int
		ok       bool
	}{
		{"root", 0, 0, true},
		{"0", 0, 0, true},
		{"4242", 4242, 4242, true},
		{"4242:4243", 4242, 4243, true},
		{"root:4243", 0, 4243, true},
		{"no-such-user-here", 0, 0, false},
		{"4242:no-such-group-here", 0, 0, false},
		{"-1", 0, 0, false},
	} {
		uid, gid, err := parseUser(tc.in)
		if (err == nil) != tc.ok || tc.ok && (uid != tc.uid || gid != tc.gid) {
			t.Errorf("parseUser(%q) = %d, %d, %v", tc.in, uid, gid, err)
		}
	}
}

// TestZeroKept: a setting whose zero means something keeps it (--prefetch
// 0 fetches only on use); others take their default.
func TestZeroKept(t *testing.T) {
	c := Config{Mountpoint: "/mnt/x"}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	def := DefaultConfig()
	if c.Prefetch != 0 || c.Retention != def.Retention || c.ToolTimeout != def.ToolTimeout || c.Load != "current" {
		t.Errorf("normalized: prefetch %d, retention %d, tool timeout %v, load %q", c.Prefetch, c.Retention, c.ToolTimeout, c.Load)
	}
}
