package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
)

// defaultRetention outlasts SQS's longest MessageRetentionPeriod, 14 days:
// a message can come back until then, from the queue or redriven from its
// dead-letter queue (which keeps the original enqueue time).
const defaultRetention = 15 * 24 * time.Hour

// openStore connects a pool of conns connections to databaseURL, named name
// in pg_stat_activity, and returns it with the pgdedup Store of the billing
// consumer. The caller closes the pool.
func openStore(ctx context.Context, databaseURL, name string, conns int, lockTimeout, retention time.Duration, log *slog.Logger) (*pgxpool.Pool, *pgdedup.Store, error) {
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("database URL: %w", err)
	}
	pcfg.MaxConns = int32(conns)
	if _, set := pcfg.ConnConfig.RuntimeParams["application_name"]; !set {
		pcfg.ConnConfig.RuntimeParams["application_name"] = name
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", LockTimeout: lockTimeout, Retention: retention, Logger: log})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, store, nil
}
