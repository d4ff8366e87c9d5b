package integration

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/mount"
)

// The reference model. Random sequences of operations run against the
// mounted workspace and against an in-memory model of the tree and of
// its last saved revision: creates, writes, truncates, writes through a
// shared mapping, renames over, removals, rm then recreate, a temporary
// file renamed over, hard links, symlinks, chmods, mkdir and rmdir,
// commits, a kill -9 of the daemon, and an unmount with a lazy remount on
// the same cache dir (a kept tree) or a fresh one. After each step every
// entry, byte and mode of the tree is compared with the model.
//
// An operation names its paths and sizes itself, and one the model says
// cannot apply (a missing file) is skipped by both, so any part of a
// sequence is a sequence: a failing one is shrunk to the fewest steps
// that still fail, and printed, one step a line, as testdata/model/*.txt
// holds the regression cases every run replays.
//
// AMLFS_MODEL_SEEDS (default 4) seeds per serving mode on a file store,
// and half as many on S3, of AMLFS_MODEL_STEPS (default 80) steps; AMLFS_MODEL_SEED runs that one
// seed only; AMLFS_MODEL_SHRINK is how long a failure may be shrunk
// (default 3m; 0 prints it unshrunk).

// modelOp is one step.
type modelOp struct {
	kind string
	a, b string // paths
	n, m int64  // sizes, offsets
	seed uint64 // of the bytes written
	mode uint32
}

func (o modelOp) String() string {
	q := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	return fmt.Sprintf("%s %s %s %d %d %d %o", o.kind, q(o.a), q(o.b), o.n, o.m, o.seed, o.mode)
}

func parseModelOp(line string) (modelOp, error) {
	f := strings.Fields(line)
	if len(f) != 7 {
		return modelOp{}, fmt.Errorf("%q: want 7 fields", line)
	}
	uq := func(s string) string {
		if s == "-" {
			return ""
		}
		return s
	}
	o := modelOp{kind: f[0], a: uq(f[1]), b: uq(f[2])}
	var err error
	var mode uint64
	if o.n, err = strconv.ParseInt(f[3], 10, 64); err == nil {
		if o.m, err = strconv.ParseInt(f[4], 10, 64); err == nil {
			if o.seed, err = strconv.ParseUint(f[5], 10, 64); err == nil {
				mode, err = strconv.ParseUint(f[6], 8, 32)
			}
		}
	}
	o.mode = uint32(mode)
	return o, err
}

var (
	modelDirs  = []string{"", "d1", "d2", "d1/e"}
	modelNames = []string{"f1", "f2", "f3", "f4", "f5"}
	fileModes  = []uint32{0o644, 0o600, 0o755, 0o640}
	dirModes   = []uint32{0o755, 0o700}
)

func modelPath(r *rand.Rand) string {
	dir := modelDirs[r.IntN(len(modelDirs))]
	return path.Join(dir, modelNames[r.IntN(len(modelNames))])
}

// genModelOps makes the steps of seed.
func genModelOps(seed uint64, steps int) []modelOp {
	r := rand.New(rand.NewPCG(seed, 0x6d6f64656c))
	weights := []struct {
		kind string
		w    int
	}{
		{"create", 16}, {"write", 10}, {"truncate", 4}, {"mmap", 8}, {"rename", 6}, {"unlink", 4},
		{"recreate", 8}, {"temprename", 8}, {"link", 3}, {"symlink", 3}, {"chmod", 4},
		{"mkdir", 4}, {"rmdir", 1}, {"commit", 7}, {"kill", 2}, {"remount", 2}, {"remountfresh", 4},
		{"mapwrite", 8},
	}
	total := 0
	for _, w := range weights {
		total += w.w
	}
	ops := make([]modelOp, 0, steps)
	for len(ops) < steps {
		x := r.IntN(total)
		var kind string
		for _, w := range weights {
			if x < w.w {
				kind = w.kind
				break
			}
			x -= w.w
		}
		o := modelOp{kind: kind, a: modelPath(r), b: modelPath(r), n: r.Int64N(9000), m: r.Int64N(5000), seed: r.Uint64()}
		switch kind {
		case "create", "recreate", "temprename":
			o.mode = fileModes[r.IntN(len(fileModes))]
		case "mapwrite":
			if r.IntN(3) == 0 {
				o.kind = "mapopen"
			} else if r.IntN(4) == 0 {
				o.kind = "mapclose"
			}
		case "chmod":
			o.mode = fileModes[r.IntN(len(fileModes))]
			if r.IntN(3) == 0 {
				o.a = modelDirs[1+r.IntN(len(modelDirs)-1)]
				o.mode = dirModes[r.IntN(len(dirModes))]
			}
		case "mkdir", "rmdir":
			o.a = modelDirs[1+r.IntN(len(modelDirs)-1)]
			o.mode = dirModes[r.IntN(len(dirModes))]
		case "symlink":
			o.b = []string{"f1", "../f2", "d1", "nowhere", "/abs/x"}[r.IntN(5)]
		case "remount", "remountfresh":
			o.n = int64(r.IntN(2)) // 1: no prefetch
		}
		ops = append(ops, o)
	}
	return ops
}

// The model: entries by path, files sharing a *modelFile per hard link.
type modelFile struct {
	data []byte
	mode uint32
}

type modelEntry struct {
	kind   byte // 'f', 'd', 'l'
	file   *modelFile
	mode   uint32 // a directory's
	target string
}

type treeModel map[string]*modelEntry

// clone copies the model; split gives each name its own file, as a
// revision holds it.
func (m treeModel) clone(split bool) treeModel {
	out := make(treeModel, len(m))
	files := map[*modelFile]*modelFile{}
	for p, e := range m {
		c := *e
		if e.file != nil {
			nf, ok := files[e.file]
			if !ok || split {
				nf = &modelFile{data: bytes.Clone(e.file.data), mode: e.file.mode}
				files[e.file] = nf
			}
			c.file = nf
		}
		out[p] = &c
	}
	return out
}

func (m treeModel) dirExists(p string) bool {
	if p == "" || p == "." {
		return true
	}
	e := m[p]
	return e != nil && e.kind == 'd'
}

func (m treeModel) empty(dir string) bool {
	for p := range m {
		if strings.HasPrefix(p, dir+"/") {
			return false
		}
	}
	return true
}

func modelBytes(seed uint64, n int64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	return b
}

// modelRun is one sequence's run: the env, the mount, and the model.
type modelRun struct {
	t         *testing.T
	e         *env
	mp, id    string
	live, rev treeModel
	fresh     int
	serve     string
	extra     []string // mount flags
	touched   []string // the paths the last step acted on
	maps      []heldMap
}

// heldMap is a shared writable mapping a run holds across steps.
type heldMap struct {
	f    *os.File
	mem  []byte
	file *modelFile
}

// unmapAll ends the mappings held (before an unmount or a kill).
func (r *modelRun) unmapAll() {
	for _, hm := range r.maps {
		syscall.Munmap(hm.mem)
		hm.f.Close()
	}
	r.maps = nil
}

// errSkip is a step the model says cannot apply: both skip it.
var errSkip = errors.New("skipped")

// fail is a step's failure.
type modelFailure struct {
	step int
	msg  string
}

func (f *modelFailure) Error() string { return fmt.Sprintf("step %d: %s", f.step, f.msg) }

func (r *modelRun) mount() error {
	res := r.e.mountAt(r.mp, r.id, append(r.extra[:len(r.extra):len(r.extra)], "--serve", r.serve)...)
	if res.code != 0 {
		return fmt.Errorf("mount: %s", res)
	}
	return nil
}

// pick is the existing entry of the model a step acts on, if any: the
// one its seed selects among those kind accepts, in path order (so that a
// step still acts when the steps before it are shrunk away).
func (m treeModel) pick(seed uint64, kind func(e *modelEntry) bool) (string, bool) {
	var ps []string
	for p, e := range m {
		if kind(e) {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return "", false
	}
	sort.Strings(ps)
	return ps[(seed>>32)%uint64(len(ps))], true
}

// place is where a step makes a new entry: its name, in the existing
// directory its seed selects.
func (m treeModel) place(seed uint64, name string) string {
	dir, _ := m.pick(seed>>8, func(e *modelEntry) bool { return e.kind == 'd' })
	if dir == "" || seed%4 == 0 {
		dir = ""
	}
	return path.Join(dir, path.Base(name))
}

func isFileEntry(e *modelEntry) bool { return e.kind == 'f' }

// apply runs one step on the tree and the model. It returns an error for
// a step that failed on the tree where the model says it works.
func (r *modelRun) apply(o modelOp) error {
	m := r.live
	at := func(p string) string { return filepath.Join(r.mp, filepath.FromSlash(p)) }
	isFile := func(p string) bool { e := m[p]; return e != nil && e.kind == 'f' }
	free := func(p string) bool { return m[p] == nil && m.dirExists(path.Dir(p)) }
	switch o.kind {
	case "create", "mkdir", "symlink":
		o.a = m.place(o.seed, o.a)
	case "write", "truncate", "mmap", "recreate", "temprename", "unlink", "mapopen":
		p, ok := m.pick(o.seed, isFileEntry)
		if !ok {
			return errSkip
		}
		o.a = p
	case "link", "rename":
		p, ok := m.pick(o.seed, func(e *modelEntry) bool { return e.kind != 'd' })
		if !ok {
			return errSkip
		}
		o.a = p
		if o.seed%3 == 0 { // over an existing one
			if q, ok := m.pick(o.seed*31, func(e *modelEntry) bool { return e.kind != 'd' }); ok {
				o.b = q
				break
			}
		}
		o.b = m.place(o.seed*7, o.b)
	case "chmod":
		p, ok := m.pick(o.seed, func(e *modelEntry) bool { return e.kind != 'l' })
		if !ok {
			return errSkip
		}
		o.a = p
		if m[p].kind == 'd' {
			o.mode = dirModes[o.seed%2]
		}
	case "rmdir":
		p, ok := m.pick(o.seed, func(e *modelEntry) bool { return e.kind == 'd' })
		if !ok {
			return errSkip
		}
		o.a = p
	}
	r.touched = []string{o.a, o.b, o.a + ".tmp"}
	create := func(p string, data []byte, mode uint32) error {
		if err := os.WriteFile(at(p), data, 0o600); err != nil {
			return err
		}
		if err := os.Chmod(at(p), os.FileMode(mode)); err != nil {
			return err
		}
		m[p] = &modelEntry{kind: 'f', file: &modelFile{data: data, mode: mode}}
		return nil
	}
	switch o.kind {
	case "create":
		if !free(o.a) {
			return errSkip
		}
		return create(o.a, modelBytes(o.seed, o.n), o.mode)
	case "write":
		if !isFile(o.a) {
			return errSkip
		}
		f, err := os.OpenFile(at(o.a), os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		data := modelBytes(o.seed, o.m%3000+1)
		_, err = f.WriteAt(data, o.n)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		mf := m[o.a].file
		if end := o.n + int64(len(data)); end > int64(len(mf.data)) {
			mf.data = append(mf.data, make([]byte, end-int64(len(mf.data)))...)
		}
		copy(mf.data[o.n:], data)
		return err
	case "truncate":
		if !isFile(o.a) {
			return errSkip
		}
		mf := m[o.a].file
		size := o.n % 10000
		if err := os.Truncate(at(o.a), size); err != nil {
			return err
		}
		if size > int64(len(mf.data)) {
			mf.data = append(mf.data, make([]byte, size-int64(len(mf.data)))...)
		}
		mf.data = mf.data[:size]
		return nil
	case "mmap":
		if !isFile(o.a) || len(m[o.a].file.data) == 0 {
			return errSkip
		}
		mf := m[o.a].file
		size := int64(len(mf.data))
		off := o.n % size
		data := modelBytes(o.seed, min(o.m%3000+1, size-off))
		f, err := os.OpenFile(at(o.a), os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		mm, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if err != nil {
			return err
		}
		copy(mm[off:], data)
		if o.seed%2 == 0 { // half of them synced, half left to the kernel
			if err := unix.Msync(mm, unix.MS_SYNC); err != nil {
				return err
			}
		}
		copy(mf.data[off:], data)
		return syscall.Munmap(mm)
	case "rename":
		src, dst := m[o.a], m[o.b]
		if src == nil || src.kind == 'd' || o.a == o.b || !m.dirExists(path.Dir(o.b)) || dst != nil && dst.kind == 'd' {
			return errSkip
		}
		if err := os.Rename(at(o.a), at(o.b)); err != nil {
			return err
		}
		if dst != nil && dst.kind == 'f' && src.kind == 'f' && dst.file == src.file {
			return nil // two names of one file: rename(2) does nothing
		}
		m[o.b] = src
		delete(m, o.a)
		return nil
	case "unlink":
		if e := m[o.a]; e == nil || e.kind == 'd' {
			return errSkip
		}
		delete(m, o.a)
		return os.Remove(at(o.a))
	case "recreate":
		if !isFile(o.a) {
			return errSkip
		}
		if err := os.Remove(at(o.a)); err != nil {
			return err
		}
		delete(m, o.a)
		return create(o.a, modelBytes(o.seed, o.n), o.mode)
	case "temprename":
		tmp := o.a + ".tmp"
		if !isFile(o.a) || m[tmp] != nil {
			return errSkip
		}
		if err := create(tmp, modelBytes(o.seed, o.n), o.mode); err != nil {
			return err
		}
		if err := os.Rename(at(tmp), at(o.a)); err != nil {
			return err
		}
		m[o.a] = m[tmp]
		delete(m, tmp)
		return nil
	case "link":
		if !isFile(o.a) || !free(o.b) {
			return errSkip
		}
		m[o.b] = &modelEntry{kind: 'f', file: m[o.a].file}
		return os.Link(at(o.a), at(o.b))
	case "symlink":
		if !free(o.a) {
			return errSkip
		}
		m[o.a] = &modelEntry{kind: 'l', target: o.b}
		return os.Symlink(o.b, at(o.a))
	case "chmod":
		e := m[o.a]
		switch {
		case e == nil || e.kind == 'l':
			return errSkip
		case e.kind == 'd' && o.mode&0o700 != 0o700, e.kind == 'f' && o.mode == 0o700:
			return errSkip
		case e.kind == 'd':
			e.mode = o.mode
		default:
			e.file.mode = o.mode
		}
		return os.Chmod(at(o.a), os.FileMode(o.mode))
	case "mkdir":
		if !free(o.a) {
			return errSkip
		}
		m[o.a] = &modelEntry{kind: 'd', mode: o.mode}
		if err := os.Mkdir(at(o.a), 0o700); err != nil {
			return err
		}
		return os.Chmod(at(o.a), os.FileMode(o.mode))
	case "rmdir":
		if e := m[o.a]; e == nil || e.kind != 'd' || !m.empty(o.a) {
			return errSkip
		}
		delete(m, o.a)
		return syscall.Rmdir(at(o.a))
	case "mapopen":
		mf := m[o.a].file
		if len(mf.data) == 0 || len(r.maps) >= 3 {
			return errSkip
		}
		f, err := os.OpenFile(at(o.a), os.O_RDWR, 0)
		if err != nil {
			return err
		}
		mem, err := syscall.Mmap(int(f.Fd()), 0, len(mf.data), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if err != nil {
			f.Close()
			return err
		}
		r.maps = append(r.maps, heldMap{f, mem, mf})
	case "mapwrite":
		if len(r.maps) == 0 {
			return errSkip
		}
		hm := r.maps[o.seed%uint64(len(r.maps))]
		size := int64(min(len(hm.mem), len(hm.file.data))) // no page past the end
		if size == 0 {
			return errSkip
		}
		off := o.n % size
		data := modelBytes(o.seed, min(o.m%3000+1, size-off))
		copy(hm.mem[off:], data)
		copy(hm.file.data[off:], data)
		if o.seed%3 == 0 {
			return unix.Msync(hm.mem, unix.MS_SYNC)
		}
	case "mapclose":
		if len(r.maps) == 0 {
			return errSkip
		}
		i := int(o.seed % uint64(len(r.maps)))
		syscall.Munmap(r.maps[i].mem)
		r.maps[i].f.Close()
		r.maps = slices.Delete(r.maps, i, i+1)
	case "commit":
		if res := r.e.amlfs("commit", r.mp); res.code != 0 {
			return fmt.Errorf("commit: %s", res)
		}
		r.rev = m.clone(true)
	case "kill":
		r.unmapAll()
		st := r.e.amlfs("status", r.mp, "--json")
		pid := 0
		if i := strings.Index(st.stdout, `"pid": `); i >= 0 {
			fmt.Sscan(st.stdout[i+7:], &pid)
		}
		if pid <= 0 {
			return fmt.Errorf("no daemon pid: %s", st)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		deadline := time.Now().Add(30 * time.Second)
		for !mountGoneOrDead(r.mp) {
			if time.Now().After(deadline) {
				return fmt.Errorf("the mount of a killed daemon stayed up")
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The tree resumes as it was, links and all.
		return r.mount()
	case "remount", "remountfresh":
		r.unmapAll()
		if res := r.e.unmount(r.mp); res.code != 0 {
			return fmt.Errorf("unmount: %s", res)
		}
		r.rev = m.clone(true)
		r.live = r.rev.clone(true)
		if o.kind == "remountfresh" {
			r.fresh++
			r.e.cache = filepath.Join(r.e.root, fmt.Sprintf("cache%d", r.fresh))
		}
		r.extra = r.extra[:0]
		if o.n == 1 {
			r.extra = append(r.extra, "--prefetch", "0")
		}
		return r.mount()
	default:
		return fmt.Errorf("unknown step %q", o.kind)
	}
	return nil
}

func mountGoneOrDead(mp string) bool { return !isMounted(mp) || mount.IsDeadMount(mp) }

// compareModel walks the tree at mp and says how it differs from the
// model: every entry, type, mode and size, and the bytes of the files
// read says (nil: all). Reading a lazily restored file fetches it, so a
// step reads only what it touched, and the whole tree at times.
func compareModel(mp string, m treeModel, read func(rel string) bool) []string {
	var diffs []string
	seen := map[string]bool{}
	filepath.Walk(mp, func(p string, fi os.FileInfo, err error) error {
		rel, _ := filepath.Rel(mp, p)
		rel = filepath.ToSlash(rel)
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("%s: %v", rel, err))
			return nil
		}
		if rel == "." {
			return nil
		}
		seen[rel] = true
		e := m[rel]
		if e == nil {
			diffs = append(diffs, fmt.Sprintf("%s: in the tree, not in the model", rel))
			return nil
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			if t, err := os.Readlink(p); e.kind != 'l' || err != nil || t != e.target {
				diffs = append(diffs, fmt.Sprintf("%s: symlink to %q (%v), model %c %q", rel, t, err, e.kind, e.target))
			}
		case fi.IsDir():
			if e.kind != 'd' || uint32(fi.Mode().Perm()) != e.mode {
				diffs = append(diffs, fmt.Sprintf("%s: directory %o, model %c %o", rel, fi.Mode().Perm(), e.kind, e.mode))
			}
		case fi.Mode().IsRegular():
			if e.kind != 'f' {
				diffs = append(diffs, fmt.Sprintf("%s: a file, model %c", rel, e.kind))
				return nil
			}
			if fi.Size() != int64(len(e.file.data)) {
				diffs = append(diffs, fmt.Sprintf("%s: %d bytes, model %d", rel, fi.Size(), len(e.file.data)))
			}
			if read != nil && !read(rel) {
				return nil
			}
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, e.file.data) {
				diffs = append(diffs, fmt.Sprintf("%s: %d bytes %.16q (%v), model %d bytes %.16q", rel, len(got), got, err, len(e.file.data), e.file.data))
			}
			if uint32(fi.Mode().Perm()) != e.file.mode {
				diffs = append(diffs, fmt.Sprintf("%s: mode %o, model %o", rel, fi.Mode().Perm(), e.file.mode))
			}
		default:
			diffs = append(diffs, fmt.Sprintf("%s: mode %v", rel, fi.Mode()))
		}
		return nil
	})
	for p := range m {
		if !seen[p] {
			diffs = append(diffs, fmt.Sprintf("%s: in the model, not in the tree", p))
		}
	}
	sort.Strings(diffs)
	return diffs
}

// verifyRevision restores the current revision on another host, as a
// reader that takes no lease and saves nothing, and compares it with the
// model of the last save.
func (r *modelRun) verifyRevision() []string {
	h := r.e.host(r.t)
	mp := filepath.Join(h.root, "verify")
	if res := h.mountAt(mp, r.id, "--no-lock", "--save", "never", "--serve", r.serve); res.code != 0 {
		return []string{fmt.Sprintf("load the current revision: %s", res)}
	}
	defer h.forceUnmount(mp)
	return compareModel(mp, r.rev, nil)
}

// modelStore is where a run's workspace lives.
type modelStore struct {
	name string
	env  func(t *testing.T) *env
}

// runModel runs ops from an empty workspace; the first failure, if any.
func runModel(t *testing.T, st modelStore, serve string, ops []modelOp) *modelFailure {
	e := st.env(t)
	r := &modelRun{t: t, e: e, id: "model", mp: filepath.Join(e.root, "mnt"), live: treeModel{}, rev: treeModel{}, serve: serve}
	if err := r.mount(); err != nil {
		return &modelFailure{-1, err.Error()}
	}
	defer e.forceUnmount(r.mp)
	defer r.unmapAll()
	applied := map[string]int{}
	defer func() { t.Logf("steps applied: %v", applied) }()
	for i, o := range ops {
		err := r.apply(o)
		if err == errSkip {
			continue
		}
		if err != nil {
			return &modelFailure{i, fmt.Sprintf("%s: %v", o, err)}
		}
		applied[o.kind]++
		var read func(string) bool
		if o.kind != "commit" && i%10 != 9 {
			read = func(rel string) bool { return slices.Contains(r.touched, rel) }
		}
		if o.kind == "kill" || o.kind == "remount" || o.kind == "remountfresh" {
			read = func(string) bool { return false } // leave the tree lazy
		}
		if d := compareModel(r.mp, r.live, read); len(d) > 0 {
			return &modelFailure{i, fmt.Sprintf("after %s the tree differs from the model:\n  %s", o, strings.Join(d[:min(len(d), 8)], "\n  "))}
		}
		if o.kind == "commit" {
			// The revision published is the model's, restored on
			// another host.
			if d := r.verifyRevision(); len(d) > 0 {
				return &modelFailure{i, fmt.Sprintf("after %s the revision differs from the model:\n  %s", o, strings.Join(d[:min(len(d), 8)], "\n  "))}
			}
		}
	}
	// The last revision, restored on a fresh cache dir, is the model's.
	r.unmapAll()
	if res := e.unmount(r.mp); res.code != 0 {
		return &modelFailure{len(ops), fmt.Sprintf("unmount: %s", res)}
	} else if os.Getenv("AMLFS_MODEL_DEBUG") != "" {
		t.Logf("final unmount: %s", res)
		logs, _ := filepath.Glob(filepath.Join(e.runtime, "*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("%s:\n%s", l, b)
		}
	}
	e.cache = filepath.Join(e.root, "cache-final")
	r.extra = []string{"--prefetch", "0"}
	if err := r.mount(); err != nil {
		return &modelFailure{len(ops), err.Error()}
	}
	if d := compareModel(r.mp, r.live.clone(true), nil); len(d) > 0 {
		return &modelFailure{len(ops), fmt.Sprintf("the revision saved at the end differs from the model:\n  %s", strings.Join(d[:min(len(d), 8)], "\n  "))}
	}
	return nil
}

// TestReferenceModel runs random sequences against the model, in both
// serving modes, on a file store and on S3 through a proxy that loses
// every reply to some publications of workspace.json; then the
// regression cases of testdata/model.
func TestReferenceModel(t *testing.T) {
	seeds, steps := 4, 80
	if v, err := strconv.Atoi(os.Getenv("AMLFS_MODEL_SEEDS")); err == nil {
		seeds = v
	}
	if v, err := strconv.Atoi(os.Getenv("AMLFS_MODEL_STEPS")); err == nil {
		steps = v
	}
	var only []uint64
	if v, err := strconv.ParseUint(os.Getenv("AMLFS_MODEL_SEED"), 10, 64); err == nil {
		only = []uint64{v}
	}
	shrink := 3 * time.Minute
	if v, err := time.ParseDuration(os.Getenv("AMLFS_MODEL_SHRINK")); err == nil {
		shrink = v
	}
	stores := []modelStore{
		{"file", func(t *testing.T) *env { return newEnv(t) }},
		{"s3", func(t *testing.T) *env {
			e, px := faultyS3Env(t)
			// Every reply lost for 8 requests in 12 to workspace.json:
			// every attempt of one publication, the SDK's retries too.
			var n int
			putIndex := onIndex("PUT")
			lost := &fault{kind: faultLost, match: func(r *http.Request) bool {
				if !putIndex(r) {
					return false
				}
				n++ // under the proxy's lock
				return n%12 >= 3 && n%12 < 11
			}}
			px.set(lost)
			t.Cleanup(func() { t.Logf("publications whose reply was lost: %d", px.acted(lost)) })
			return e
		}},
	}
	for _, serve := range modelServes(t) {
		for si, st := range stores {
			t.Run(serve+"/"+st.name, func(t *testing.T) {
				list := only
				if list == nil {
					// The S3 runs are fewer: each request crosses the
					// proxy and the server.
					n := seeds
					if si > 0 {
						n = max(1, seeds/2)
					}
					for i := range n {
						list = append(list, uint64(1000*si+i+1))
					}
				}
				for _, seed := range list {
					ops := genModelOps(seed, steps)
					if f := runModel(t, st, serve, ops); f != nil {
						reportModel(t, st, serve, fmt.Sprintf("seed %d", seed), ops, f, shrink)
					}
				}
			})
		}
	}
	cases, _ := filepath.Glob(filepath.Join("testdata", "model", "*.txt"))
	for _, c := range cases {
		data, err := os.ReadFile(c)
		must(t, err)
		var ops []modelOp
		for _, line := range strings.Split(string(data), "\n") {
			if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			o, err := parseModelOp(line)
			must(t, err)
			ops = append(ops, o)
		}
		for _, serve := range modelServes(t) {
			t.Run(filepath.Base(c)+"/"+serve, func(t *testing.T) {
				if f := runModel(t, stores[0], serve, ops); f != nil {
					reportModel(t, stores[0], serve, c, ops, f, 0)
				}
			})
		}
	}
}

// modelServes are the serving modes this host runs.
func modelServes(t *testing.T) []string {
	if mode := os.Getenv("AMLFS_TEST_SERVE"); mode != "" {
		return []string{mode}
	}
	if defaultServe(newEnv(t)) == "native" {
		return []string{"native", "fuse"}
	}
	return []string{"fuse"}
}

// reportModel fails the test with the sequence, shrunk for up to budget
// to the fewest steps that still fail.
func reportModel(t *testing.T, st modelStore, serve, name string, ops []modelOp, f *modelFailure, budget time.Duration) {
	t.Helper()
	t.Errorf("%s (%s, %s): %v", name, serve, st.name, f)
	if f.step >= 0 && f.step < len(ops) {
		ops = ops[:f.step+1]
	}
	deadline := time.Now().Add(budget)
	for chunk := len(ops) / 2; chunk >= 1 && time.Now().Before(deadline); chunk /= 2 {
		for i := 0; i+chunk <= len(ops) && time.Now().Before(deadline); {
			try := append(append([]modelOp{}, ops[:i]...), ops[i+chunk:]...)
			if g := runModel(t, st, serve, try); g != nil {
				ops, f = try, g
				if g.step >= 0 && g.step < len(ops) {
					ops = ops[:g.step+1]
				}
				continue
			}
			i += chunk
		}
	}
	var b strings.Builder
	for _, o := range ops {
		b.WriteString(o.String() + "\n")
	}
	t.Errorf("shrunk to %d steps, failing with %v; as a regression case (testdata/model/NAME.txt):\n%s", len(ops), f, b.String())
}
