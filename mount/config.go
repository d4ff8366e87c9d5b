// Package mount owns the mount table and the daemon lifecycle: parse and
// validate the configuration, acquire the workspace, restore it, serve it
// through FUSE, answer the control socket and signals, then save and
// release.
package mount

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/fuse"
	"github.com/amlfs/amlfs/revision"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/s3client"
)

// StoreNone (--store none) mounts only the live mounts, with no workspace.
const StoreNone = "none"

// Save policies.
const (
	SaveOnSuccess = "on-success"
	SaveAlways    = "always"
	SaveNever     = "never"
)

// Config is everything `amlfs mount` takes, one struct per concern. A
// field a user sets carries its name in a `key` tag and its help in a
// `usage` tag: that one name is the flag (--KEY), the environment
// variable (AMLFS_KEY: capitals, _ for -) and the key of a YAML config
// file, all generated from it (cmd/amlfs). A field's value in
// DefaultConfig is its default. Normalize fills what is unset (zero) with
// those defaults, but where zero is a value of its own (zero:"valid"),
// and validates each concern.
type Config struct {
	Mountpoint string
	StoreConfig
	RevisionConfig
	ServeConfig
	LiveConfig
	CacheConfig
	ToolConfig
	LimitConfig
}

// StoreConfig is where the workspace's revisions live, and how to reach
// them.
type StoreConfig struct {
	Store string `key:"store" usage:"durable store: file:///dir, s3://bucket/prefix, or none (live mounts only)"`
	ID    string `key:"id" usage:"workspace identity (default for a mount: a new UUID, printed)"`
	// IDGiven says the id was given: an empty one is refused, not taken
	// for "a new workspace".
	IDGiven     bool
	S3Endpoint  string        `key:"s3-endpoint" usage:"S3 endpoint URL (the AWS config chain and AWS_ENDPOINT_URL also apply)"`
	S3PathStyle bool          `key:"s3-path-style" usage:"address buckets by path (http://host/bucket), as most S3-compatible servers want"`
	S3Timeout   time.Duration `key:"s3-timeout" usage:"abort and retry an S3 request whose connection has been silent this long"`
	// S3 is the S3 client's settings, made by Validate.
	S3                        S3Options
	NoLock                    bool `key:"no-lock" usage:"skip the writer lease (publication stays conditional)"`
	UnsafeNoConditionalWrites bool `key:"unsafe-no-conditional-writes" usage:"lock and publish even if the store ignores If-None-Match/If-Match"`
}

// RevisionConfig is what the mount loads, what its saves take and
// publish, and how the tree is restored.
type RevisionConfig struct {
	Load string `key:"load" usage:"current, a revision id, or none"`
	// From, "ID" or "ID@REV", seeds a new workspace with a revision of
	// another one on the same store (a fork).
	From           string   `key:"from" usage:"seed this new workspace with a revision of another one on the same store: ID or ID@REV (a fork)"`
	Format         string   `key:"format" usage:"format of saved revisions: archive (one object; a save after a change copies the unchanged parts on the store's side) or folder (an object per file). Default: the current revision's, archive for a new workspace"`
	Save           string   `key:"save" usage:"on-success, always or never"`
	Retention      int      `key:"retention" usage:"revisions kept, counting the new current one"`
	Include        []string `key:"include" usage:"glob of paths to save and restore (repeatable)"`
	Exclude        []string `key:"exclude" usage:"glob of paths never saved or restored (repeatable; wins over include)"`
	NoGitignore    bool     `key:"no-gitignore" usage:"save paths .gitignore ignores"`
	DiscardUnsaved bool     `key:"discard-unsaved" usage:"throw away a working tree a crashed or failed run left unsaved, instead of resuming it"`
	NoKeep         bool     `key:"no-keep" usage:"remove the working tree at every stop, instead of keeping one that is its saved revision for the next mount of that revision"`
	StrictEntries  bool     `key:"strict-entries" usage:"fail a save that meets a socket, fifo or device node, listing every one, instead of leaving each out with a warning"`
	// FreezeCgroup is the cgroup v2 directory of the processes that write
	// the tree, frozen while a checkpoint reads it.
	FreezeCgroup string `key:"freeze-cgroup" usage:"cgroup v2 directory of the processes that write the tree (a container's): frozen while a checkpoint reads it, so that it is the tree at one instant (amlfs exec makes its command's own)"`
	// Restore is "lazy" (placeholders fetched on first use) or "full".
	Restore      string        `key:"restore" usage:"lazy: mount once the manifest is read and fetch each file's bytes on first use; full: fetch everything first"`
	Prefetch     int           `key:"prefetch" zero:"valid" usage:"background fetches at once after a lazy restore (0: fetch only on use)"`
	FetchTimeout time.Duration `key:"fetch-timeout" usage:"the longest a reader of a lazily restored file waits for its bytes, retries and all, before it gets EIO"`
}

// ServeConfig is how the tree is served at the mountpoint.
type ServeConfig struct {
	// Serve is ServeNative, ServeFUSE or ServeAuto.
	Serve                 string `key:"serve" usage:"native: bind-mount the working tree (root, Linux 6.14+), the disk's own speed; fuse: serve it through FUSE; auto: native where it can run"`
	AllowUserOwnedParents bool   `key:"allow-user-owned-parents" usage:"mount even where another user could rename or replace a parent of the mountpoint (such as /home/agent/workspace when run as root); no symlink is followed either way"`
	// FuseOptions are the -o values, each comma-separated.
	FuseOptions []string `key:"o" usage:"FUSE mount options, comma-separated (allow_other, default_permissions, ...)"`
	// Access is who may reach the mount, settled from FuseOptions by
	// Validate; fuseOptions are the options FUSE gets for it.
	Access      Access
	fuseOptions []string
	// Timeout is the kernel entry/attr cache time (0: the default).
	Timeout     time.Duration `key:"kernel-cache" usage:"kernel entry/attr cache time (0: 1h)"`
	Debug       bool          `key:"fuse-debug" usage:"log every FUSE request"`
	MetricsAddr string        `key:"metrics-addr" usage:"serve Prometheus metrics at http://ADDR/metrics (host:port, such as 127.0.0.1:9100)"`
	// Keeper is the amlfs binary, which native serving runs again as its
	// keeper (native.KeeperArg), and a stop as the remover of the tree it
	// discards (RemoveTreeArg); "" runs neither (the tree is removed in
	// place).
	Keeper string
}

// LiveConfig is the live mounts beside the workspace.
type LiveConfig struct {
	// Mounts are the specs; Live is them parsed by Validate.
	Mounts      []string `key:"mount" usage:"live mount /PREFIX=file:///host/dir[,ro] or /PREFIX=s3://bucket/prefix[,ro] beside the workspace (repeatable)"`
	Live        []MountSpec
	MetadataTTL time.Duration `key:"metadata-ttl" usage:"how long S3 live mounts trust listings and metadata before asking the bucket again"`
}

// CacheConfig is where working trees and the S3 live mounts' data live.
type CacheConfig struct {
	CacheDir string `key:"cache-dir" usage:"where working trees live"`
	// CacheSizeText ("10GiB") is parsed into CacheSize by Validate.
	CacheSizeText string `key:"cache-size" usage:"bound of the S3 live mounts' local data cache (bytes, or with KiB, MiB, GiB, TiB)"`
	CacheSize     int64
}

// ToolConfig is the file tools' view of the tree.
type ToolConfig struct {
	// SandboxPath is where the sandbox sees the mount (the mountpoint if
	// empty): tool calls take and give paths under it.
	SandboxPath string `key:"sandbox-path" usage:"where the sandbox sees the mount, if not at MOUNTPOINT (a container that bind-mounts it at /workspace): file tools take and give paths under it"`
	// SandboxUser, if set, is the sandbox's user: what the file tools
	// make is theirs. Validate settles it into sandboxOwner.
	SandboxUser  string `key:"sandbox-user" usage:"the sandbox's user (name, UID or UID:GID): files and directories the file tools make are theirs (by default a new one takes its parent directory's owner; a rewrite always keeps the file's own)"`
	sandboxOwner *[2]int
	ToolTimeout  time.Duration `key:"tool-timeout" usage:"longest a file-tool call may run (grep is stopped mid-file)"`
}

// LimitConfig bounds what a revision may hold, on save and on load. The
// defaults are AML's, whose readers need the same limits to load a
// revision over them. Validate parses the texts into Limits.
type LimitConfig struct {
	MaxEntries          int    `key:"max-entries" usage:"most entries (files, directories, symlinks) a revision may hold (AML's default: 100000). A folder revision's manifest.json must also fit AML's 4MiB, which holds about 30000 entries (more with short paths), and grows in proportion above the default; an archive revision has no manifest. Readers need the same limit to load such a revision"`
	MaxBytesText        string `key:"max-bytes" usage:"most bytes of files a revision may hold (bytes, or with KiB, MiB, GiB, TiB)"`
	MaxArchiveBytesText string `key:"max-archive-bytes" usage:"largest compressed archive revision (bytes, or with KiB, MiB, GiB, TiB)"`
	Limits              format.Limits
}

// DefaultConfig is every default, for flags to show and Normalize to fill
// in: a field left zero in a Config takes its value here.
func DefaultConfig() Config {
	return Config{
		StoreConfig:    StoreConfig{Store: DefaultStore(), S3Timeout: s3client.DefaultIOTimeout},
		RevisionConfig: RevisionConfig{Load: "current", Save: SaveOnSuccess, Retention: 1, Restore: "lazy", Prefetch: 4, FetchTimeout: revision.DefaultFetchTimeout},
		ServeConfig:    ServeConfig{Serve: DefaultServe},
		LiveConfig:     LiveConfig{MetadataTTL: DefaultMetadataTTL},
		CacheConfig:    CacheConfig{CacheDir: DefaultCacheDir(), CacheSizeText: "10GiB"},
		ToolConfig:     ToolConfig{ToolTimeout: DefaultToolTimeout},
		LimitConfig:    LimitConfig{MaxEntries: format.DefaultLimits.Entries, MaxBytesText: "1GiB", MaxArchiveBytesText: "256MiB"},
	}
}

// ParseLimits reads --max-entries, --max-bytes and --max-archive-bytes; a
// zero or empty value is AML's default.
func ParseLimits(entries int, bytes, archive string) (format.Limits, error) {
	lim := format.DefaultLimits
	if entries < 0 {
		return lim, invalid(fmt.Sprint(entries), "--max-entries must be positive")
	}
	if entries > 0 {
		lim.Entries = entries
	}
	for _, f := range []struct {
		name, text string
		dst        *int64
	}{{"max-bytes", bytes, &lim.ExtractedBytes}, {"max-archive-bytes", archive, &lim.ArchiveBytes}} {
		if f.text == "" {
			continue
		}
		n, err := ParseSize(f.text)
		if err == nil && n <= 0 {
			err = errors.New("must be positive")
		}
		if err != nil {
			return lim, invalid(f.text, "--%s: %v", f.name, err)
		}
		*f.dst = n
	}
	return lim, nil
}

// Defaults of the S3 live mounts.
const (
	DefaultCacheSize   = 10 << 30
	DefaultMetadataTTL = time.Minute
	DefaultToolTimeout = 30 * time.Second
)

func invalid(subject, format string, args ...any) error {
	return amlerr.New(amlerr.InvalidConfig, subject, format, args...)
}

// Normalize fills every unset field with its default (DefaultConfig) and
// validates each concern. It does not touch the store.
func (c *Config) Normalize() error {
	if c.Mountpoint == "" {
		return invalid("", "MOUNTPOINT is required")
	}
	mp, err := filepath.Abs(c.Mountpoint)
	if err != nil {
		return invalid(c.Mountpoint, "%v", err)
	}
	c.Mountpoint = mp
	fillZero(c, DefaultConfig())
	for _, v := range []interface{ Validate() error }{&c.StoreConfig, &c.RevisionConfig, &c.ServeConfig, &c.LiveConfig, &c.CacheConfig, &c.ToolConfig, &c.LimitConfig} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	// What concerns two of them.
	if c.From != "" {
		if id, _, _ := strings.Cut(c.From, "@"); id == c.ID {
			return invalid(c.From, "from names the workspace itself; a fork needs a new id")
		}
	}
	if strings.HasPrefix(c.CacheDir+"/", c.Mountpoint+"/") {
		return invalid(c.CacheDir, "cache-dir must not be inside the mountpoint")
	}
	return c.Selection().Validate()
}

// fillZero sets every zero field of the user's keys in c to def's value,
// but for a field whose zero means something (tagged zero:"valid").
func fillZero(c *Config, def Config) {
	cv, dv := reflect.ValueOf(c).Elem(), reflect.ValueOf(def)
	var walk func(cv, dv reflect.Value)
	walk = func(cv, dv reflect.Value) {
		for i := range cv.NumField() {
			f := cv.Type().Field(i)
			switch {
			case f.Anonymous:
				walk(cv.Field(i), dv.Field(i))
			case f.Tag.Get("key") != "" && f.Tag.Get("zero") != "valid" && cv.Field(i).IsZero():
				cv.Field(i).Set(dv.Field(i))
			}
		}
	}
	walk(cv, dv)
}

// Validate checks the store's fields.
func (s *StoreConfig) Validate() error {
	if s.ID != "" || s.IDGiven {
		if err := format.ValidateID(s.ID); err != nil {
			return err
		}
	}
	if s.Store != StoreNone {
		if _, err := ParseStore(s.Store); err != nil {
			return err
		}
	}
	if s.S3Timeout < 0 {
		return invalid(s.S3Timeout.String(), "s3-timeout must be positive")
	}
	s.S3 = S3Options{Endpoint: s.S3Endpoint, PathStyle: s.S3PathStyle, IOTimeout: s.S3Timeout}
	return nil
}

// Validate checks what the mount loads and saves.
func (r *RevisionConfig) Validate() error {
	if r.From != "" {
		id, rev, _ := strings.Cut(r.From, "@")
		if err := format.ValidateID(id); err != nil {
			return invalid(r.From, "from: %v", err)
		}
		if rev != "" && rev != "current" {
			if err := format.ValidateRevisionID(rev); err != nil {
				return invalid(r.From, "from: %v", err)
			}
		}
		if r.Load != "current" {
			return invalid(r.From, "from and load cannot be given together: from chooses what the new workspace loads")
		}
	}
	if r.Load != "current" && r.Load != "none" {
		if err := format.ValidateRevisionID(r.Load); err != nil {
			return invalid(r.Load, "load: %v", err)
		}
	}
	switch {
	case r.Format != "" && r.Format != format.FormatFolder && r.Format != format.FormatArchive:
		return invalid(r.Format, "format must be folder or archive")
	case r.Save != SaveOnSuccess && r.Save != SaveAlways && r.Save != SaveNever:
		return invalid(r.Save, "save must be on-success, always or never")
	case r.Restore != "lazy" && r.Restore != "full":
		return invalid(r.Restore, "restore must be lazy or full")
	case r.Prefetch < 0:
		return invalid(fmt.Sprint(r.Prefetch), "prefetch must be 0 or more")
	case r.FreezeCgroup != "" && !filepath.IsAbs(r.FreezeCgroup):
		return invalid(r.FreezeCgroup, "freeze-cgroup must be an absolute path (a cgroup v2 directory, such as /sys/fs/cgroup/mycontainer)")
	case r.Retention < 1:
		return invalid(fmt.Sprint(r.Retention), "retention must be at least 1")
	case r.FetchTimeout < 0:
		return invalid(r.FetchTimeout.String(), "fetch-timeout must be positive")
	}
	return nil
}

// Validate checks how the tree is served, and settles who may reach it.
func (s *ServeConfig) Validate() error {
	if s.Serve != ServeNative && s.Serve != ServeFUSE && s.Serve != ServeAuto {
		return invalid(s.Serve, "serve must be native, fuse or auto")
	}
	var opts []string
	for _, o := range s.FuseOptions {
		opts = append(opts, strings.Split(o, ",")...)
	}
	s.FuseOptions = opts
	var err error
	if s.fuseOptions, s.Access, err = fuseAccess(s.FuseOptions, os.Geteuid() == 0); err != nil {
		return err
	}
	if err := fuse.CheckOwnerOptions(s.FuseOptions); err != nil {
		return invalid(strings.Join(s.FuseOptions, ","), "o: %v (uid= and gid= take a number, umask= an octal mode)", err)
	}
	if s.Timeout < 0 {
		return invalid(s.Timeout.String(), "kernel-cache must be positive")
	}
	return nil
}

// Validate parses the live mounts.
func (l *LiveConfig) Validate() error {
	var err error
	if l.Live, err = ParseMounts(l.Mounts); err != nil {
		return err
	}
	if l.MetadataTTL < 0 {
		return invalid(l.MetadataTTL.String(), "metadata-ttl must be positive")
	}
	return nil
}

// Validate settles the cache's place and bound.
func (c *CacheConfig) Validate() error {
	var err error
	if c.CacheDir, err = filepath.Abs(c.CacheDir); err != nil {
		return invalid(c.CacheDir, "%v", err)
	}
	if c.CacheSizeText != "" {
		if c.CacheSize, err = ParseSize(c.CacheSizeText); err != nil {
			return invalid(c.CacheSizeText, "cache-size: %v", err)
		}
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.CacheSize < 1<<20 {
		return invalid(fmt.Sprint(c.CacheSize), "cache-size must be at least 1MiB")
	}
	return nil
}

// Validate checks the tools' settings and settles the sandbox's owner.
func (t *ToolConfig) Validate() error {
	if t.ToolTimeout < 0 {
		return invalid(t.ToolTimeout.String(), "tool-timeout must be positive")
	}
	if t.SandboxUser != "" {
		uid, gid, err := parseUser(t.SandboxUser)
		if err != nil {
			return invalid(t.SandboxUser, "sandbox-user: %v", err)
		}
		t.sandboxOwner = &[2]int{uid, gid}
	}
	if t.SandboxPath != "" && !filepath.IsAbs(t.SandboxPath) {
		return invalid(t.SandboxPath, "sandbox-path must be absolute, such as /workspace")
	}
	return nil
}

// Validate parses the limits.
func (l *LimitConfig) Validate() error {
	var err error
	l.Limits, err = ParseLimits(l.MaxEntries, l.MaxBytesText, l.MaxArchiveBytesText)
	return err
}

// Selection is the save/restore selection of the config.
func (c *Config) Selection() format.Selection {
	sel := format.Selection{Include: c.Include, Exclude: c.Exclude, NoGitignore: c.NoGitignore}
	// Live mounts hide the workspace paths beneath them: never saved.
	for _, m := range c.Live {
		sel.Hidden = append(sel.Hidden, m.Rel())
	}
	return sel
}

// parseUser reads a user as a name, a UID or UID:GID; a name or a lone
// UID known to the system takes its primary group.
func parseUser(s string) (int, int, error) {
	name, group, hasGroup := strings.Cut(s, ":")
	var uid, gid int
	if n, err := strconv.ParseUint(name, 10, 31); err == nil {
		uid, gid = int(n), int(n)
		if u, err := user.LookupId(name); err == nil {
			gid, _ = strconv.Atoi(u.Gid)
		}
	} else {
		u, err := user.Lookup(name)
		if err != nil {
			return 0, 0, err
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	}
	if hasGroup {
		n, err := strconv.ParseUint(group, 10, 31)
		if err != nil {
			g, gerr := user.LookupGroup(group)
			if gerr != nil {
				return 0, 0, gerr
			}
			n, _ = strconv.ParseUint(g.Gid, 10, 31)
		}
		gid = int(n)
	}
	return uid, gid, nil
}

// ParseSize parses a byte count: digits, optionally followed by K, M, G or
// T (powers of 1024, with or without "iB" or "B").
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("%q is not a size like 512MiB or 10GiB", s)
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %v", s, err)
	}
	shift := 0
	switch strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(t[i:]), "B"), "i")) {
	case "":
	case "K":
		shift = 10
	case "M":
		shift = 20
	case "G":
		shift = 30
	case "T":
		shift = 40
	default:
		return 0, fmt.Errorf("%q is not a size like 512MiB or 10GiB", s)
	}
	if n > (1<<62)>>shift {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n << shift, nil
}
