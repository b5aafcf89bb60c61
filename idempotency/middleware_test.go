package idempotency_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/idempotency"
)

const order = `{"order":"o-1","amount":500}`

func TestFirstRequestThenReplayIdenticalBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)

	first := post(t, b.url, "key-1", order)
	if first.status != 201 || first.replayed() || !strings.Contains(first.body, `"order":"o-1"`) {
		t.Fatalf("first request: %v", first)
	}
	for i := range 2 {
		again := post(t, b.url, "key-1", order)
		if again.status != first.status || again.body != first.body || !again.replayed() {
			t.Fatalf("retry %d: %v\nfirst: %v", i+1, again, first)
		}
		for _, h := range []string{"Content-Type", "Location", "Content-Length"} {
			if again.header.Get(h) != first.header.Get(h) {
				t.Errorf("retry %d: %s = %q, first had %q", i+1, h, again.header.Get(h), first.header.Get(h))
			}
		}
		if again.header.Get("X-Handled-At") != "" {
			t.Errorf("retry %d replayed X-Handled-At, which is not in ReplayHeaders", i+1)
		}
	}
	if n := b.api.calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want 1", n)
	}
	if n := charges(t, b.pool); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	// A new key is a new operation.
	if r := post(t, b.url, "key-2", order); r.status != 201 || r.replayed() || charges(t, b.pool) != 2 {
		t.Fatalf("new key: %v, charges %d", r, charges(t, b.pool))
	}
}

func TestConcurrentDuplicateGets409(t *testing.T) {
	t.Parallel()
	api := &chargeAPI{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	b := setup(t, idempotency.Config{}, api)

	firstDone := make(chan reply, 1)
	go func() {
		r, err := send(b.url, "k", order)
		if err != nil {
			t.Error(err)
		}
		firstDone <- r
	}()
	<-api.entered // the first request holds the key

	// The first request stays held until after this answer: a 409 can only
	// come from the duplicate giving up on the key's lock (InFlightWait 0),
	// never from waiting for the first to end.
	dup := post(t, b.url, "k", order)
	if !isProblem(dup, 409) || dup.header.Get("Retry-After") == "" {
		t.Fatalf("duplicate while in flight: %v", dup)
	}
	api.gate <- struct{}{}
	first := <-firstDone
	if first.status != 201 {
		t.Fatalf("first: %v", first)
	}
	if after := post(t, b.url, "k", order); after.body != first.body || !after.replayed() {
		t.Fatalf("after the first finished: %v", after)
	}
	if n := charges(t, b.pool); n != 1 || api.calls.Load() != 1 {
		t.Fatalf("%d charges, %d handler calls; want 1, 1", n, api.calls.Load())
	}
}

func TestConcurrentDuplicatesWaitAndReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{InFlightWait: time.Minute}, nil)

	const n = 8
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := send(b.url, "same", order)
			if err != nil {
				t.Error(err)
			}
			replies[i] = r
		})
	}
	wg.Wait()
	fresh := 0
	for i, r := range replies {
		if r.status != 201 || r.body != replies[0].body {
			t.Fatalf("reply %d: %v\nreply 0: %v", i, r, replies[0])
		}
		if !r.replayed() {
			fresh++
		}
	}
	if fresh != 1 || b.api.calls.Load() != 1 || charges(t, b.pool) != 1 {
		t.Fatalf("%d fresh replies, %d handler calls, %d charges; want 1 each", fresh, b.api.calls.Load(), charges(t, b.pool))
	}
}

func TestSameKeyDifferentRequestGets422(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	first := post(t, b.url, "k", order)

	for name, r := range map[string]reply{
		"other body":  post(t, b.url, "k", `{"order":"o-1","amount":900}`),
		"other query": post(t, b.url+"?currency=eur", "k", order),
	} {
		if !isProblem(r, 422) || r.replayed() {
			t.Errorf("%s: %v", name, r)
		}
	}
	if again := post(t, b.url, "k", order); again.body != first.body || !again.replayed() {
		t.Fatalf("the original request after the mismatches: %v", again)
	}
	if b.api.calls.Load() != 1 || charges(t, b.pool) != 1 {
		t.Fatalf("%d handler calls, %d charges; want 1, 1", b.api.calls.Load(), charges(t, b.pool))
	}
}

func TestHandlerFailureRollsBackAndRetrySucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)

	b.api.failNext.Store(1)
	failed := post(t, b.url, "k", order)
	if failed.status != 502 || failed.replayed() {
		t.Fatalf("failing handler: %v", failed)
	}
	if charges(t, b.pool) != 0 || keys(t, b.pool) != 0 {
		t.Fatalf("after a 5xx: %d charges, %d keys; want 0, 0", charges(t, b.pool), keys(t, b.pool))
	}

	b.api.panics.Store(true)
	if _, err := sendWith(freshConns, b.url, "k", order); err == nil {
		t.Fatal("a panicking handler's request got an answer")
	}
	if charges(t, b.pool) != 0 || keys(t, b.pool) != 0 {
		t.Fatalf("after a panic: %d charges, %d keys; want 0, 0", charges(t, b.pool), keys(t, b.pool))
	}

	retry := post(t, b.url, "k", order)
	if retry.status != 201 || retry.replayed() {
		t.Fatalf("retry after the failures: %v", retry)
	}
	if again := post(t, b.url, "k", order); again.body != retry.body || !again.replayed() {
		t.Fatalf("after the successful retry: %v", again)
	}
	if charges(t, b.pool) != 1 || b.api.calls.Load() != 3 {
		t.Fatalf("%d charges, %d handler calls; want 1, 3", charges(t, b.pool), b.api.calls.Load())
	}
}

func TestExpiredKeyIsProcessedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)
	ctx := context.Background()
	first := post(t, b.url, "k", order)

	// A key is a duplicate until its row is deleted: an expired key that
	// Cleanup has not deleted yet replays its answer, and with another
	// request it is reused, not run.
	if _, err := b.pool.Exec(ctx, `UPDATE processed_messages SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	r := post(t, b.url, "k", order)
	if r.status != first.status || !r.replayed() || r.body != first.body {
		t.Fatalf("expired, not yet cleaned: %v, want the first answer replayed", r)
	}
	if r := post(t, b.url, "k", `{"order":"o-2","amount":1}`); !isProblem(r, 422) || !strings.Contains(r.body, "#key-reused") {
		t.Fatalf("expired, another request: %v", r)
	}
	if deleted, err := b.mw.Store().Cleanup(ctx); err != nil || deleted != 1 {
		t.Fatalf("Cleanup: deleted %d, %v", deleted, err)
	}
	again := post(t, b.url, "k", order)
	if again.status != 201 || again.replayed() || again.body == first.body {
		t.Fatalf("after cleanup: %v", again)
	}
	if charges(t, b.pool) != 2 || keys(t, b.pool) != 1 {
		t.Fatalf("%d charges, %d keys; want 2, 1", charges(t, b.pool), keys(t, b.pool))
	}
}
