package revision

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

// Short markers. A placeholder's marker names where its bytes are. A
// member of an archive is a long key (memberKey: the archive's path, four
// numbers and the file's path), and on ext4 an xattr value past about 60
// bytes does not fit in the inode: each placeholder would take a 4 KiB
// block of its own for it, which doubles the time a lazy tree takes to
// make and the room it takes on the disk. So a member is marked by
// reference, "@<n>:<i>": the i-th entry of the index of the archive
// numbered n in the tree's table, an xattr of the working directory's root
// (RevsXattr) holding a line "<n> <archive>" per archive that markers name.
// A folder's object keeps its whole key as its marker.
//
// A marker read back after a crash becomes a reference key (refKey), which
// the fetch resolves through the archive's index (indexCache).

// RevsUserXattr is the user-namespace name of the table of archives that
// short markers name; as root, in the trusted namespace (PendingXattr).
const RevsUserXattr = "user.amlfs.revs"

// RevsXattr is the table's name as this process reads and writes it.
func RevsXattr() string { return markerXattr(RevsUserXattr) }

// maxRevTable bounds the table: past it, the archives no pending
// placeholder names any more are dropped from it.
const maxRevTable = 2048

// revTable numbers the archives that short markers name. Its lock is held
// shared while a marker is written with a number, and whole while the
// table drops numbers, so a number is never dropped under a marker being
// written.
type revTable struct {
	mu    sync.RWMutex
	dir   string
	byRev map[string]int // GUARDED_BY(mu)
	byN   map[int]string // GUARDED_BY(mu)
}

func newRevTable(dir string) *revTable {
	return &revTable{dir: dir, byRev: map[string]int{}, byN: map[int]string{}}
}

// load reads the table of dir's root; a tree without one has none.
func (t *revTable) load() error {
	buf := make([]byte, 64<<10)
	n, err := unix.Lgetxattr(t.dir, RevsXattr(), buf)
	if errors.Is(err, unix.ENODATA) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(buf[:n]), "\n"), "\n") {
		num, rev, ok := strings.Cut(line, " ")
		i, err := strconv.Atoi(num)
		if !ok || err != nil || i < 0 || !isArchiveKey(rev) {
			return amlerr.New(amlerr.InvalidStore, t.dir, "bad table of archives %q", line)
		}
		t.byRev[rev], t.byN[i] = i, rev
	}
	return nil
}

// number returns rev's number, adding it to the table (written to the
// disk before any marker can name it) if it has none; ok is false if the
// table cannot take it, and the marker is then the whole key. inUse lists
// the archives pending placeholders still name, for a table grown past its
// bound. Must hold t.mu shared; it is released and taken again when the
// table changes.
func (t *revTable) number(rev string, inUse func() map[string]bool) (int, bool) {
	if n, ok := t.byRev[rev]; ok {
		return n, true
	}
	if strings.ContainsAny(rev, "\n ") {
		return 0, false
	}
	t.mu.RUnlock()
	defer t.mu.RLock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if n, ok := t.byRev[rev]; ok {
		return n, true
	}
	byN := map[int]string{}
	size := 0
	for n, r := range t.byN {
		byN[n] = r
		size += len(r) + 8
	}
	if size+len(rev) > maxRevTable {
		used := inUse()
		for n, r := range byN {
			if !used[r] {
				delete(byN, n)
			}
		}
	}
	next := 0
	for n := range byN {
		next = max(next, n+1)
	}
	byN[next] = rev
	var b bytes.Buffer
	for n, r := range byN {
		b.WriteString(strconv.Itoa(n))
		b.WriteByte(' ')
		b.WriteString(r)
		b.WriteByte('\n')
	}
	if err := unix.Lsetxattr(t.dir, RevsXattr(), b.Bytes(), 0); err != nil {
		return 0, false
	}
	t.byN = byN
	t.byRev = make(map[string]int, len(byN))
	for n, r := range byN {
		t.byRev[r] = n
	}
	return next, true
}

// marker is what a placeholder whose bytes are at key (the idx-th entry of
// its archive's index, or -1) is marked with. Must hold t.mu shared.
func (t *revTable) marker(key string, idx int, inUse func() map[string]bool) []byte {
	if idx < 0 {
		return []byte(key)
	}
	archive, _, ok := parseMemberKey(key)
	if !ok {
		return []byte(key)
	}
	n, ok := t.number(archive, inUse)
	if !ok {
		return []byte(key)
	}
	return []byte("@" + strconv.Itoa(n) + ":" + strconv.Itoa(idx))
}

// key reads a marker back: a whole key, or a short marker as a refKey.
func (t *revTable) key(m string) (string, bool) {
	rest, short := strings.CutPrefix(m, "@")
	if !short {
		return m, validPendingKey(m)
	}
	num, idx, ok := strings.Cut(rest, ":")
	n, err1 := strconv.Atoi(num)
	i, err2 := strconv.Atoi(idx)
	if !ok || err1 != nil || err2 != nil || i < 0 {
		return "", false
	}
	t.mu.RLock()
	rev, ok := t.byN[n]
	t.mu.RUnlock()
	if !ok {
		// Numbered since the table was read (a save's repointing still
		// running in the process whose tree this is): read it again.
		t.mu.Lock()
		err := t.load()
		rev, ok = t.byN[n]
		t.mu.Unlock()
		if err != nil || !ok {
			return "", false
		}
	}
	return refKey(rev, i), true
}

// refKey names the file that is the idx-th entry of the archive's index;
// the fetch reads the index to find its member.
func refKey(archive string, idx int) string {
	return archive + "#@" + strconv.Itoa(idx)
}

// parseRefKey reads a refKey back; ok is false for any other key.
func parseRefKey(key string) (archive string, idx int, ok bool) {
	archive, rest, ok := strings.Cut(key, "#@")
	if !ok || !isArchiveKey(archive) {
		return "", 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 {
		return "", 0, false
	}
	return archive, i, true
}

// isArchiveKey: key is a revision's archive, this workspace's
// ("revisions/<id>.tar.gz") or another's.
func isArchiveKey(key string) bool {
	if store.CheckKey(key) != nil {
		return false
	}
	if _, rest, ok := store.SplitForeign(key); ok {
		key = rest
	}
	id, ok := strings.CutPrefix(key, "revisions/")
	id, ok2 := strings.CutSuffix(id, format.ArchiveExt)
	return ok && ok2 && id != "" && !strings.Contains(id, "/")
}

// indexCache keeps the indexes of the archives that reference keys name,
// read once however many fetches want one at the same time.
type indexCache struct {
	lru *lru.Cache[string, *format.ArchiveIndex]
	sf  singleflight.Group
}

func newIndexCache() *indexCache {
	c, _ := lru.New[string, *format.ArchiveIndex](2)
	return &indexCache{lru: c}
}

// resolveRef turns a refKey into the memberKey of its file.
func (w *Workspace) resolveRef(ctx context.Context, archive string, idx int) (string, error) {
	x, ok := w.indexes.lru.Get(archive)
	if !ok {
		v, err, _ := w.indexes.sf.Do(archive, func() (any, error) {
			x, err := w.archiveIndex(ctx, archive)
			if err != nil {
				return nil, err
			}
			if x == nil {
				return nil, amlerr.New(amlerr.InvalidStore, archive, "a placeholder names an entry of this archive's index, but it has none")
			}
			w.indexes.lru.Add(archive, x)
			return x, nil
		})
		if err != nil {
			return "", err
		}
		x = v.(*format.ArchiveIndex)
	}
	if idx >= len(x.Entries) || x.Entries[idx].Type != format.TypeFile {
		return "", amlerr.New(amlerr.InvalidStore, archive, "a placeholder names entry %d of the index, which is not a file", idx)
	}
	return memberKey(archive, x.Entries[idx]), nil
}
