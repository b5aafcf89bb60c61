package shop

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/examples/internal/cli"
)

// DefaultDatabaseURL is the -database-url of every command when DATABASE_URL
// is not set.
const DefaultDatabaseURL = "postgres://postgres@localhost:5432/postgres?sslmode=disable"

// RunMigrate is the migrate command: [Migrate] on -database-url.
func RunMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	dbURL := fs.String("database-url", cli.Env("DATABASE_URL", DefaultDatabaseURL), "Postgres URL (env DATABASE_URL)")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := Migrate(ctx, pool); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "migrated: processed_messages and charges are ready")
	return nil
}

// OpenStore connects a pool of workers+1 connections to databaseURL and
// returns it with the pgdedup [pgdedup.Store] of the billing consumer. The
// caller closes the pool.
func OpenStore(ctx context.Context, databaseURL string, workers int, lockTimeout time.Duration, log *slog.Logger) (*pgxpool.Pool, *pgdedup.Store, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("database URL: %w", err)
	}
	pcfg.MaxConns = int32(workers) + 1
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", LockTimeout: lockTimeout, Logger: log})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, store, nil
}

// CheckBatch checks a producer's -orders, -duplicates and -without-id flags.
func CheckBatch(orders int, duplicates, withoutID float64) error {
	switch {
	case orders < 1:
		return fmt.Errorf("-orders must be at least 1, got %d", orders)
	case duplicates < 0 || duplicates > 1:
		return fmt.Errorf("-duplicates must be between 0 and 1, got %g", duplicates)
	case withoutID < 0 || withoutID > 1:
		return fmt.Errorf("-without-id must be between 0 and 1, got %g", withoutID)
	}
	return nil
}
