package mount

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/cache"
	"github.com/amlfs/amlfs/fuse"
	"github.com/amlfs/amlfs/providers/local"
	"github.com/amlfs/amlfs/providers/s3live"
	"github.com/amlfs/amlfs/s3client"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Refresh drops the kernel's cached entries, attributes and pages of path
// (relative to the mount root; "" for every live mount) in the live mount
// holding it. It returns the prefixes refreshed. The workspace has nothing
// to refresh: amlfs is its only writer.
func (d *Daemon) Refresh(path string) ([]string, error) {
	rel := strings.Trim(filepath.ToSlash(filepath.Clean("/"+path)), "/")
	var done []string
	for i, p := range d.live {
		m := d.cfg.Live[i]
		var sub string
		switch {
		case rel == "":
		case rel == m.Rel():
		case strings.HasPrefix(rel, m.Rel()+"/"):
			sub = strings.TrimPrefix(rel, m.Rel()+"/")
		default:
			continue
		}
		if err := p.Refresh(sub); err != nil {
			return done, err
		}
		done = append(done, m.Prefix)
	}
	if rel != "" && len(done) == 0 {
		return nil, invalid(path, "not under a live mount; the workspace needs no refresh")
	}
	return done, nil
}

// openLive opens the live mounts' providers. A bucket that does not
// answer now is mounted all the same: its paths give EIO until it does,
// and status shows its health.
func (d *Daemon) openLive(ctx context.Context) ([]fuse.Live, error) {
	var live []fuse.Live
	var client *s3.Client
	var dataCache *cache.Cache
	for i, m := range d.cfg.Live {
		log := d.log.With("provider", m.Kind, "mount", m.Prefix)
		tag := uint16(i + 1)
		switch m.Kind {
		case "file":
			p, err := local.New(local.Options{Dir: m.Dir, RO: m.RO, Tag: tag, Log: log})
			if err != nil {
				return nil, amlerr.Wrap(amlerr.InvalidConfig, m.Prefix, fmt.Errorf("live mount %s: %w", m.URL, err))
			}
			d.closers = append(d.closers, p.Close)
			d.live = append(d.live, p)
			attr, err := p.RootAttr()
			if err != nil {
				return nil, err
			}
			live = append(live, fuse.Live{Rel: m.Rel(), Root: p.Root(), Attr: attr})
		case "s3":
			if client == nil {
				o := d.cfg.S3
				// A live mount answers EIO soon rather than retrying
				// for a minute: the caller may retry.
				o.MaxAttempts = 3
				var err error
				if client, err = s3client.NewClient(ctx, o); err != nil {
					return nil, amlerr.Wrap(amlerr.InvalidConfig, m.Prefix, err)
				}
				dir, err := liveCacheDir(d.cfg.CacheDir)
				if err != nil {
					return nil, err
				}
				if dataCache, err = cache.New(dir, d.cfg.CacheSize); err != nil {
					return nil, amlerr.Wrap(amlerr.InvalidConfig, "--cache-size", err)
				}
				d.closers = append(d.closers, func() error { return os.RemoveAll(dir) })
			}
			p := s3live.New(s3live.Options{Client: client, Bucket: m.Bucket, Prefix: m.Key, RO: m.RO, TTL: d.cfg.MetadataTTL,
				Cache: dataCache, Log: log, Tag: tag, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())})
			if err := p.Check(ctx); err != nil {
				log.Error("S3 live mount does not answer; its paths give EIO until it does", "op", "check", "path", m.URL, "err", err)
			}
			// Uploads still waiting at unmount get this long.
			d.closers = append([]func() error{func() error { return p.Close(5 * time.Minute) }}, d.closers...)
			d.live = append(d.live, p)
			live = append(live, fuse.Live{Rel: m.Rel(), Root: p.Root(), Attr: p.RootAttr()})
		}
		log.Info("live mount", "prefix", m.Prefix, "url", m.URL, "ro", m.RO)
	}
	return live, nil
}

// liveCacheDir is this process's S3 data cache directory under the cache
// dir. Those of processes that are gone are removed.
func liveCacheDir(cacheDir string) (string, error) {
	old, _ := filepath.Glob(filepath.Join(cacheDir, "live-*"))
	for _, o := range old {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(o), "live-"))
		if err == nil && pid != os.Getpid() && syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(o)
		}
	}
	return filepath.Join(cacheDir, fmt.Sprintf("live-%d", os.Getpid())), nil
}
