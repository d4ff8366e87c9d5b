package mount

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

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
