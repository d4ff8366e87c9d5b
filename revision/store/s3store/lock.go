package s3store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/amlfs/amlfs/revision/store"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/uuid"

	"github.com/amlfs/amlfs/amlerr"
)

// The S3 lease is AML's ROOT/lock.json, {"token":"<uuid>","updatedAt":<ms>}:
// created with If-None-Match: *, refreshed with If-Match on its ETag, stale
// after LockStale without a refresh, taken over only with If-Match on the
// ETag observed stale, and released by checking the token, then deleting.

const lockKey = "lock.json"

type lockRecord struct {
	Token     string `json:"token"`
	UpdatedAt int64  `json:"updatedAt"`
}

func (s *Store) conflict(detail string) error {
	return amlerr.New(amlerr.WorkspaceConflict, s.ID, "workspace %q is locked by another writer (%s); wait for it, choose another --id, or pass --no-lock", s.ID, detail)
}

func (s *Store) putLock(ctx context.Context, rec lockRecord, ifMatch string) (string, error) {
	data, _ := json.Marshal(rec)
	in := &s3.PutObjectInput{Bucket: &s.Bucket, Key: aws.String(s.key(lockKey)), Body: bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data))), ContentType: aws.String("application/json")}
	if ifMatch == "" {
		in.IfNoneMatch = aws.String("*")
	} else {
		in.IfMatch = aws.String(ifMatch)
	}
	out, err := s.Client.PutObject(ctx, in)
	if err != nil {
		return "", s.wrap("put", *in.Key, err)
	}
	return aws.ToString(out.ETag), nil
}

func (s *Store) readLock(ctx context.Context) (lockRecord, string, error) {
	data, etag, err := s.get(ctx, s.key(lockKey), 64<<10)
	if err != nil {
		return lockRecord{}, "", err
	}
	var rec lockRecord
	if err := json.Unmarshal(data, &rec); err != nil || rec.Token == "" {
		// An unreadable lock is held by someone we cannot identify; it is
		// treated as fresh unless its ETag goes stale through takeover
		// rules, which need updatedAt: refuse.
		return lockRecord{}, etag, fmt.Errorf("malformed %s: %q", lockKey, data)
	}
	return rec, etag, nil
}

// Lock takes the lease.
func (s *Store) Lock(ctx context.Context, onLost func(error), dead func(holder string) bool) (store.Lease, error) {
	rec := lockRecord{Token: uuid.NewString(), UpdatedAt: s.Now().UnixMilli()}
	etag, err := s.putLock(ctx, rec, "")
	if errors.Is(err, store.ErrPrecondition) {
		etag, err = s.takeOver(ctx, rec, dead)
	}
	if err != nil {
		return nil, err
	}
	l := &s3Lease{Heartbeat: store.NewHeartbeat(onLost), s: s, token: rec.Token, etag: etag}
	l.Start(s.LockRefresh, l.refresh)
	return l, nil
}

func (s *Store) takeOver(ctx context.Context, rec lockRecord, dead func(string) bool) (string, error) {
	cur, etag, err := s.readLock(ctx)
	if errors.Is(err, store.ErrNotExist) {
		// Released in between: try a fresh create once more.
		etag, err := s.putLock(ctx, rec, "")
		if errors.Is(err, store.ErrPrecondition) {
			return "", s.conflict("another writer took the lock first")
		}
		return etag, err
	}
	if err != nil {
		return "", s.conflict(err.Error())
	}
	if cur.Token == rec.Token {
		// Our own create, retried by the SDK after a lost response.
		return etag, nil
	}
	age := s.Now().Sub(time.UnixMilli(cur.UpdatedAt))
	if age < s.LockStale && (dead == nil || !dead(cur.Token)) {
		return "", s.conflict(fmt.Sprintf("%s refreshed %s ago", s.key(lockKey), age.Truncate(time.Second)))
	}
	etag, err = s.putLock(ctx, rec, etag)
	if errors.Is(err, store.ErrPrecondition) {
		if cur, etag, rerr := s.readLock(ctx); rerr == nil && cur.Token == rec.Token {
			return etag, nil // our takeover landed; its retry failed
		}
		return "", s.conflict("another writer took over the stale lock first")
	}
	return etag, err
}

type s3Lease struct {
	*store.Heartbeat
	s     *Store
	token string

	mu   sync.Mutex
	etag string // GUARDED_BY(mu)
}

// refresh is one heartbeat: rewrite lock.json with If-Match on its ETag.
// Only a 412 after which lock.json holds another token loses the lease: a
// refresh whose reply was lost landed, and moved the ETag on (its retry,
// or the next tick, then fails its precondition), so lock.json is read
// back first. A transient failure keeps the ETag for the next tick, since
// the lease goes stale only after LockStale.
func (l *s3Lease) refresh() error {
	l.mu.Lock()
	etag := l.etag
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	next, err := l.s.putLock(ctx, lockRecord{Token: l.token, UpdatedAt: l.s.Now().UnixMilli()}, etag)
	switch {
	case errors.Is(err, store.ErrPrecondition):
		cur, etag, rerr := l.s.readLock(ctx)
		switch {
		case rerr == nil && cur.Token == l.token:
			next = etag // an earlier refresh of ours landed
		case rerr == nil || errors.Is(rerr, store.ErrNotExist):
			return amlerr.New(amlerr.LockLost, l.s.key(lockKey), "the lock was taken over by another writer")
		default:
			return nil // not known: the next tick looks again
		}
	case err != nil:
		return nil
	}
	l.mu.Lock()
	l.etag = next
	l.mu.Unlock()
	return nil
}

func (l *s3Lease) Holder() string { return l.token }

// Lost checks with the store that lock.json still holds our token.
func (l *s3Lease) Lost() error {
	if lost := l.LostErr(); lost != nil {
		return lost
	}
	cur, _, err := l.s.readLock(context.Background())
	if err != nil && !errors.Is(err, store.ErrNotExist) {
		return fmt.Errorf("check lock: %w", err)
	}
	if err != nil || cur.Token != l.token {
		err := amlerr.New(amlerr.LockLost, l.s.key(lockKey), "the lock no longer holds this writer's token")
		l.SetLost(err)
		return err
	}
	return nil
}

// Release deletes lock.json if it still holds our token.
func (l *s3Lease) Release(ctx context.Context) error {
	l.Halt()
	if err := l.Lost(); err != nil {
		return err
	}
	l.mu.Lock()
	etag := l.etag
	l.mu.Unlock()
	_, err := l.s.Client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &l.s.Bucket, Key: aws.String(l.s.key(lockKey)), IfMatch: aws.String(etag)})
	if err != nil && errors.Is(l.s.wrap("", "", err), store.ErrPrecondition) {
		// A refresh whose reply was lost moved the ETag on: the lock
		// read back says whether it is still ours to delete.
		cur, cetag, rerr := l.s.readLock(ctx)
		switch {
		case errors.Is(rerr, store.ErrNotExist):
			return nil
		case rerr != nil:
			return l.s.wrap("delete", l.s.key(lockKey), err)
		case cur.Token != l.token:
			return amlerr.New(amlerr.LockLost, l.s.key(lockKey), "the lock no longer holds this writer's token")
		}
		_, err = l.s.Client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &l.s.Bucket, Key: aws.String(l.s.key(lockKey)), IfMatch: aws.String(cetag)})
	}
	if err != nil && !errors.Is(l.s.wrap("", "", err), store.ErrNotExist) {
		return l.s.wrap("delete", l.s.key(lockKey), err)
	}
	return nil
}
