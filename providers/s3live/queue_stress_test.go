package s3live

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

func TestQueueStress(t *testing.T) {
	r := &recorder{active: map[string]bool{}, t: t, fail: map[string]int{}}
	q := newQueue(4, r.run)
	defer q.close()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 400 {
				key := fmt.Sprintf("k%d", rng.IntN(6))
				if rng.IntN(10) == 0 {
					r.mu.Lock()
					r.fail[key]++
					r.mu.Unlock()
				}
				kind := opPut
				if rng.IntN(3) == 0 {
					kind = opDel
				}
				delay := time.Duration(rng.IntN(3)) * 20 * time.Millisecond
				q.add(&op{key: key, kind: kind}, delay, false)
				if rng.IntN(20) == 0 {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					if err := q.flush(ctx, key, true); err != nil && ctx.Err() != nil {
						t.Errorf("flush %s: %v", key, err)
					}
					cancel()
				}
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := q.flush(ctx, "", false); err != nil && ctx.Err() != nil {
		q.mu.Lock()
		t.Fatalf("flush: %v; pending %d running %v order %d", err, len(q.pending), q.running, q.order.Len())
	}
}
