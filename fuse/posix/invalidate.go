package posix

import (
	"path/filepath"
	"strings"

	gofs "github.com/hanwen/go-fuse/v2/fs"
)

// Invalidate drops what the kernel caches of rel, a path below root ("":
// root itself): the entry for it in its parent and the parent's listing
// and attributes, and the attributes, pages (a directory's: its listing)
// and entries of everything beneath it that the kernel knows. Providers
// call it when their own caches of rel are dropped.
func Invalidate(root *gofs.Inode, rel string) {
	if root.Operations() == nil {
		return // not in the tree yet (never looked up): the kernel has nothing of it
	}
	in := root
	rel = strings.Trim(filepath.ToSlash(filepath.Clean("/"+rel)), "/")
	if rel != "" {
		parts := strings.Split(rel, "/")
		parent := in
		for _, name := range parts[:len(parts)-1] {
			if parent = parent.GetChild(name); parent == nil {
				return // nothing cached there
			}
		}
		name := parts[len(parts)-1]
		in = parent.GetChild(name)
		defer parent.NotifyEntry(name)
		// The kernel bumps the parent's listing version for an entry
		// notice only when it holds that entry; a name it never looked up
		// (one the daemon made) would stay missing from a kept listing.
		defer parent.NotifyContent(0, 0)
		if in == nil {
			return // at most a cached miss, dropped by NotifyEntry
		}
	}
	dropBelow(in)
}

// dropBelow invalidates in's pages and attributes and, for a directory,
// every entry beneath it.
func dropBelow(in *gofs.Inode) {
	in.NotifyContent(0, 0)
	for name, ch := range in.Children() {
		dropBelow(ch)
		in.NotifyEntry(name)
	}
}
