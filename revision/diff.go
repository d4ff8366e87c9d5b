package revision

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"

	"github.com/amlfs/amlfs/revision/format"
)

// Change is one path that differs between two revisions.
type Change struct {
	Path string `json:"path"`
	// Kind is "added", "removed" or "changed" (content, mode or type).
	Kind    string `json:"kind"`
	OldType string `json:"oldType,omitempty"`
	NewType string `json:"newType,omitempty"`
	OldSize int64  `json:"oldSize"`
	NewSize int64  `json:"newSize"`
	OldMode uint32 `json:"oldMode,omitempty"`
	NewMode uint32 `json:"newMode,omitempty"`
}

// sameObjecter is a store that can tell, without reading them, that two
// objects hold the same bytes (one inode on a file store, one ETag on S3).
// A false answer means only "not known to be the same".
type sameObjecter interface {
	SameObject(ctx context.Context, a, b string) bool
}

// Diff compares revisions a and b: the paths only b has (added), only a
// has (removed), and those whose type, mode or content differ (changed).
// AML's manifests hold no content hash, so files of equal size are
// compared by content: objects a store knows to be the same are not read,
// and the rest are hashed.
func (w *Workspace) Diff(ctx context.Context, a, b format.Entry) ([]Change, error) {
	ta, err := w.treeOf(ctx, a)
	if err != nil {
		return nil, err
	}
	tb, err := w.treeOf(ctx, b)
	if err != nil {
		return nil, err
	}
	old := make(map[string]format.TreeEntry, len(ta))
	for _, e := range ta {
		old[e.Path] = e
	}
	var out []Change
	var same []format.TreeEntry // files of equal size and mode, to compare by content
	for _, nb := range tb {
		na, ok := old[nb.Path]
		delete(old, nb.Path)
		c := Change{Path: nb.Path, NewType: nb.Type, NewSize: nb.Size, NewMode: nb.Mode}
		switch {
		case !ok:
			c.Kind = "added"
		case na.Type != nb.Type || na.Mode != nb.Mode || na.Size != nb.Size || na.Target != nb.Target:
			c.Kind = "changed"
		case nb.Type == format.TypeFile:
			same = append(same, nb)
			continue
		default:
			continue
		}
		if ok {
			c.OldType, c.OldSize, c.OldMode = na.Type, na.Size, na.Mode
		}
		out = append(out, c)
	}
	for _, na := range old {
		out = append(out, Change{Path: na.Path, Kind: "removed", OldType: na.Type, OldSize: na.Size, OldMode: na.Mode})
	}
	if len(same) > 0 {
		differ, err := w.differing(ctx, a, b, same)
		if err != nil {
			return nil, err
		}
		for _, e := range differ {
			out = append(out, Change{Path: e.Path, Kind: "changed", OldType: e.Type, NewType: e.Type, OldSize: e.Size, NewSize: e.Size, OldMode: e.Mode, NewMode: e.Mode})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// differing returns the files, among those present in both revisions with
// equal sizes, whose bytes differ.
func (w *Workspace) differing(ctx context.Context, a, b format.Entry, files []format.TreeEntry) ([]format.TreeEntry, error) {
	var ha, hb map[string]string
	var err error
	if a.Format == format.FormatArchive {
		if ha, err = w.archiveDigests(ctx, a); err != nil {
			return nil, err
		}
	}
	if b.Format == format.FormatArchive {
		if hb, err = w.archiveDigests(ctx, b); err != nil {
			return nil, err
		}
	}
	// digest is a file's hash in revision e: from its archive's hashes,
	// or by reading its object.
	digest := func(e format.Entry, hashes map[string]string, p string) (string, error) {
		if hashes == nil {
			return w.objectDigest(ctx, e.Path+"files/"+p)
		}
		d, ok := hashes[p]
		if !ok {
			return "", fmt.Errorf("%s: %s is missing from the archive", e.Path, p)
		}
		return d, nil
	}
	so, _ := w.store.(sameObjecter)
	var out []format.TreeEntry
	for _, f := range files {
		if ha == nil && hb == nil && so != nil && so.SameObject(ctx, a.Path+"files/"+f.Path, b.Path+"files/"+f.Path) {
			continue
		}
		da, err := digest(a, ha, f.Path)
		if err != nil {
			return nil, err
		}
		db, err := digest(b, hb, f.Path)
		if err != nil {
			return nil, err
		}
		if da != db {
			out = append(out, f)
		}
	}
	return out, nil
}

func (w *Workspace) objectDigest(ctx context.Context, key string) (string, error) {
	r, err := w.openArtifact(ctx, key)
	if err != nil {
		return "", err
	}
	defer r.Close()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", fmt.Errorf("read %s: %w", key, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// archiveDigests hashes every regular file of an archive revision, which
// Tree has validated.
func (w *Workspace) archiveDigests(ctx context.Context, e format.Entry) (map[string]string, error) {
	r, err := w.openArtifact(ctx, e.Path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	out := map[string]string{}
	_, err = format.ReadArchive(r, e.Path, w.opts.Limits, func(te format.TreeEntry, content io.Reader) error {
		if te.Type != format.TypeFile {
			return nil
		}
		h := sha256.New()
		if _, err := io.Copy(h, content); err != nil {
			return fmt.Errorf("%s: %w", e.Path, err)
		}
		out[te.Path] = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	return out, err
}
