package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
)

// pgLayout is -layout as a Config.Layout.
func (c steadyConfig) pgLayout() pgdedup.Layout {
	if c.layout == "partitioned" {
		return pgdedup.LayoutPartitioned
	}
	return pgdedup.LayoutPlain
}

// steadySchema migrates the fresh database, makes processed_messages the
// shape -layout asks for (Store.Setup for partitioned), sets the recommended
// autovacuum scale factors on it (plain only: PostgreSQL takes no storage
// parameters on a partitioned table, and the partitions the cleaner creates
// get the server's) and creates the business table.
func steadySchema(ctx context.Context, cfg steadyConfig, pool *pgxpool.Pool) error {
	sqlDB := stdlib.OpenDBFromPool(pool)
	err := pgdedup.Migrate(ctx, sqlDB)
	sqlDB.Close()
	if err != nil {
		return err
	}
	sqls := []string{`CREATE TABLE soak_ledger (message_id text NOT NULL, amount bigint NOT NULL)`}
	if cfg.layout == "partitioned" {
		store, err := pgdedup.New(pool, pgdedup.Config{Consumer: consumer, Retention: cfg.retention(),
			Layout: pgdedup.LayoutPartitioned, Partitions: cfg.partitions})
		if err != nil {
			return err
		}
		if err := store.Setup(ctx); err != nil {
			return err
		}
	} else {
		sqls = append(sqls, `ALTER TABLE processed_messages SET (autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.01)`)
	}
	for _, sql := range sqls {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", strings.SplitN(sql, "\n", 2)[0], err)
		}
	}
	return nil
}

// preload loads rows rows as rate × Retention of claims before t0 would
// have left them (see preloadPlain), into the table of cfg.layout.
func preload(ctx context.Context, cfg steadyConfig, pool *pgxpool.Pool, rows int, t0 time.Time) error {
	if cfg.layout == "partitioned" {
		return preloadPartitioned(ctx, pool, rows, t0, cfg.retention())
	}
	return preloadPlain(ctx, pool, rows, t0, cfg.retention())
}

// preloadPartitioned loads the partitioned table as a Retention of claims
// leaves it: one partition per span. Setup made the partitions of the next
// spans and, for imported IDs, one partition for the whole past Retention;
// the bench drops every partition that starts before the current one
// (empty yet) and makes one per span instead, each as the cleaner makes one
// (a table LIKE the parent, a unique index on key, an index on expires_at,
// attached for its span). Setup's past partition ends where its current
// one started, which is not the current one if a switch came during Setup
// (on a loaded machine, at CI's 3-second spans). No claim has run yet, so
// the bench seals every partition before the current one, as Setup does.
// Then it inserts through the parent, which routes every row to the
// partition of its claim time (processed_at), so claims look these up. Rows
// go in in claim-time order, each partition's key index growing insert by
// insert, as claims grow it.
func preloadPartitioned(ctx context.Context, pool *pgxpool.Pool, rows int, t0 time.Time, retention time.Duration) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var span time.Duration
	var first, current time.Time // the partitions of t0 - retention, and of the clock
	var past []string            // the partitions that start before current
	err = conn.QueryRow(ctx, `WITH p AS (SELECT span, date_bin(span, clock_timestamp(), '2000-01-01 00:00:00+00') AS cur
FROM pgdedup_partitions WHERE parent = 'processed_messages'::regclass)
SELECT span, date_bin(span, $1::timestamptz - $2::interval, '2000-01-01 00:00:00+00'), cur,
(SELECT coalesce(array_agg(quote_ident(c.relname::text)), '{}') FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'processed_messages'::regclass
 AND (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz < p.cur)
FROM p`, t0, retention).Scan(&span, &first, &current, &past)
	if err != nil {
		return fmt.Errorf("read the partition span: %w", err)
	}
	for _, name := range past {
		if _, err := conn.Exec(ctx, `DROP TABLE `+name); err != nil {
			return fmt.Errorf("drop the past partition %s: %w", name, err)
		}
	}
	if _, err := conn.Exec(ctx, `UPDATE pgdedup_partitions SET sealed = $1 WHERE parent = 'processed_messages'::regclass AND sealed < $1`, current); err != nil {
		return fmt.Errorf("seal the past partitions: %w", err)
	}
	for from := first; from.Before(current); from = from.Add(span) {
		name := fmt.Sprintf("processed_messages_preload_%s", from.UTC().Format("20060102T150405.000"))
		name = strings.ReplaceAll(name, ".", "m")
		bound := func(t time.Time) string { return `'` + t.UTC().Format(time.RFC3339Nano) + `'` }
		for _, sql := range []string{
			`CREATE TABLE ` + name + ` (LIKE processed_messages INCLUDING DEFAULTS)`,
			`CREATE UNIQUE INDEX ` + name + `_key ON ` + name + ` (key)`,
			`CREATE INDEX ` + name + `_exp ON ` + name + ` (expires_at)`,
			`ALTER TABLE processed_messages ATTACH PARTITION ` + name + ` FOR VALUES FROM (` + bound(from) + `) TO (` + bound(from.Add(span)) + `)`,
		} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				return fmt.Errorf("%s: %w", sql, err)
			}
		}
	}
	step := retention.Seconds() / float64(rows)
	const chunk = 500_000
	for lo := 1; lo <= rows; lo += chunk {
		_, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO processed_messages (key, consumer, message_id, processed_at, expires_at)
SELECT pgdedup_key($1, id), $1, id, e - $2::float8 * interval '1 second', e
FROM (SELECT 'pre-' || g AS id, $3::timestamptz + g * $4::float8 * interval '1 second' AS e
      FROM generate_series(%d, %d) g) s`, lo, min(lo+chunk-1, rows)), consumer, retention.Seconds(), t0, step)
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
	}
	return nil
}
