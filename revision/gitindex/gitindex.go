// Package gitindex refreshes the stat data of a git index's entries, in
// place, as git's own refresh would: after a restore made new inodes for a
// repository's files, the entries git had recorded as matching their files
// are pointed at the new inodes, so that git does not rehash (and, on a
// lazily restored tree, fetch) every file on the first `git status`.
//
// Only the stat fields of entries the caller vouches for change; every other
// byte (paths, object ids, flags, extensions git added, known or not) is
// kept as it was, and the trailing checksum is computed again. An index this
// package cannot read exactly (another version, a split index, no checksum,
// a hash it cannot tell) is refused with ErrUnsupported and left alone.
package gitindex

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
)

// ErrUnsupported says the index is of a kind Refresh leaves alone.
var ErrUnsupported = errors.New("git index left alone")

// Time is a timestamp as the index keeps it: 32-bit seconds and
// nanoseconds.
type Time struct{ Sec, Nsec uint32 }

// Stat is an entry's stat data, as the index keeps it (each field 32 bits:
// a larger inode number or size is kept truncated, as git does).
type Stat struct {
	Ctime, Mtime Time
	Dev, Ino     uint32
	Uid, Gid     uint32
	Size         uint32
}

// Entry is what the caller is told of each entry.
type Entry struct {
	Path string // relative to the worktree, '/'-separated
	Mode uint32 // 0o100644, 0o100755, 0o120000, 0o160000, ...
	Stat Stat
}

// Refresher decides an entry's new stat data: ok false leaves it as it is.
type Refresher func(e Entry) (Stat, bool)

// Result is what Refresh did.
type Result struct {
	Version   uint32
	HashSize  int // 20 (SHA-1) or 32 (SHA-256)
	Entries   int // in the index
	Refreshed int
	Racy      int // racily clean entries, left alone
}

// entry flags (ondisk) and extended flags.
const (
	flagValid     = 0x8000 // assume-unchanged
	flagExtended  = 0x4000
	flagStageMask = 0x3000
	flagNameMask  = 0x0fff

	extSkipWorktree = 0x4000
	extIntentToAdd  = 0x2000
)

// maxEntries bounds the entry count an index may claim (git itself reads
// up to 2^32; this is far above any real tree and keeps a lying header from
// making work).
const maxEntries = 1 << 24

// Refresh returns data, a git index file written when the index file had
// mtime mtime, with the stat data of the entries fresh accepts rewritten,
// and a new checksum. It never offers fresh an entry git would not trust at
// save: racily clean ones (modified in the same second as the index, or
// after), assume-unchanged, skip-worktree and intent-to-add ones, entries
// of a merge stage other than 0, and gitlinks.
func Refresh(data []byte, mtime Time, fresh Refresher) ([]byte, Result, error) {
	var res Result
	if len(data) < 12+20 || string(data[:4]) != "DIRC" {
		return nil, res, fmt.Errorf("%w: not a git index", ErrUnsupported)
	}
	res.Version = binary.BigEndian.Uint32(data[4:8])
	if res.Version < 2 || res.Version > 4 {
		return nil, res, fmt.Errorf("%w: index version %d", ErrUnsupported, res.Version)
	}
	n := binary.BigEndian.Uint32(data[8:12])
	if n > maxEntries {
		return nil, res, fmt.Errorf("%w: %d entries", ErrUnsupported, n)
	}
	res.Entries = int(n)
	// The trailing checksum tells the hash: git writes the index's own
	// hash (SHA-1 or SHA-256, as the repository's objects), or all zeros
	// with index.skipHash, which tells nothing.
	var h func() hash.Hash
	for _, c := range []struct {
		size int
		new  func() hash.Hash
	}{{20, sha1.New}, {32, sha256.New}} {
		if len(data) < 12+c.size {
			continue
		}
		sum := c.new()
		sum.Write(data[:len(data)-c.size])
		if bytes.Equal(sum.Sum(nil), data[len(data)-c.size:]) {
			res.HashSize, h = c.size, c.new
			break
		}
	}
	if h == nil {
		return nil, res, fmt.Errorf("%w: no checksum it can verify (index.skipHash, or damaged)", ErrUnsupported)
	}
	body := len(data) - res.HashSize
	out := bytes.Clone(data)
	off := 12
	var prev []byte // v4: the previous entry's path
	for i := 0; i < int(n); i++ {
		fixed := 40 + res.HashSize + 2 // stat data, oid, flags
		if off+fixed > body {
			return nil, res, fmt.Errorf("%w: entry %d runs past the end", ErrUnsupported, i)
		}
		e := data[off:]
		flags := binary.BigEndian.Uint16(e[40+res.HashSize:])
		var ext uint16
		if flags&flagExtended != 0 {
			if res.Version < 3 || off+fixed+2 > body {
				return nil, res, fmt.Errorf("%w: entry %d has extended flags in a version %d index", ErrUnsupported, i, res.Version)
			}
			ext = binary.BigEndian.Uint16(e[fixed:])
			fixed += 2
		}
		var path []byte
		var end int // offset of the next entry
		if res.Version == 4 {
			// A varint of the bytes to drop from the previous path, then
			// the rest of the path, NUL-terminated; no padding.
			strip, w := varint(data[off+fixed : body])
			if w == 0 || strip > uint64(len(prev)) {
				return nil, res, fmt.Errorf("%w: entry %d: bad path prefix", ErrUnsupported, i)
			}
			rest := data[off+fixed+w : body]
			z := bytes.IndexByte(rest, 0)
			if z < 0 {
				return nil, res, fmt.Errorf("%w: entry %d: unterminated path", ErrUnsupported, i)
			}
			path = append(append([]byte(nil), prev[:len(prev)-int(strip)]...), rest[:z]...)
			end = off + fixed + w + z + 1
		} else {
			rest := data[off+fixed : body]
			z := bytes.IndexByte(rest, 0)
			if z < 0 {
				return nil, res, fmt.Errorf("%w: entry %d: unterminated path", ErrUnsupported, i)
			}
			path = rest[:z]
			// Padded with 1 to 8 NULs to a multiple of 8 bytes.
			end = off + (fixed+z+8)&^7
			if end > body {
				return nil, res, fmt.Errorf("%w: entry %d runs past the end", ErrUnsupported, i)
			}
		}
		if l := int(flags & flagNameMask); l != flagNameMask && l != len(path) {
			return nil, res, fmt.Errorf("%w: entry %d: path length %d, flags say %d", ErrUnsupported, i, len(path), l)
		}
		prev = path
		st := readStat(e)
		mode := binary.BigEndian.Uint32(e[24:28])
		skip := flags&(flagValid|flagStageMask) != 0 || ext&(extSkipWorktree|extIntentToAdd) != 0 ||
			(mode&0o170000 != 0o100000 && mode&0o170000 != 0o120000)
		if !skip && racy(st.Mtime, mtime) {
			res.Racy++
			skip = true
		}
		if !skip {
			if ns, ok := fresh(Entry{Path: string(path), Mode: mode, Stat: st}); ok && ns != st {
				writeStat(out[off:], ns)
				res.Refreshed++
			}
		}
		off = end
	}
	if err := checkExtensions(data[off:body]); err != nil {
		return nil, res, err
	}
	if res.Refreshed == 0 {
		return data, res, nil
	}
	sum := h()
	sum.Write(out[:body])
	copy(out[body:], sum.Sum(nil))
	return out, res, nil
}

// racy is git's is_racy_timestamp: an entry modified in the second the
// index was written, or later, may have changed since without its stat
// data showing it, so git checks its content whatever its stat data say.
func racy(entry, index Time) bool {
	return index.Sec != 0 && index.Sec <= entry.Sec
}

// checkExtensions walks the extensions after the entries. A split index
// ("link": the entries are a delta over a shared index) is left alone; any
// other extension is kept byte for byte, whatever it is.
func checkExtensions(b []byte) error {
	for len(b) > 0 {
		if len(b) < 8 {
			return fmt.Errorf("%w: a truncated extension", ErrUnsupported)
		}
		sig, size := string(b[:4]), binary.BigEndian.Uint32(b[4:8])
		if uint64(size) > uint64(len(b)-8) {
			return fmt.Errorf("%w: extension %q runs past the end", ErrUnsupported, sig)
		}
		if sig == "link" {
			return fmt.Errorf("%w: a split index", ErrUnsupported)
		}
		b = b[8+size:]
	}
	return nil
}

// varint is git's offset encoding (varint.c), as index v4 uses it.
func varint(b []byte) (uint64, int) {
	if len(b) == 0 {
		return 0, 0
	}
	c := b[0]
	val := uint64(c & 127)
	i := 1
	for c&128 != 0 {
		if i >= len(b) || i > 9 {
			return 0, 0
		}
		val++
		c = b[i]
		i++
		val = val<<7 + uint64(c&127)
	}
	return val, i
}

func readStat(e []byte) Stat {
	u := func(i int) uint32 { return binary.BigEndian.Uint32(e[i*4:]) }
	return Stat{Ctime: Time{u(0), u(1)}, Mtime: Time{u(2), u(3)}, Dev: u(4), Ino: u(5), Uid: u(7), Gid: u(8), Size: u(9)}
}

func writeStat(e []byte, s Stat) {
	p := func(i int, v uint32) { binary.BigEndian.PutUint32(e[i*4:], v) }
	p(0, s.Ctime.Sec)
	p(1, s.Ctime.Nsec)
	p(2, s.Mtime.Sec)
	p(3, s.Mtime.Nsec)
	p(4, s.Dev)
	p(5, s.Ino)
	p(7, s.Uid)
	p(8, s.Gid)
	p(9, s.Size)
}
