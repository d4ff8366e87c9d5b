package local

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// mountAlone serves a provider by itself at a fresh mountpoint.
func mountAlone(t *testing.T, opts Options) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a direct FUSE mount")
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return mountProvider(t, p)
}

// mountProvider serves p by itself at a fresh mountpoint.
func mountProvider(t *testing.T, p *Provider) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a direct FUSE mount")
	}
	mp := t.TempDir()
	hour := time.Hour
	srv, err := gofs.Mount(mp, p.Root(), &gofs.Options{
		MountOptions: fuse.MountOptions{DirectMount: true, FsName: "amlfs-local-test"},
		EntryTimeout: &hour, AttrTimeout: &hour, NegativeTimeout: &hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			syscall.Unmount(mp, syscall.MNT_DETACH)
		}
		p.Close()
	})
	return mp
}

// waitFor polls cond until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Host changes reach the mount, by watch events and, with no watches, by
// the per-mount cache timeout (the mount-wide timeouts here are an hour).
func TestHostChangesAreSeen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		watches int
		limit   time.Duration
	}{
		{"watched", 0, 500 * time.Millisecond},
		{"timeout only", -1, 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := t.TempDir()
			os.WriteFile(filepath.Join(host, "f"), []byte("one"), 0o644)
			mp := mountAlone(t, Options{Dir: host, MaxWatches: tc.watches, Timeout: time.Second})
			if got, _ := os.ReadFile(filepath.Join(mp, "f")); string(got) != "one" {
				t.Fatalf("read %q", got)
			}
			if _, err := os.Stat(filepath.Join(mp, "new")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("new before: %v", err)
			}
			os.WriteFile(filepath.Join(host, "new"), []byte("n"), 0o644)
			os.WriteFile(filepath.Join(host, "f"), []byte("longer now"), 0o644)
			waitFor(t, tc.limit, "a new host file after a cached miss", func() bool {
				_, err := os.Stat(filepath.Join(mp, "new"))
				return err == nil
			})
			waitFor(t, tc.limit, "a host rewrite", func() bool {
				got, _ := os.ReadFile(filepath.Join(mp, "f"))
				return string(got) == "longer now"
			})
			os.Remove(filepath.Join(host, "new"))
			waitFor(t, tc.limit, "a host removal", func() bool {
				_, err := os.Stat(filepath.Join(mp, "new"))
				return errors.Is(err, os.ErrNotExist)
			})
		})
	}
}

func TestReadOnlyRejectsWrites(t *testing.T) {
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "f"), []byte("x"), 0o644)
	mp := mountAlone(t, Options{Dir: host, RO: true})
	f, err := os.OpenFile(filepath.Join(mp, "f"), os.O_RDWR, 0)
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("open rw: %v", err)
		f.Close()
	}
	if err := os.Remove(filepath.Join(mp, "f")); !errors.Is(err, syscall.EROFS) {
		t.Errorf("unlink: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(mp, "f")); string(got) != "x" {
		t.Errorf("read: %q", got)
	}
}

// Refresh makes host changes visible at once where nothing else would:
// no watches, and an hour of kernel caching.
func TestRefreshDropsCaches(t *testing.T) {
	host := t.TempDir()
	os.Mkdir(filepath.Join(host, "d"), 0o755)
	os.WriteFile(filepath.Join(host, "d/f"), []byte("one"), 0o644)
	p, err := New(Options{Dir: host, MaxWatches: -1, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	mp := mountProvider(t, p)
	stat := func(name string) (int64, error) {
		fi, err := os.Stat(filepath.Join(mp, name))
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	}
	if n, err := stat("d/f"); err != nil || n != 3 {
		t.Fatalf("stat: %d %v", n, err)
	}
	if _, err := stat("d/new"); err == nil {
		t.Fatal("d/new exists before")
	}
	os.WriteFile(filepath.Join(host, "d/f"), []byte("longer"), 0o644)
	os.WriteFile(filepath.Join(host, "d/new"), []byte("n"), 0o644)
	if n, _ := stat("d/f"); n != 3 {
		t.Skipf("the kernel did not cache the size (%d); nothing to test", n)
	}
	if err := p.Refresh("d"); err != nil {
		t.Fatal(err)
	}
	if n, err := stat("d/f"); err != nil || n != 6 {
		t.Errorf("d/f after refresh: size %d, %v", n, err)
	}
	if _, err := stat("d/new"); err != nil {
		t.Errorf("d/new after refresh: %v", err)
	}
	os.Remove(filepath.Join(host, "d/new"))
	if err := p.Refresh(""); err != nil {
		t.Fatal(err)
	}
	if _, err := stat("d/new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("d/new after removal and refresh: %v", err)
	}
}
