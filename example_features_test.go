package pgdedup_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// An operator looks an ID up, and forgets it so that its next delivery is
// processed again.
func ExampleStore_Forget() {
	ctx := context.Background()
	pool, done := pgtest.ForExample()
	defer done()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", Retention: 72 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	if _, err := store.Process(ctx, "order-1", noop); err != nil {
		log.Fatal(err)
	}
	rec, recorded, err := store.Lookup(ctx, "order-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("recorded:", recorded, "kept for:", rec.ExpiresAt.Sub(rec.ProcessedAt))
	forgotten, err := store.Forget(ctx, "order-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("forgotten:", forgotten)
	processed, err := store.Process(ctx, "order-1", noop)
	fmt.Println("processed again:", processed, err)
	// Output:
	// recorded: true kept for: 72h0m0s
	// forgotten: true
	// processed again: true <nil>
}

// A reused message ID with another payload is an error, not a duplicate.
func ExampleWithFingerprint() {
	ctx := context.Background()
	pool, done := pgtest.ForExample()
	defer done()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	for _, body := range []string{`{"amount": 100}`, `{"amount": 100}`, `{"amount": 999}`} {
		sum := sha256.Sum256([]byte(body))
		processed, err := store.Process(ctx, "order-1", noop, pgdedup.WithFingerprint(sum[:]))
		fmt.Println(processed, errors.Is(err, pgdedup.ErrPayloadMismatch)) // dead-letter a mismatch
	}
	// Output:
	// true false
	// false false
	// false true
}

// A request handler answers a redelivered request with its first answer.
func ExampleStore_ProcessResult() {
	ctx := context.Background()
	pool, done := pgtest.ForExample()
	defer done()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "quotes"})
	if err != nil {
		log.Fatal(err)
	}
	price := 100
	for range 2 {
		answer, processed, err := store.ProcessResult(ctx, "request-7", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			price++ // a new answer each time it runs
			return fmt.Appendf(nil, "price %d", price), nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s (processed: %v)\n", answer, processed) // reply with answer
	}
	// Output:
	// price 101 (processed: true)
	// price 101 (processed: false)
}

// A caller with a limit of its own stores results up to it, beyond
// Config.MaxResultBytes.
func ExampleWithMaxResultBytes() {
	ctx := context.Background()
	pool, done := pgtest.ForExample()
	defer done()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "reports", MaxResultBytes: 1 << 10})
	if err != nil {
		log.Fatal(err)
	}
	report := func(context.Context, pgx.Tx) ([]byte, error) { return make([]byte, 100<<10), nil }
	if _, _, err := store.ProcessResult(ctx, "report-1", report); errors.Is(err, pgdedup.ErrResultTooLarge) {
		fmt.Println("over Config.MaxResultBytes")
	}
	answer, processed, err := store.ProcessResult(ctx, "report-1", report, pgdedup.WithMaxResultBytes(1<<20))
	fmt.Println(len(answer), processed, err)
	// Output:
	// over Config.MaxResultBytes
	// 102400 true <nil>
}

// A message older than the table remembers is refused before anything is
// sent: dead-letter it, or process it without the guard.
func ExampleWithSentAt() {
	ctx := context.Background()
	pool, done := pgtest.ForExample()
	defer done()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", Retention: 24 * time.Hour, LateMargin: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	sentAt := time.Now().Add(-30 * time.Hour) // the broker's timestamp
	_, err = store.Process(ctx, "order-1", noop, pgdedup.WithSentAt(sentAt))
	fmt.Println(errors.Is(err, pgdedup.ErrTooLate))
	// Its broker keeps it a week: remember it as long.
	processed, err := store.Process(ctx, "order-1", noop, pgdedup.WithSentAt(sentAt), pgdedup.WithRetention(8*24*time.Hour))
	fmt.Println(processed, err)
	// Output:
	// true
	// true <nil>
}
