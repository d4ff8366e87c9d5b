package revision

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unicode/utf8"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// Snapshot walks dir and returns the selected entries, ordered by depth then
// name: files, directories and symlinks (never followed). Sockets, fifos and
// device nodes cannot be saved; they are left out and returned as skipped,
// by path. A name a revision cannot hold (not UTF-8, as S3 keys and JSON
// need; a path over 4,095 bytes; a symlink target that is not UTF-8) is an
// UNSUPPORTED_ENTRY error listing every such path.
func Snapshot(dir string, s format.Selection) (entries []format.TreeEntry, skipped []string, err error) {
	entries, skipped, _, err = snapshot(dir, s, nil)
	return entries, skipped, err
}

// snapshot is Snapshot with prep, if not nil, called for each directory
// before it is listed: it returns files the directory holds that are not
// made yet (a lazily restored directory's, listed from its revision),
// which are listed as if they were there, and returned in virtual too.
func snapshot(dir string, s format.Selection, prep func(rel string) ([]format.TreeEntry, error)) (entries []format.TreeEntry, skipped []string, virtual map[string]bool, err error) {
	r, err := snapshotWith(dir, s, walkOpts{prep: prep})
	return r.entries, r.skipped, r.virtual, err
}

// walkOpts are a snapshot's options beyond the selection.
type walkOpts struct {
	// prep, if not nil, is called for each directory before it is
	// listed: it returns the files the directory holds that are not made
	// yet (a lazily restored directory's, listed from its revision),
	// which are listed as if they were there, and in virtual too.
	prep func(rel string) ([]format.TreeEntry, error)
	// record records each directory's listing (snapResult.listings).
	record bool
	// Given the listings of an earlier snapshot (prev) and which
	// directories have not changed since it began (clean), only the
	// others are listed again: a clean directory's entries are as it
	// listed them (but for files of more than one link, which may have
	// changed through another; the stat data of its subdirectories,
	// which its parent's listing gives, is read again).
	prev  map[string]*dirListing
	clean func(uint64) bool
	// unsorted leaves the entries in the order found (sortSnapshot
	// sorts them later), for a snapshot taken while writers wait.
	unsorted bool
}

// snapResult is what a snapshot found.
type snapResult struct {
	entries  []format.TreeEntry
	skipped  []string
	virtual  map[string]bool
	listings map[string]*dirListing // with walkOpts.record
	// fresh are the entries of the directories listed (not reused from
	// walkOpts.prev), as found.
	fresh []format.TreeEntry
}

// snapshotWith is snapshot with o.
func snapshotWith(dir string, s format.Selection, o walkOpts) (snapResult, error) {
	t, err := openTree(dir)
	if err != nil {
		return snapResult{}, err
	}
	defer t.Close()
	w := walker{root: t, sel: s, slots: make(chan struct{}, snapshotWorkers-1), prep: o.prep, virtual: map[string]bool{}}
	if o.record {
		w.rec = map[string]*dirListing{}
	}
	if o.clean != nil {
		w.prev, w.clean = o.prev, o.clean
		n := 0
		for _, l := range o.prev {
			n += len(l.kids) + 1
		}
		w.out = make([]format.TreeEntry, 0, n)
		w.whole = wholeDirs(o.prev, o.clean)
	}
	if _, err := w.walk("", nil, false); err != nil {
		return snapResult{}, err
	}
	if n := len(w.bad); n > 0 {
		sort.Strings(w.bad)
		if n > 20 {
			w.bad = append(w.bad[:20], fmt.Sprintf("and %d more", n-20))
		}
		return snapResult{}, amlerr.New(amlerr.UnsupportedEntry, w.root.dir, "%d entries a revision cannot hold (exclude them): %s", n, strings.Join(w.bad, "; "))
	}
	r := snapResult{entries: w.out, skipped: w.skipped, virtual: w.virtual, listings: w.rec, fresh: w.fresh}
	if !o.unsorted {
		sortSnapshot(r)
	}
	return r, nil
}

// wholeDirs finds the directories of prev that clean vouches for, with
// every directory below them, and none of them volatile.
func wholeDirs(prev map[string]*dirListing, clean func(uint64) bool) map[string]bool {
	memo := make(map[string]bool, len(prev))
	var whole func(rel string) bool
	whole = func(rel string) bool {
		if v, ok := memo[rel]; ok {
			return v
		}
		l := prev[rel]
		ok := l != nil && !l.volatile && clean(l.ino)
		for _, de := range l.ents {
			if !ok {
				break
			}
			if c := subPath(rel, de.Name()); de.IsDir() && prev[c] != nil {
				ok = whole(c)
			}
		}
		memo[rel] = ok
		return ok
	}
	for rel := range prev {
		whole(rel)
	}
	return memo
}

func subPath(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// addWhole adds the entries of directory rel and of everything below it
// as prev listed them, its own entry among them.
func (w *walker) addWhole(rel string) {
	var out []format.TreeEntry
	var special []string
	var collect func(rel string, l *dirListing)
	collect = func(rel string, l *dirListing) {
		for name, k := range l.kids {
			switch k.kind {
			case kidEntry:
				out = append(out, k.entry)
			case kidSpecial:
				special = append(special, subPath(rel, name))
			}
		}
		for _, de := range l.ents {
			if c := subPath(rel, de.Name()); de.IsDir() && w.prev[c] != nil {
				collect(c, w.prev[c])
			}
		}
		if l.self != nil {
			out = append(out, *l.self)
		}
	}
	collect(rel, w.prev[rel])
	w.mu.Lock()
	w.out = append(w.out, out...)
	w.skipped = append(w.skipped, special...)
	w.mu.Unlock()
}

// sortSnapshot puts r's entries in a snapshot's order, and its special
// files by path: directories are walked at once, so the order found is
// not the order given.
func sortSnapshot(r snapResult) {
	sort.Strings(r.skipped)
	format.SortEntries(r.entries)
}

// dirListing is what a snapshot listed of one directory.
type dirListing struct {
	ino  uint64
	ents []os.DirEntry
	kids map[string]listedKid // what it made of each selected non-directory, by name
	// self is the entry its parent added for it (nil: none), and found
	// whether it selected anything below it; volatile, that it held
	// files not made yet or of more than one link, which a later
	// snapshot lists again.
	self     *format.TreeEntry
	found    bool
	volatile bool
}

// listedKid is what a snapshot made of one selected non-directory.
type listedKid struct {
	kind  byte // kidEntry, kidSpecial, kidGone or kidBad
	entry format.TreeEntry
	why   string // kidBad's
	multi bool   // more than one link: another may have changed it
}

const (
	kidEntry = iota + 1
	kidSpecial
	kidGone
	kidBad
)

// SpecialFilesError is the UNSUPPORTED_ENTRY error of a strict save that
// met special files: it lists every one.
func SpecialFilesError(paths []string) error {
	if len(paths) == 0 {
		return nil
	}
	q := make([]string, 0, len(paths))
	for _, p := range paths {
		q = append(q, fmt.Sprintf("%q", p))
	}
	return amlerr.New(amlerr.UnsupportedEntry, paths[0], "%d special files (sockets, fifos or devices) in the save selection, refused by --strict-entries: %s", len(paths), strings.Join(q, ", "))
}

type walker struct {
	root  *tree // every path is opened beneath it
	sel   format.Selection
	slots chan struct{} // a slot per walker beyond the caller's
	prep  func(rel string) ([]format.TreeEntry, error)

	mu      sync.Mutex // guards what follows: directories are walked at once
	out     []format.TreeEntry
	skipped []string // special files
	bad     []string // what no revision can hold, with why
	virtual map[string]bool
	rec     map[string]*dirListing // each directory's listing, by path
	fresh   []format.TreeEntry     // the entries of the directories listed, not reused
	// prev and clean, if set: a directory listed in prev that clean says
	// is unchanged since is not listed again.
	prev  map[string]*dirListing
	clean func(uint64) bool
	// whole: the directories of prev whose every directory below is
	// clean too, and none volatile: taken whole from prev, unopened.
	whole map[string]bool
}

// snapshotWorkers is how many directories a snapshot lists at once: a
// save's snapshot is a stat per file, 100k of them in a large tree.
const snapshotWorkers = 4

func (w *walker) add(e format.TreeEntry) {
	w.mu.Lock()
	w.out = append(w.out, e)
	w.mu.Unlock()
}

func (w *walker) refuse(why string) {
	w.mu.Lock()
	w.bad = append(w.bad, why)
	w.mu.Unlock()
}

// walk visits the directory rel; it reports whether it selected anything.
func (w *walker) walk(rel string, patterns []gitignore.Pattern, ignored bool) (bool, error) {
	d, err := w.root.open(rel, os.O_RDONLY|unix.O_DIRECTORY)
	if rel != "" && changedUnder(err) {
		// Removed, or swapped for a symlink or a file, since its parent
		// was listed: the save leaves it out rather than follow it.
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer d.Close()
	dfd := int(d.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return false, err
	}
	var reuse *dirListing
	if l := w.prev[rel]; l != nil && l.ino == st.Ino && w.clean(st.Ino) {
		reuse = l
	}
	var notMade []format.TreeEntry
	if w.prep != nil {
		if notMade, err = w.prep(rel); err != nil {
			return false, err
		}
	}
	var domain []string
	if rel != "" {
		domain = strings.Split(rel, "/")
	}
	if !w.sel.NoGitignore && !ignored {
		ps, err := readGitignore(dfd, d.Name(), domain)
		if err != nil {
			return false, err
		}
		patterns = append(patterns[:len(patterns):len(patterns)], ps...)
	}
	matcher := gitignore.NewMatcher(patterns)
	var ents []os.DirEntry
	if reuse != nil {
		ents = reuse.ents
	} else if ents, err = d.ReadDir(-1); err != nil {
		return false, err
	}
	var listing *dirListing
	if w.rec != nil {
		listing = &dirListing{ino: st.Ino, ents: ents, kids: map[string]listedKid{}}
		w.mu.Lock()
		w.rec[rel] = listing
		w.mu.Unlock()
	}
	var any atomic.Bool
	var local []format.TreeEntry // this directory's files and symlinks, added at once
	var subs errgroup.Group      // subdirectories walked on other walkers
	var firstErr error           // the first error met on this one
	fail := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
entries:
	for _, de := range ents {
		p := de.Name()
		if rel != "" {
			p = rel + "/" + p
		}
		if w.sel.IsHidden(p) || format.MatchAny(w.sel.Exclude, p) {
			continue // excluded or hidden: prune
		}
		isDir := de.IsDir()
		ign := !w.sel.NoGitignore && (ignored || matcher.Match(append(domain[:len(domain):len(domain)], de.Name()), isDir))
		explicit := len(w.sel.Include) > 0 && format.MatchAny(w.sel.Include, p)
		selected := (len(w.sel.Include) == 0 && !ign) || explicit
		if isDir {
			if !selected && len(w.sel.Include) == 0 {
				continue // ignored directory: prune
			}
			name := de.Name()
			sub := func() error {
				if l := w.prev[p]; l != nil && w.whole[p] && (reuse != nil || sameDir(dfd, name, l.ino)) {
					// Nothing changed below it: as listed before.
					w.addWhole(p)
					if l.self != nil {
						any.Store(true)
					}
					return nil
				}
				found, err := w.walk(p, patterns, ign)
				if err != nil || !(selected || found) {
					return err
				}
				fi, err := lstatAt(dfd, name)
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed since the listing
				}
				if err != nil {
					return err
				}
				if why := unsavableName(p); why != "" {
					w.refuse(fmt.Sprintf("%q: %s", p, why))
				}
				self := format.TreeEntry{Path: p, Type: format.TypeDir, Mode: uint32(fi.Mode().Perm()), Mtime: format.MtimeOf(fi.ModTime()), Stat: statOf(fi, false)}
				w.add(self)
				if w.rec != nil {
					w.mu.Lock()
					if l := w.rec[p]; l != nil {
						l.self = &self
					}
					w.mu.Unlock()
				}
				any.Store(true)
				return nil
			}
			// On another walker if one is free, else here. d stays
			// open until every subdirectory's walk is done.
			select {
			case w.slots <- struct{}{}:
				subs.Go(func() error {
					defer func() { <-w.slots }()
					return sub()
				})
			default:
				if err := sub(); err != nil {
					fail(err)
				}
			}
			continue
		}
		if !selected {
			continue
		}
		kid, ok := reuse.kid(de.Name())
		if !ok {
			if kid, err = listKid(dfd, p, de.Name()); err != nil {
				fail(err)
				break entries
			}
			if kid.kind == kidEntry && w.prev != nil {
				w.mu.Lock()
				w.fresh = append(w.fresh, kid.entry)
				w.mu.Unlock()
			}
		}
		if listing != nil {
			listing.kids[de.Name()] = kid
			listing.volatile = listing.volatile || kid.multi
		}
		switch kid.kind {
		case kidEntry:
			local = append(local, kid.entry)
			any.Store(true)
		case kidSpecial:
			w.mu.Lock()
			w.skipped = append(w.skipped, p)
			w.mu.Unlock()
		case kidBad:
			w.refuse(kid.why)
		}
	}
	if len(local) > 0 {
		w.mu.Lock()
		w.out = append(w.out, local...)
		w.mu.Unlock()
	}
	if listing != nil && len(notMade) > 0 {
		listing.volatile = true
	}
	if firstErr == nil && w.addNotMade(rel, notMade, ents, domain, matcher, ignored) {
		any.Store(true)
	}
	if err := subs.Wait(); firstErr == nil {
		firstErr = err
	}
	if listing != nil {
		w.mu.Lock()
		listing.found = any.Load()
		w.mu.Unlock()
	}
	return any.Load(), firstErr
}

// sameDir reports whether name, in the directory open as dfd, is still
// the directory of inode ino.
func sameDir(dfd int, name string, ino uint64) bool {
	var st unix.Stat_t
	return unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Ino == ino
}

// kid returns what l made of its non-directory name, unless l is nil or
// the file has more than one link.
func (l *dirListing) kid(name string) (listedKid, bool) {
	if l == nil {
		return listedKid{}, false
	}
	k, ok := l.kids[name]
	return k, ok && !k.multi
}

// listKid lists the selected non-directory name, at p, of the directory
// open as dfd.
func listKid(dfd int, p, name string) (listedKid, error) {
	fi, err := lstatAt(dfd, name)
	if errors.Is(err, fs.ErrNotExist) {
		return listedKid{kind: kidGone}, nil // removed since the listing
	}
	if err != nil {
		return listedKid{}, err
	}
	if why := unsavableName(p); why != "" {
		return listedKid{kind: kidBad, why: fmt.Sprintf("%q: %s", p, why)}, nil
	}
	e := format.TreeEntry{Path: p, Mode: uint32(fi.Mode().Perm()), Mtime: format.MtimeOf(fi.ModTime()), Stat: statOf(fi, true)}
	switch {
	case fi.Mode().IsRegular():
		e.Type, e.Size = format.TypeFile, fi.Size()
	case fi.Mode()&os.ModeSymlink != 0:
		target, err := readlinkAt(dfd, name)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.EINVAL) {
			return listedKid{kind: kidGone}, nil // removed or replaced since the listing
		}
		if err != nil {
			return listedKid{}, err
		}
		if !utf8.ValidString(target) || len(target) > format.MaxSymlinkTarget {
			return listedKid{kind: kidBad, why: fmt.Sprintf("%q: symlink target %q is not UTF-8 or over %d bytes", p, target, format.MaxSymlinkTarget)}, nil
		}
		e.Type, e.Target, e.Mode = format.TypeSymlink, target, 0o777
	default:
		return listedKid{kind: kidSpecial}, nil
	}
	multi := false
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		multi = st.Nlink > 1
	}
	return listedKid{kind: kidEntry, entry: e, multi: multi}, nil
}

// addNotMade lists the files of directory rel not made yet, as selected
// by the same rules as the files listed (ents); a name that is there
// after all is the one listed. It reports whether it listed any.
func (w *walker) addNotMade(rel string, notMade []format.TreeEntry, ents []os.DirEntry, domain []string, matcher gitignore.Matcher, ignored bool) bool {
	found := false
	there := make(map[string]bool, len(ents))
	for _, de := range ents {
		there[de.Name()] = true
	}
	for _, te := range notMade {
		name := path.Base(te.Path)
		p := name
		if rel != "" {
			p = rel + "/" + name
		}
		if there[name] || te.Type != format.TypeFile || p != te.Path {
			continue
		}
		if w.sel.IsHidden(p) || format.MatchAny(w.sel.Exclude, p) {
			continue
		}
		ign := !w.sel.NoGitignore && (ignored || matcher.Match(append(domain[:len(domain):len(domain)], name), false))
		explicit := len(w.sel.Include) > 0 && format.MatchAny(w.sel.Include, p)
		if !((len(w.sel.Include) == 0 && !ign) || explicit) {
			continue
		}
		w.mu.Lock()
		w.out = append(w.out, te)
		w.virtual[p] = true
		w.mu.Unlock()
		found = true
	}
	return found
}

// statOf is fi's owner and, with ino, its backing inode number and ctime
// (the save turns those into the ones the mount shows: Shown.saved).
func statOf(fi fs.FileInfo, ino bool) format.EntryStat {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return format.EntryStat{}
	}
	es := format.EntryStat{Uid: st.Uid, Gid: st.Gid}
	if ino {
		es.Ino, es.Ctime = st.Ino, format.Mtime(st.Ctim.Nano())
	}
	return es
}

// maxGitignore bounds the bytes of one .gitignore read: patterns past it
// are not applied.
const maxGitignore = 4 << 20

// readGitignore reads the .gitignore of the open directory dirfd (named
// dir), never following a symlink and never blocking on a fifo.
func readGitignore(dirfd int, dir string, domain []string) ([]gitignore.Pattern, error) {
	fd, err := unix.Openat(dirfd, ".gitignore", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == unix.EAGAIN {
		// A lease another process holds: broken by a blocking open.
		fd, err = openLeased(dirfd, ".gitignore", unix.O_RDONLY, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_SYMLINKS)
	}
	if err == unix.ENOENT || err == unix.ELOOP {
		return nil, nil // none, or a symlink: a save reads no file through one
	}
	file := filepath.Join(dir, ".gitignore")
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	f := os.NewFile(uintptr(fd), file)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, nil
	}
	var ps []gitignore.Pattern
	sc := bufio.NewScanner(io.LimitReader(f, maxGitignore))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ps = append(ps, gitignore.ParsePattern(line, domain))
	}
	return ps, sc.Err()
}

// unsavableName says why no revision can hold path p, or "".
func unsavableName(p string) string {
	switch {
	case !utf8.ValidString(p):
		return "the name is not UTF-8, which S3 keys and JSON manifests need"
	case len(p) > format.MaxPathBytes:
		return fmt.Sprintf("the path is %d bytes, over %d", len(p), format.MaxPathBytes)
	}
	return ""
}
