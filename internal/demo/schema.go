package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
)

// newSchemaName returns a fresh name, so the demo never meets existing data.
func newSchemaName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "pgdedup_demo_" + hex.EncodeToString(b)
}

// connect opens a pool whose connections use schema as their search_path,
// which is where Migrate creates processed_messages. The demo's own SQL is
// schema-qualified anyway.
func connect(ctx context.Context, url, schema string, consumers int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgdedup demo"
	// The demo simulates consumer crashes, not server crashes, so waiting for
	// each commit's WAL flush would only slow it down. What other sessions
	// see, and so every count in the report, is the same.
	if _, set := cfg.ConnConfig.RuntimeParams["synchronous_commit"]; !set {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	// pgdedup holds a connection per consumer while its handler works. The
	// broken recipes only borrow one to insert a charge.
	cfg.MaxConns = int32(2*consumers + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}

// createSchema creates schema. It fails, rather than touching anything, if a
// schema of that name exists.
func createSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	return nil
}

// setUp migrates schema with pgdedup.Migrate, and creates the
// orders table (filled with orders orders) and one charges table per recipe.
// Charges tables have no unique constraint on order_id, so a recipe that
// charges twice leaves two rows, which is what the report counts.
func setUp(ctx context.Context, pool *pgxpool.Pool, schema string, orders int, recipes []recipe) error {
	s := pgx.Identifier{schema}.Sanitize()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := pgdedup.Migrate(ctx, db); err != nil {
		return err
	}
	stmts := []string{
		`CREATE TABLE ` + s + `.orders (id int PRIMARY KEY, amount_cents int NOT NULL)`,
		fmt.Sprintf(`INSERT INTO %s.orders SELECT g, 100 + (g::bigint * 7919) %% 9900 FROM generate_series(0, %d) g`, s, orders-1),
	}
	for _, r := range recipes {
		stmts = append(stmts, `CREATE TABLE `+pgx.Identifier{schema, r.table()}.Sanitize()+` (
	id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id     int NOT NULL,
	amount_cents int NOT NULL,
	consumer     int NOT NULL,
	attempt      int NOT NULL,
	charged_at   timestamptz NOT NULL DEFAULT clock_timestamp()
)`)
	}
	for _, q := range stmts {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("set up schema %s: %w", schema, err)
		}
	}
	return nil
}

// dropSchema drops schema and everything in it. It uses its own context so
// that it still runs after the demo was interrupted.
func dropSchema(pool *pgxpool.Pool, schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return nil
}
