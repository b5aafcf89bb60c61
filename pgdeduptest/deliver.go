package pgdeduptest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// The delivery helpers test a handler the way the pattern's FAQ says to. They
// deliver the same message several times in a row, several times at once, and
// once with its transaction cut before COMMIT and then again. Each delivers
// through [pgdedup.Store.Process] with the handler's fn, the business write of
// one message. [AssertOnce] then checks, with the test's own query, that the
// business effect happened once.

// TB is what the delivery helpers need of a test. It is a *testing.T or
// *testing.B, or anything that reports failures the same way.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// deliveryTimeout bounds each helper.
const deliveryTimeout = 2 * time.Minute

// DeliverSequentially delivers messageID n times, one after the other, and
// returns how many deliveries ran fn to COMMIT. It fails t if a delivery
// returns an error, or if more than one was processed.
func DeliverSequentially(t TB, store *pgdedup.Store, messageID string, n int, fn func(ctx context.Context, tx pgx.Tx) error) (processed int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
	defer cancel()
	for i := range n {
		ok, err := store.Process(ctx, messageID, fn)
		if err != nil {
			t.Fatalf("pgdeduptest: delivery %d of %d of %q: %v", i+1, n, messageID, err)
			return processed
		}
		if ok {
			processed++
		}
	}
	if processed > 1 {
		t.Errorf("pgdeduptest: %q processed %d times in %d deliveries one after the other, want at most once", messageID, processed, n)
	}
	return processed
}

// DeliverConcurrently delivers messageID n times at once, from n goroutines,
// as consumers sharing a queue would, and returns how many deliveries ran fn
// to COMMIT. The store's DB needs a connection per delivery to test the
// overlap (a *pgxpool.Pool's MaxConns). It fails t if a delivery returns an
// error, or if more than one was processed.
func DeliverConcurrently(t TB, store *pgdedup.Store, messageID string, n int, fn func(ctx context.Context, tx pgx.Tx) error) (processed int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
	defer cancel()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			ok, err := store.Process(ctx, messageID, fn)
			mu.Lock()
			defer mu.Unlock()
			if ok {
				processed++
			}
			errs = append(errs, err)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("pgdeduptest: %d concurrent deliveries of %q: %v", n, messageID, err)
		return processed
	}
	if processed > 1 {
		t.Errorf("pgdeduptest: %q processed %d times in %d concurrent deliveries, want at most once", messageID, processed, n)
	}
	return processed
}

// DeliverCutBeforeCommit delivers messageID once with its connection cut after
// fn returned and before COMMIT reached the server, as when a consumer crashes
// or the network fails at that instant. The server rolls the transaction back,
// fn's writes with it. Process retries such a failure itself (up to
// Config.MaxAttempts). A broker would redeliver the message anyway, which the
// helper then does, once. Only the first run of fn is cut. It returns how many
// deliveries ran fn to COMMIT, which is 1 for a new ID. It fails t if the
// redelivery returns an error.
func DeliverCutBeforeCommit(t TB, store *pgdedup.Store, messageID string, fn func(ctx context.Context, tx pgx.Tx) error) (processed int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deliveryTimeout)
	defer cancel()
	cut := false
	ok, _ := store.Process(ctx, messageID, func(ctx context.Context, tx pgx.Tx) error {
		if err := fn(ctx, tx); err != nil || cut {
			return err
		}
		cut = true
		// The socket closes under pgx. COMMIT is never sent, and the server
		// sees the client go away mid-transaction.
		return tx.Conn().PgConn().Conn().Close()
	})
	if !cut {
		t.Fatalf("pgdeduptest: the delivery of %q did not reach fn: is it new?", messageID)
		return 0
	}
	if ok {
		processed++
	}
	ok, err := store.Process(ctx, messageID, fn)
	if err != nil {
		t.Fatalf("pgdeduptest: redelivery of %q after the cut: %v", messageID, err)
		return processed
	}
	if ok {
		processed++
	}
	if processed != 1 {
		t.Errorf("pgdeduptest: %q processed %d times around a cut COMMIT and a redelivery, want once", messageID, processed)
	}
	return processed
}

// AssertOnce fails t unless count, the test's own query of the business
// effect of one message (rows written, balance changed, emails queued),
// returns 1.
func AssertOnce(t TB, count func(ctx context.Context) (int, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := count(ctx)
	if err != nil {
		t.Fatalf("pgdeduptest: counting the effect: %v", err)
		return
	}
	if n != 1 {
		t.Errorf("pgdeduptest: the effect happened %d times, want once", n)
	}
}
