// Package memstore is a store held in memory, for tests: the engine's unit
// tests run on it, and it passes the same conformance suite (storetest) as
// the directory and S3 stores. A Base holds every workspace under one
// store base, so forks reach their sources by foreign keys, and can be
// told to fail operations, to test what the engine does with a broken
// store.
package memstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/revision/format"
	"github.com/amlfs/amlfs/revision/store"
)

// Base is the memory of one store base: every workspace's objects, index
// versions and leases.
type Base struct {
	mu      sync.Mutex
	objects map[string][]byte  // GUARDED_BY(mu): by seg/key
	indexes map[string]string  // GUARDED_BY(mu): index version, by seg
	locks   map[string]*record // GUARDED_BY(mu): by seg
	gen     int                // GUARDED_BY(mu)
	fault   func(op, key string) error
	now     func() time.Time
	// Compose's multipart rules (PartRules); zero for S3's.
	minPart, maxPart int64
	maxParts         int
}

// record is a held lease.
type record struct {
	holder  string
	touched time.Time
}

// NewBase returns an empty base.
func NewBase() *Base {
	return &Base{objects: map[string][]byte{}, indexes: map[string]string{}, locks: map[string]*record{}, now: time.Now}
}

// Fail makes every later operation for which fn returns an error fail
// with it: op is "read", "publish", "put", "commit", "remove", "list",
// "lock" or "refresh", or for Compose "copy-part" and "put-part", and key the object's key within its workspace. A
// nil fn heals the store. "publish-reply" is asked after a publication
// landed: its error is the caller's, as when the reply to a request that
// was carried out is lost (a timeout, a reset connection).
func (b *Base) Fail(fn func(op, key string) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fault = fn
}

// Objects returns a copy of every object under the base, by seg/key, for
// tests that compare a store's content before and after.
func (b *Base) Objects() map[string][]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string][]byte, len(b.objects))
	for k, v := range b.objects {
		out[k] = bytes.Clone(v)
	}
	return out
}

// Set writes an object as another writer (or an attacker) would, with no
// check of any kind; data nil deletes it.
func (b *Base) Set(key string, data []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if data == nil {
		delete(b.objects, key)
		return
	}
	b.objects[key] = bytes.Clone(data)
	if seg, k, ok := strings.Cut(key, "/"); ok && k == format.IndexKey {
		b.gen++
		b.indexes[seg] = strconv.Itoa(b.gen)
	}
}

func (b *Base) failed(op, key string) error {
	if b.fault == nil {
		return nil
	}
	return b.fault(op, key)
}

// Store is one workspace's store in a Base. LockRefresh and LockStale
// are the lease's heartbeat and staleness, as AML's.
type Store struct {
	base                   *Base
	ID, Seg                string
	LockRefresh, LockStale time.Duration
}

// New returns the store of workspace id in base.
func New(base *Base, id string) (*Store, error) {
	seg, err := format.Seg(id)
	if err != nil {
		return nil, err
	}
	return &Store{base: base, ID: id, Seg: seg, LockRefresh: 5 * time.Minute, LockStale: 20 * time.Minute}, nil
}

func (s *Store) String() string { return "mem://" + s.Seg }

// full is the base key of key, resolving a foreign key to its
// workspace; ok is false for a key that leaves its root.
func (s *Store) full(key string) (string, bool) {
	if store.IsForeign(key) {
		seg, rest, ok := store.SplitForeign(key)
		return seg + "/" + rest, ok
	}
	if key != format.IndexKey && format.ValidPath(strings.TrimSuffix(key, "/")) != nil {
		return "", false
	}
	return s.Seg + "/" + key, true
}

// Sibling returns the store of workspace id in the same base.
func (s *Store) Sibling(id string) (store.Store, error) {
	o, err := New(s.base, id)
	if err != nil {
		return nil, err
	}
	o.LockRefresh, o.LockStale = s.LockRefresh, s.LockStale
	return o, nil
}

// Foreign returns key as the workspace's siblings name it.
func (s *Store) Foreign(key string) string { return store.ForeignKey(s.Seg, key) }

func (s *Store) ReadIndex(ctx context.Context) ([]byte, string, error) {
	b := s.base
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failed("read", format.IndexKey); err != nil {
		return nil, "", err
	}
	data, ok := b.objects[s.Seg+"/"+format.IndexKey]
	if !ok {
		return nil, "", fmt.Errorf("%w: %s/%s", store.ErrNotExist, s, format.IndexKey)
	}
	return bytes.Clone(data), b.indexes[s.Seg], nil
}

func (s *Store) PublishIndex(ctx context.Context, data []byte, prev string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	b := s.base
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failed("publish", format.IndexKey); err != nil {
		return "", err
	}
	_, exists := b.objects[s.Seg+"/"+format.IndexKey]
	switch {
	case !exists && prev != "":
		return "", fmt.Errorf("%w: %s disappeared", store.ErrPrecondition, format.IndexKey)
	case exists && b.indexes[s.Seg] != prev:
		return "", fmt.Errorf("%w: %s was replaced by another writer", store.ErrPrecondition, format.IndexKey)
	}
	b.gen++
	v := strconv.Itoa(b.gen)
	b.objects[s.Seg+"/"+format.IndexKey] = bytes.Clone(data)
	b.indexes[s.Seg] = v
	if err := b.failed("publish-reply", format.IndexKey); err != nil {
		return "", err
	}
	return v, nil
}

func (s *Store) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	data, err := s.object(ctx, "read", key)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(bytes.Clone(data))), nil
}

// under returns every base key of the artifact at full ("…/" for a
// folder, its keys; else the one object).
func (b *Base) under(full string) []string {
	if !strings.HasSuffix(full, "/") {
		if _, ok := b.objects[full]; ok {
			return []string{full}
		}
		return nil
	}
	var keys []string
	for k := range b.objects {
		if strings.HasPrefix(k, full) {
			keys = append(keys, k)
		}
	}
	return keys
}

func (s *Store) Remove(ctx context.Context, key string) error {
	if store.IsForeign(key) {
		return fmt.Errorf("remove %s: another workspace's object", key)
	}
	full, ok := s.full(key)
	if !ok {
		return amlerr.New(amlerr.InvalidStore, key, "not a key of this store")
	}
	b := s.base
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failed("remove", key); err != nil {
		return err
	}
	for _, k := range b.under(full) {
		delete(b.objects, k)
	}
	return nil
}

func (s *Store) Artifacts(ctx context.Context) ([]string, error) {
	b := s.base
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failed("list", "revisions/"); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	prefix := s.Seg + "/revisions/"
	for k := range b.objects {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		if dir, _, folder := strings.Cut(rest, "/"); folder {
			seen["revisions/"+dir+"/"] = true
		} else {
			seen["revisions/"+rest] = true
		}
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

func (s *Store) Destroy(ctx context.Context) error {
	b := s.base
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failed("remove", ""); err != nil {
		return err
	}
	for _, k := range b.under(s.Seg + "/") {
		delete(b.objects, k)
	}
	delete(b.indexes, s.Seg)
	return nil
}

// Probe: memory honours every conditional write.
func (s *Store) Probe(ctx context.Context) store.Probe {
	return store.Probe{Reachable: true, Writable: true, IfNoneMatch: true, IfMatch: true}
}

// SameObject reports whether a and b hold the same bytes; a reused object
// is a copy here, as on S3.
func (s *Store) SameObject(ctx context.Context, a, b string) bool {
	fa, oka := s.full(a)
	fb, okb := s.full(b)
	if !oka || !okb {
		return false
	}
	s.base.mu.Lock()
	defer s.base.mu.Unlock()
	da, oka := s.base.objects[fa]
	db, okb := s.base.objects[fb]
	return oka && okb && bytes.Equal(da, db)
}

func (s *Store) Stage(ctx context.Context, key string) (store.Stager, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	full, ok := s.full(key)
	if !ok || store.IsForeign(key) || !strings.HasPrefix(key, "revisions/") {
		return nil, amlerr.New(amlerr.InvalidStore, key, "not an artifact key of this store")
	}
	return &stager{s: s, key: key, full: full, folder: strings.HasSuffix(key, "/"), objects: map[string][]byte{}}, nil
}

type stager struct {
	s       *Store
	key     string
	full    string
	folder  bool
	written func(string, int64)

	mu      sync.Mutex
	objects map[string][]byte // GUARDED_BY(mu): by name
	done    bool              // GUARDED_BY(mu)
}

func (st *stager) OnWritten(fn func(string, int64)) { st.written = fn }

func (st *stager) name(name string) error {
	if !st.folder {
		if name != "" {
			return fmt.Errorf("archive artifact has a single object, not %q", name)
		}
		return nil
	}
	return format.ValidPath(name)
}

func (st *stager) land(name string, data []byte, reported int64) error {
	if err := st.s.base.fail("put", st.key+name); err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return fmt.Errorf("%s: staged after commit or abort", st.key)
	}
	if _, ok := st.objects[name]; ok {
		return fmt.Errorf("%s%s: put twice", st.key, name)
	}
	st.objects[name] = data
	if st.written != nil {
		st.written(name, reported)
	}
	return nil
}

func (b *Base) fail(op, key string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failed(op, key)
}

func (st *stager) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	if err := st.name(name); err != nil {
		return err
	}
	var data []byte
	var err error
	if size < 0 {
		data, err = io.ReadAll(r)
	} else {
		data, err = io.ReadAll(io.LimitReader(r, size+1))
		if err == nil && int64(len(data)) != size {
			err = fmt.Errorf("%s: read %d bytes, expected %d (did it change during the save?)", name, len(data), size)
		}
	}
	if err != nil {
		return err
	}
	return st.land(name, data, int64(len(data)))
}

func (st *stager) PutFile(ctx context.Context, name string, f *os.File, done func(store.Stamp, error)) error {
	defer f.Close()
	if err := st.name(name); err != nil {
		return err
	}
	var buf bytes.Buffer
	stp, err := store.ReadStable(f, func(size int64, attempt int) error {
		buf.Reset()
		_, err := store.CopyExactly(&buf, f, size)
		return err
	})
	if errors.Is(err, store.ErrUnsettled) {
		done(store.Stamp{}, err) // nothing landed
		return nil
	}
	if err != nil {
		return err
	}
	if err := st.land(name, buf.Bytes(), int64(stp.Size)); err != nil {
		return err
	}
	done(stp, nil)
	return nil
}

func (st *stager) Flush(ctx context.Context) error { return ctx.Err() }

func (st *stager) Reuse(ctx context.Context, name, fromKey string, local *os.File, done func(*store.Stamp, error)) error {
	if err := st.name(name); err != nil {
		store.CloseLocal(local)
		return err
	}
	from, ok := st.s.full(fromKey)
	if !ok {
		store.CloseLocal(local)
		return amlerr.New(amlerr.InvalidStore, fromKey, "not a key of this store")
	}
	b := st.s.base
	b.mu.Lock()
	data, found := b.objects[from]
	b.mu.Unlock()
	if !found {
		// The base revision was pruned: write the bytes from the tree.
		if local == nil {
			return store.BaseGone(fromKey)
		}
		return st.PutFile(ctx, name, local, func(stp store.Stamp, err error) { done(&stp, err) })
	}
	store.CloseLocal(local)
	if err := st.land(name, bytes.Clone(data), 0); err != nil {
		return err
	}
	done(nil, nil)
	return nil
}

func (st *stager) Commit(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := st.s.base
	st.mu.Lock()
	defer st.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failed("commit", st.key); err != nil {
		return err
	}
	if st.done {
		return fmt.Errorf("%s: committed twice, or after abort", st.key)
	}
	if len(b.under(st.full)) > 0 {
		return fmt.Errorf("%w: %s", store.ErrExist, st.key)
	}
	if !st.folder {
		if _, ok := st.objects[""]; !ok {
			return fmt.Errorf("%s: nothing was written", st.key)
		}
	}
	for name, data := range st.objects {
		b.objects[st.full+name] = data
	}
	st.done = true
	return nil
}

func (st *stager) Abort(ctx context.Context) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.done = true
	st.objects = nil
	return nil
}

func (s *Store) conflict(detail string) error {
	return amlerr.New(amlerr.WorkspaceConflict, s.ID, "workspace %q is locked by another writer (%s); wait for it, choose another --id, or pass --no-lock", s.ID, detail)
}

// Lock takes the lease: a record per workspace, refreshed by the
// heartbeat and stale after LockStale without a refresh.
func (s *Store) Lock(ctx context.Context, onLost func(error), dead func(holder string) bool) (store.Lease, error) {
	b := s.base
	b.mu.Lock()
	if err := b.failed("lock", s.Seg); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if cur, ok := b.locks[s.Seg]; ok {
		age := b.now().Sub(cur.touched)
		if age < s.LockStale && (dead == nil || !dead(cur.holder)) {
			b.mu.Unlock()
			return nil, s.conflict(fmt.Sprintf("lease refreshed %s ago", age.Truncate(time.Second)))
		}
	}
	rec := &record{holder: uuid.NewString(), touched: b.now()}
	b.locks[s.Seg] = rec
	b.mu.Unlock()
	l := &lease{Heartbeat: store.NewHeartbeat(onLost), s: s, holder: rec.holder}
	l.Start(s.LockRefresh, l.refresh)
	return l, nil
}

type lease struct {
	*store.Heartbeat
	s      *Store
	holder string
}

func (l *lease) Holder() string { return l.holder }

// check reports a lease no longer ours; the caller holds the base's lock.
func (l *lease) check() error {
	if cur, ok := l.s.base.locks[l.s.Seg]; !ok || cur.holder != l.holder {
		return amlerr.New(amlerr.LockLost, l.s.ID, "lease was taken over by another writer")
	}
	return nil
}

func (l *lease) refresh() error {
	b := l.s.base
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failed("refresh", l.s.Seg); err != nil {
		return amlerr.Wrap(amlerr.LockLost, l.s.ID, err)
	}
	if err := l.check(); err != nil {
		return err
	}
	b.locks[l.s.Seg].touched = b.now()
	return nil
}

func (l *lease) Lost() error {
	if err := l.LostErr(); err != nil {
		return err
	}
	l.s.base.mu.Lock()
	err := l.check()
	l.s.base.mu.Unlock()
	if err != nil {
		l.SetLost(err)
	}
	return err
}

func (l *lease) Release(ctx context.Context) error {
	l.Halt()
	if err := l.Lost(); err != nil {
		return err
	}
	b := l.s.base
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := l.check(); err != nil {
		return err
	}
	delete(b.locks, l.s.Seg)
	return nil
}
