// Package mount owns the mount table and the daemon lifecycle: parse and
// validate the configuration, acquire the workspace, restore it, serve it
// through FUSE, answer the control socket and signals, then save and
// release.
package mount

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/fuse"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
	"github.com/amlfs/amlfs/revision/store/dirstore"
	"github.com/amlfs/amlfs/revision/store/s3store"
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

// Config is everything `amlfs mount` takes.
type Config struct {
	Mountpoint string
	// AllowUserOwnedParents accepts a mountpoint a parent of which another
	// user could rename or replace (mountpoint.Policy).
	AllowUserOwnedParents bool
	Store                 string // file:///dir
	ID                    string
	// IDGiven says --id was given: an empty one is refused, not taken
	// for "a new workspace".
	IDGiven bool
	Load    string // current | REV | none
	// From, "ID" or "ID@REV", seeds a new workspace with a revision of
	// another one on the same store (a fork).
	From        string
	Format      string
	Save        string
	Retention   int
	Include     []string
	Exclude     []string
	NoGitignore bool
	NoLock      bool
	// MetricsAddr, if set, is where Prometheus metrics are served
	// (host:port).
	MetricsAddr string
	// DiscardUnsaved throws away a working tree an earlier run left
	// unsaved, instead of resuming it.
	DiscardUnsaved bool
	CacheDir       string
	FuseOptions    []string
	// Access is who may reach the mount, settled from FuseOptions by
	// Normalize; fuseOptions are the options FUSE gets for it.
	Access      Access
	fuseOptions []string
	// Timeout is the kernel entry/attr cache time (0: the default).
	Timeout time.Duration
	S3      S3Options
	// Restore is "lazy" (placeholders fetched on first use) or "full".
	Restore string
	// Serve is how the workspace is served: ServeNative, ServeFUSE or
	// ServeAuto ("" is DefaultServe).
	Serve string
	// Keeper is the amlfs binary, which native serving runs again as its
	// keeper (native.KeeperArg); "" runs none.
	Keeper string
	// Prefetch is the number of background fetches after a lazy restore.
	Prefetch int
	// FetchTimeout bounds one lazy fetch: a reader of a file not fetched
	// yet waits at most this long, then gets EIO (0: the default).
	FetchTimeout time.Duration
	// UnsafeNoConditionalWrites lets a mount lock and publish to a store
	// whose conditional writes failed the probe.
	UnsafeNoConditionalWrites bool
	Debug                     bool
	// Mounts are the --mount specs; Live is them parsed by Normalize.
	Mounts []string
	Live   []MountSpec
	// CacheSize bounds the S3 live mounts' data cache in bytes;
	// CacheSizeText is the flag ("10GiB"), parsed into it by Normalize.
	CacheSize     int64
	CacheSizeText string
	// MetadataTTL is how long S3 live mounts trust listings and metadata.
	MetadataTTL time.Duration
	// StrictEntries fails a save that meets a special file.
	StrictEntries bool
	// SandboxPath is where the sandbox sees the mount (the mountpoint if
	// empty): tool calls take and give paths under it.
	SandboxPath string
	// SandboxUser, if set, is the sandbox's user (a name, UID or
	// UID:GID): what the file tools make is theirs. Otherwise a new file
	// or directory takes its parent directory's owner. Normalize settles
	// it into sandboxOwner.
	SandboxUser  string
	sandboxOwner *[2]int
	// ToolTimeout bounds one file-tool call (DefaultToolTimeout if 0).
	ToolTimeout time.Duration
	// Limits bound a revision, on save and on load; MaxEntries and the
	// size texts ("1GiB") are the flags, parsed into it by Normalize (zero
	// or empty: AML's defaults).
	Limits              format.Limits
	MaxEntries          int
	MaxBytesText        string
	MaxArchiveBytesText string
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

// DefaultStore is file://$XDG_DATA_HOME/amlfs/workspaces.
func DefaultStore() string {
	data := os.Getenv("XDG_DATA_HOME")
	if data == "" {
		home, _ := os.UserHomeDir()
		data = filepath.Join(home, ".local", "share")
	}
	return "file://" + filepath.Join(data, "amlfs", "workspaces")
}

// DefaultCacheDir is $XDG_CACHE_HOME/amlfs.
func DefaultCacheDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "amlfs")
}

// Normalize fills defaults and validates. It does not touch the store.
func (c *Config) Normalize() error {
	if c.Mountpoint == "" {
		return invalid("", "MOUNTPOINT is required")
	}
	mp, err := filepath.Abs(c.Mountpoint)
	if err != nil {
		return invalid(c.Mountpoint, "%v", err)
	}
	c.Mountpoint = mp
	if c.Store == "" {
		c.Store = DefaultStore()
	}
	if c.ID != "" || c.IDGiven {
		if err := format.ValidateID(c.ID); err != nil {
			return err
		}
	}
	if c.Load == "" {
		c.Load = "current"
	}
	if c.From != "" {
		id, rev, _ := strings.Cut(c.From, "@")
		if err := format.ValidateID(id); err != nil {
			return invalid(c.From, "--from: %v", err)
		}
		if id == c.ID {
			return invalid(c.From, "--from names the workspace itself; a fork needs a new --id")
		}
		if rev != "" && rev != "current" {
			if err := format.ValidateRevisionID(rev); err != nil {
				return invalid(c.From, "--from: %v", err)
			}
		}
		if c.Load != "current" {
			return invalid(c.From, "--from and --load cannot be given together: --from chooses what the new workspace loads")
		}
	}
	if c.Load != "current" && c.Load != "none" {
		if err := format.ValidateRevisionID(c.Load); err != nil {
			return invalid(c.Load, "--load: %v", err)
		}
	}
	if c.Format == "" {
		c.Format = format.FormatFolder
	}
	if c.Format != format.FormatFolder && c.Format != format.FormatArchive {
		return invalid(c.Format, "--format must be folder or archive")
	}
	if c.Save == "" {
		c.Save = SaveOnSuccess
	}
	switch c.Save {
	case SaveOnSuccess, SaveAlways, SaveNever:
	default:
		return invalid(c.Save, "--save must be on-success, always or never")
	}
	if c.Restore == "" {
		c.Restore = "lazy"
	}
	if c.Restore != "lazy" && c.Restore != "full" {
		return invalid(c.Restore, "--restore must be lazy or full")
	}
	if c.Serve == "" {
		c.Serve = DefaultServe
	}
	if c.Serve != ServeNative && c.Serve != ServeFUSE && c.Serve != ServeAuto {
		return invalid(c.Serve, "--serve must be native, fuse or auto")
	}
	if c.Prefetch < 0 {
		return invalid(fmt.Sprint(c.Prefetch), "--prefetch must be 0 or more")
	}
	if c.Retention == 0 {
		c.Retention = 1
	}
	if c.Retention < 1 {
		return invalid(fmt.Sprint(c.Retention), "--retention must be at least 1")
	}
	if c.CacheDir == "" {
		c.CacheDir = DefaultCacheDir()
	}
	if c.CacheDir, err = filepath.Abs(c.CacheDir); err != nil {
		return invalid(c.CacheDir, "%v", err)
	}
	if strings.HasPrefix(c.CacheDir+"/", c.Mountpoint+"/") {
		return invalid(c.CacheDir, "--cache-dir must not be inside the mountpoint")
	}
	if c.Store != StoreNone {
		if _, err := ParseStore(c.Store); err != nil {
			return err
		}
	}
	if c.fuseOptions, c.Access, err = fuseAccess(c.FuseOptions, os.Geteuid() == 0); err != nil {
		return err
	}
	if err := fuse.CheckOwnerOptions(c.FuseOptions); err != nil {
		return invalid(strings.Join(c.FuseOptions, ","), "-o: %v (uid= and gid= take a number, umask= an octal mode)", err)
	}
	if c.Live, err = ParseMounts(c.Mounts); err != nil {
		return err
	}
	if c.CacheSizeText != "" {
		if c.CacheSize, err = ParseSize(c.CacheSizeText); err != nil {
			return invalid(c.CacheSizeText, "--cache-size: %v", err)
		}
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.CacheSize < 1<<20 {
		return invalid(fmt.Sprint(c.CacheSize), "--cache-size must be at least 1MiB")
	}
	if c.ToolTimeout == 0 {
		c.ToolTimeout = DefaultToolTimeout
	}
	if c.ToolTimeout < 0 {
		return invalid(c.ToolTimeout.String(), "--tool-timeout must be positive")
	}
	if c.SandboxUser != "" {
		uid, gid, err := parseUser(c.SandboxUser)
		if err != nil {
			return invalid(c.SandboxUser, "--sandbox-user: %v", err)
		}
		c.sandboxOwner = &[2]int{uid, gid}
	}
	if c.SandboxPath != "" && !filepath.IsAbs(c.SandboxPath) {
		return invalid(c.SandboxPath, "--sandbox-path must be absolute, such as /workspace")
	}
	if c.Limits, err = ParseLimits(c.MaxEntries, c.MaxBytesText, c.MaxArchiveBytesText); err != nil {
		return err
	}
	if c.MetadataTTL == 0 {
		c.MetadataTTL = DefaultMetadataTTL
	}
	if c.MetadataTTL < 0 {
		return invalid(c.MetadataTTL.String(), "--metadata-ttl must be positive")
	}
	return c.Selection().Validate()
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

// StoreSpec is a parsed --store URL.
type StoreSpec struct {
	Kind   string // "file" or "s3"
	Dir    string // file: the store directory
	Bucket string // s3
	Prefix string // s3: the key prefix (AML's default aml/workspaces)
}

// ParseStore parses file:///dir or s3://bucket[/prefix].
func ParseStore(storeURL string) (StoreSpec, error) {
	u, err := url.Parse(storeURL)
	if err != nil {
		return StoreSpec{}, invalid(storeURL, "bad store URL: %v", err)
	}
	switch u.Scheme {
	case "file":
		dir, err := fileURLDir(u, storeURL, "store")
		if err != nil {
			return StoreSpec{}, err
		}
		return StoreSpec{Kind: "file", Dir: dir}, nil
	case "s3":
		su, err := s3client.ParseURL(storeURL, s3store.DefaultPrefix)
		if err != nil {
			return StoreSpec{}, invalid(storeURL, "%v", err)
		}
		return StoreSpec{Kind: "s3", Bucket: su.Bucket, Prefix: su.Prefix}, nil
	}
	return StoreSpec{}, invalid(storeURL, "unsupported store scheme %q (use file:///dir or s3://bucket/prefix)", u.Scheme)
}

// fileURLDir returns the local directory of a file:// URL: file:///abs/dir
// or file://localhost/abs/dir, cleaned. what names the URL's role in
// errors ("store", "mount").
func fileURLDir(u *url.URL, subject, what string) (string, error) {
	if u.Host != "" && u.Host != "localhost" {
		return "", invalid(subject, "file:// %s must be local: file:///absolute/dir", what)
	}
	if u.Path == "" || !filepath.IsAbs(u.Path) {
		return "", invalid(subject, "file:// %s needs an absolute path: file:///absolute/dir", what)
	}
	return filepath.Clean(u.Path), nil
}

// S3Options are the S3 settings from the command line.
type S3Options = s3client.Options

// OpenStore returns the store for workspace id.
func OpenStore(ctx context.Context, storeURL string, s3o S3Options, id string) (store.Store, error) {
	spec, err := ParseStore(storeURL)
	if err != nil {
		return nil, err
	}
	if spec.Kind == "s3" {
		client, err := s3client.NewClient(ctx, s3o)
		if err != nil {
			return nil, err
		}
		st, err := s3store.New(client, spec.Bucket, spec.Prefix, id)
		if err != nil {
			return nil, invalid(id, "--id: %v", err)
		}
		return st, nil
	}
	st, err := dirstore.New(spec.Dir, id)
	if err != nil {
		return nil, invalid(id, "--id: %v", err)
	}
	return st, nil
}

// RuntimeDir is where control sockets and daemon logs live.
func RuntimeDir() string {
	if d := os.Getenv("AMLFS_RUNTIME_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "amlfs")
	}
	if os.Geteuid() == 0 {
		return "/run/amlfs"
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("amlfs-%d", os.Geteuid()))
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

// mountKey names per-mountpoint runtime files.
func mountKey(mountpoint string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(mountpoint)))
	return hex.EncodeToString(sum[:8])
}

// SocketPath is the control socket of the daemon serving mountpoint.
func SocketPath(mountpoint string) string {
	return filepath.Join(RuntimeDir(), mountKey(mountpoint)+".sock")
}

// LogPath is where a --daemon's logs go.
func LogPath(mountpoint string) string {
	return filepath.Join(RuntimeDir(), mountKey(mountpoint)+".log")
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
