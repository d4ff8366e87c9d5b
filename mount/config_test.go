package mount

import (
	"testing"

	"github.com/amlfs/amlfs/amlerr"
)

func TestNormalize(t *testing.T) {
	ok := func() Config {
		return Config{Mountpoint: "/tmp/x/../ws", Store: "file:///var/lib/amlfs", ID: "a", CacheDir: "/var/cache/amlfs"}
	}
	c := ok()
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	if c.Mountpoint != "/tmp/ws" || c.Load != "current" || c.Format != "folder" || c.Save != SaveOnSuccess || c.Retention != 1 {
		t.Errorf("defaults: %+v", c)
	}
	for name, spoil := range map[string]func(*Config){
		"no mountpoint":  func(c *Config) { c.Mountpoint = "" },
		"relative store": func(c *Config) { c.Store = "file://relative/dir" },
		"s3 store":       func(c *Config) { c.Store = "s3://bucket/prefix" },
		"ftp store":      func(c *Config) { c.Store = "ftp://x/y" },
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

func TestUnescapeMountinfo(t *testing.T) {
	if got := unescapeMountinfo(`/mnt/with\040space\011tab`); got != "/mnt/with space\ttab" {
		t.Errorf("got %q", got)
	}
}
