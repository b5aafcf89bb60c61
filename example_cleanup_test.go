package pgdedup_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Once its Retention has passed, an ID is deleted by Cleanup and forgotten: a
// copy delivered after that is processed again. Hence the rule: Retention must
// exceed the broker's longest redelivery window, at least twice over.
func ExampleStore_Cleanup() {
	pool, done := pgtest.ForExample()
	defer done()
	ctx := context.Background()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", Retention: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }

	if _, err := store.Process(ctx, "order-1", noop); err != nil {
		log.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // Retention has passed
	deleted, err := store.Cleanup(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted:", deleted)
	processed, err := store.Process(ctx, "order-1", noop)
	fmt.Println("processed again:", processed, err)
	// Output:
	// deleted: 1
	// processed again: true <nil>
}

// A service runs the cleaner next to its consumers, until it shuts down. Every
// instance may run one: cleaners skip each other's rows.
func ExampleStore_RunCleaner() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgdedup.New(pool, pgdedup.Config{
		Consumer:  "billing",
		Retention: 8 * 24 * time.Hour, // SQS keeps messages 4 days by default: twice that
		Logger:    slog.Default(),     // one info record per run: rows deleted, duration
	})
	if err != nil {
		log.Fatal(err)
	}
	cleaned := make(chan error, 1)
	go func() { cleaned <- store.RunCleaner(ctx, time.Hour) }()

	// ... consume messages with store.Process until ctx is cancelled ...

	<-ctx.Done()
	<-cleaned // returns ctx.Err() promptly, even mid-run
}
