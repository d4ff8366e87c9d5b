package revision

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/gitindex"
	"golang.org/x/sys/unix"
)

// GitRefresh is what RefreshGitIndexes did.
type GitRefresh struct {
	Indexes   int      // git indexes found in the restored tree
	Refreshed int      // entries pointed at their restored files
	Left      []string // indexes left alone, each with the reason
	// Entries left alone, by reason: racily clean (or flagged) as git
	// wrote them; no saved stat data for their file; stat data other than
	// the saved ones (the file changed after git last looked at it); a
	// restored file other than the saved one.
	Racy, NotSaved, Stale, Unrestored int
}

// maxGitIndex bounds the index a refresh reads: far above a real one
// (about 100 bytes an entry).
const maxGitIndex = 256 << 20

// RefreshGitIndexes points the entries of the git indexes in the tree the
// last restore made at the files it made, as git's own refresh would, so
// that the first `git status` rehashes (and fetches) nothing it would not
// have rehashed at save. A restore makes new inodes, with new numbers and
// ctimes; git compares them with its index and would read every tracked
// file again. An entry is refreshed only if its stat data still match what
// the file had when the tree was saved (the saved stat data the revision
// keeps), the file was restored with the saved size and mtime, and git
// would have trusted it then (gitindex.Refresh leaves racily clean and
// flagged entries alone). Each index is rewritten as git writes it: a lock
// file, then a rename.
//
// The mount serves the tree natively; through FUSE the mount shows the
// saved stat data instead (package fuse/shown), and this is not called.
// root is the path the sandbox sees the tree at, which linked worktrees
// record. It runs once, after a restore, before the tree is served; a tree
// restored earlier (resumed) has nothing to refresh.
func (w *Workspace) RefreshGitIndexes(ctx context.Context, root string) (GitRefresh, error) {
	var res GitRefresh
	w.lmu.Lock()
	saved, b := w.restored, w.base
	w.restored = nil
	w.lmu.Unlock()
	if len(saved) == 0 || b == nil {
		return res, nil
	}
	byPath := make(map[string]*format.TreeEntry, len(saved))
	var indexes []string
	for i := range saved {
		te := &saved[i]
		byPath[te.Path] = te
		if te.Type == format.TypeFile && path.Base(te.Path) == "index" {
			indexes = append(indexes, te.Path)
		}
	}
	t, err := openTree(b.dir)
	if err != nil {
		return res, err
	}
	defer t.Close()
	for _, ix := range indexes {
		gitdir := path.Dir(ix)
		if _, ok := byPath[path.Join(gitdir, "HEAD")]; !ok {
			continue // a file named index, not a git directory's
		}
		res.Indexes++
		wt, why := w.gitWorktree(ctx, t, gitdir, byPath, root)
		if why == "" {
			why = w.refreshIndex(ctx, t, ix, wt, byPath, &res)
		}
		if why != "" {
			res.Left = append(res.Left, ix+": "+why)
		}
	}
	return res, ctx.Err()
}

// gitWorktree is the worktree (a tree path, "" for the root) of the git
// directory gitdir, as git finds it: core.worktree in its config; for a
// linked worktree, the directory its gitdir file names; else the parent
// of a directory named .git. why says why there is none (a bare
// repository, a worktree outside the tree).
func (w *Workspace) gitWorktree(ctx context.Context, t *tree, gitdir string, byPath map[string]*format.TreeEntry, root string) (wt, why string) {
	inTree := func(p string) (string, string) {
		if path.IsAbs(p) {
			rel, ok := strings.CutPrefix(p, strings.TrimSuffix(root, "/")+"/")
			if !ok {
				return "", "its worktree " + p + " is outside the tree"
			}
			p = rel
		} else {
			p = path.Join(gitdir, p)
		}
		p = path.Clean(p)
		if p == ".." || strings.HasPrefix(p, "../") {
			return "", "its worktree is outside the tree"
		}
		if p == "." {
			p = ""
		}
		return p, ""
	}
	if _, ok := byPath[path.Join(gitdir, "config")]; ok {
		cfg, err := w.readTreeFile(ctx, t, path.Join(gitdir, "config"), 1<<20)
		if err != nil {
			return "", err.Error()
		}
		if v, ok := coreWorktree(cfg); ok {
			return inTree(v)
		}
	}
	if _, ok := byPath[path.Join(gitdir, "gitdir")]; ok {
		// A linked worktree's: the absolute path of the worktree's .git
		// file.
		data, err := w.readTreeFile(ctx, t, path.Join(gitdir, "gitdir"), 4096)
		if err != nil {
			return "", err.Error()
		}
		return inTree(path.Dir(strings.TrimSpace(string(data))))
	}
	if path.Base(gitdir) == ".git" {
		return inTree("..")
	}
	return "", "a bare repository, or a worktree it cannot tell"
}

// coreWorktree finds core.worktree in a git config file: the last value
// given, as git takes it. Only the plain forms git writes are read; an
// include or a quoted value with escapes gives none.
func coreWorktree(cfg []byte) (string, bool) {
	var section, val string
	found := false
	for _, line := range strings.Split(string(cfg), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			section = strings.ToLower(strings.Trim(strings.Fields(line + " ")[0], "[]"))
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section != "core" || !strings.EqualFold(strings.TrimSpace(k), "worktree") {
			continue
		}
		v = strings.TrimSpace(v)
		if strings.ContainsAny(v, "\\\";#") {
			return "", false
		}
		val, found = v, true
	}
	return val, found && val != ""
}

// readTreeFile reads the file rel of the restored tree, fetching it first
// if it is a placeholder.
func (w *Workspace) readTreeFile(ctx context.Context, t *tree, rel string, limit int64) ([]byte, error) {
	f, err := t.open(rel, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := w.fillFd(ctx, int(f.Fd())); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is over %d bytes", rel, limit)
	}
	return data, nil
}

// refreshIndex refreshes the index ix, of the worktree wt, and writes it
// back if any entry changed, counting in res what it did. It returns why
// the index was left alone, or "".
func (w *Workspace) refreshIndex(ctx context.Context, t *tree, ix, wt string, byPath map[string]*format.TreeEntry, res *GitRefresh) string {
	data, err := w.readTreeFile(ctx, t, ix, maxGitIndex)
	if err != nil {
		return err.Error()
	}
	dirs := dirCache{t: t, dirs: map[string]*os.File{}}
	defer dirs.close()
	out, r, err := gitindex.Refresh(data, gitTime(int64(byPath[ix].Mtime)), func(e gitindex.Entry) (gitindex.Stat, bool) {
		te := byPath[path.Join(wt, e.Path)]
		if te == nil || te.Stat.Ino == 0 || te.Stat.Ctime == 0 {
			res.NotSaved++
			return e.Stat, false
		}
		if (e.Mode&0o170000 == 0o120000) != (te.Type == format.TypeSymlink) || (te.Type != format.TypeFile && te.Type != format.TypeSymlink) {
			res.Stale++
			return e.Stat, false
		}
		size := te.Size
		if te.Type == format.TypeSymlink {
			size = int64(len(te.Target)) // what lstat gives, and git records
		}
		if want := gitStat(te.Mtime, te.Stat.Ctime, te.Stat.Ino, te.Stat.Uid, te.Stat.Gid, size, e.Stat); e.Stat != want {
			res.Stale++
			return e.Stat, false // git saw other stat data than the saved ones
		}
		var st unix.Stat_t
		if err := dirs.stat(path.Join(wt, e.Path), &st); err != nil || st.Size != size || unix.TimespecToNsec(st.Mtim) != int64(te.Mtime) {
			res.Unrestored++
			return e.Stat, false // not as the restore made it
		}
		return gitindex.Stat{Ctime: gitTime(st.Ctim.Nano()), Mtime: gitTime(st.Mtim.Nano()),
			Dev: uint32(st.Dev), Ino: uint32(st.Ino), Uid: st.Uid, Gid: st.Gid, Size: uint32(st.Size)}, true
	})
	if err != nil {
		return err.Error()
	}
	res.Racy += r.Racy
	if r.Refreshed == 0 || bytes.Equal(out, data) {
		return ""
	}
	if err := writeLike(t, ix, out); err != nil {
		return err.Error()
	}
	res.Refreshed += r.Refreshed
	w.log.Debug("git index refreshed", "index", ix, "version", r.Version, "entries", r.Entries, "refreshed", r.Refreshed, "racy", r.Racy)
	return ""
}

// gitStat is the stat data git would have recorded for a file of the
// saved stat data given, in the fields git compares: the device is taken
// from have (git does not compare it), and so are the nanoseconds of both
// times, which git as built by default (without USE_NSEC) does not compare
// either: an entry git trusted because its seconds matched is trusted here
// too, and no other.
func gitStat(mtime, ctime format.Mtime, ino uint64, uid, gid uint32, size int64, have gitindex.Stat) gitindex.Stat {
	ct, mt := gitTime(int64(ctime)), gitTime(int64(mtime))
	ct.Nsec, mt.Nsec = have.Ctime.Nsec, have.Mtime.Nsec
	return gitindex.Stat{Ctime: ct, Mtime: mt, Dev: have.Dev, Ino: uint32(ino), Uid: uid, Gid: gid, Size: uint32(size)}
}

// gitTime is a time in nanoseconds as the index keeps it.
func gitTime(ns int64) gitindex.Time {
	return gitindex.Time{Sec: uint32(ns / 1e9), Nsec: uint32(ns % 1e9)}
}

// writeLike replaces the file rel with data as git replaces its index: a
// lock file beside it, with its mode and owner, then a rename over it. An
// existing lock file (a git at work) leaves it alone.
func writeLike(t *tree, rel string, data []byte) error {
	dir, name := path.Split(rel)
	d, err := t.open(strings.TrimSuffix(dir, "/"), unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer d.Close()
	dfd := int(d.Fd())
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	lock := name + ".lock"
	fd, err := unix.Openat(dfd, lock, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, st.Mode&0o7777)
	if err != nil {
		return fmt.Errorf("%s: %w", rel+".lock", err)
	}
	werr := func() error {
		if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		for b := data; len(b) > 0; {
			n, err := unix.Write(fd, b)
			if err != nil {
				return err
			}
			b = b[n:]
		}
		return unix.Fsync(fd)
	}()
	unix.Close(fd)
	if werr == nil {
		werr = unix.Renameat(dfd, lock, dfd, name)
	}
	if werr != nil {
		unix.Unlinkat(dfd, lock, 0)
		return fmt.Errorf("write %s: %w", rel, werr)
	}
	return nil
}

// dirCache stats files beneath a tree by their directory's descriptor,
// each directory opened once (beneath the root, no symlink followed).
type dirCache struct {
	t    *tree
	dirs map[string]*os.File
}

func (c *dirCache) stat(rel string, st *unix.Stat_t) error {
	dir, name := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	d, ok := c.dirs[dir]
	if !ok {
		var err error
		if d, err = c.t.open(dir, unix.O_RDONLY|unix.O_DIRECTORY); err != nil {
			return err
		}
		c.dirs[dir] = d
	}
	return unix.Fstatat(int(d.Fd()), name, st, unix.AT_SYMLINK_NOFOLLOW)
}

func (c *dirCache) close() {
	for _, d := range c.dirs {
		d.Close()
	}
}
