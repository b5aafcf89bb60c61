package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/pgdedup/pgdedup"
)

// consumer is the Store's consumer in every scenario.
const consumer = "bench"

// retention is the Store's Retention (its default) and the EX of the Redis
// recipe, so that both remember an ID equally long.
const retention = 48 * time.Hour

// recordedIDs is how many IDs the duplicate path cycles through.
const recordedIDs = 20_000

// bench is one run: a schema of its own (created, migrated, dropped) and a
// direct admin pool on it for setup and measurements.
type bench struct {
	cfg    config
	schema string
	nonce  string
	admin  *pgxpool.Pool

	recorded []string // IDs already claimed, for the duplicate path
	dupNext  atomic.Int64
}

// env is one way of reaching the servers, directly or through a proxy. The
// scenarios of one table share its pool, Store and Redis client.
type env struct {
	pool      *pgxpool.Pool
	store     *pgdedup.Store
	rdb       *redis.Client
	claimSQL  string // the claim exactly as Process sends it
	keyPrefix string
}

// newBench creates the run's schema, migrates it, creates the business table
// (ledger) and records the IDs of the duplicate path.
func newBench(ctx context.Context, cfg config) (*bench, error) {
	b := &bench{cfg: cfg, nonce: randomHex(4)}
	b.schema = "pgdedup_bench_" + b.nonce
	admin, err := pgx.Connect(ctx, cfg.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+b.schema); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	b.admin, err = b.pool(ctx, "", 4, nil)
	if err == nil {
		sqlDB := stdlib.OpenDBFromPool(b.admin)
		err = pgdedup.Migrate(ctx, sqlDB)
		sqlDB.Close()
	}
	if err == nil {
		_, err = b.admin.Exec(ctx, `CREATE TABLE ledger (
    id         bigserial   PRIMARY KEY,
    message_id text        NOT NULL,
    amount     bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())`)
	}
	if err == nil {
		err = b.record(ctx, recordedIDs)
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("set up schema %s: %w", b.schema, err)
	}
	return b, nil
}

// close drops the schema and the run's Redis keys. It uses its own context so
// that an interrupted run still cleans up.
func (b *bench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if b.admin != nil {
		b.admin.Close()
	}
	if conn, err := pgx.Connect(ctx, b.cfg.databaseURL); err == nil {
		_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+b.schema+" CASCADE")
		conn.Close(ctx)
	}
	rdb := redis.NewClient(&redis.Options{Addr: b.cfg.redisAddr})
	defer rdb.Close()
	iter := rdb.Scan(ctx, 0, b.keyPrefix()+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 1000 {
			rdb.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Unlink(ctx, keys...)
	}
}

// record claims n IDs for the duplicate path.
func (b *bench) record(ctx context.Context, n int) error {
	// One batch holds them all: this is setup, not a measured claim.
	store, err := pgdedup.New(b.admin, pgdedup.Config{Consumer: consumer, MaxBatch: max(n, pgdedup.DefaultMaxBatch)})
	if err != nil {
		return err
	}
	b.recorded = make([]string, n)
	for i := range b.recorded {
		b.recorded[i] = newID()
	}
	return pgx.BeginFunc(ctx, b.admin, func(tx pgx.Tx) error {
		_, err := store.ClaimBatch(ctx, tx, b.recorded)
		return err
	})
}

func (b *bench) keyPrefix() string { return "pgdedup-bench:" + b.nonce + ":" }

// pool opens a pool on the run's schema with conns connections, all opened
// up front. A non-empty addr ("host:port", a proxy) replaces the URL's host.
func (b *bench) pool(ctx context.Context, addr string, conns int32, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(b.cfg.databaseURL)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["search_path"] = b.schema
	pc.ConnConfig.RuntimeParams["application_name"] = "pgdedup-bench"
	pc.ConnConfig.Tracer = tracer
	pc.MaxConns, pc.MinConns = conns, conns
	if addr != "" {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		p, _ := strconv.ParseUint(port, 10, 16)
		pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.Fallbacks = host, uint16(p), nil
		// Counted round trips must be the scenario's own, not liveness pings.
		pc.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// env opens a pool of conns connections and a Redis client of as many, via
// pgAddr and redisAddr when they are set (proxies), directly otherwise.
func (b *bench) env(ctx context.Context, pgAddr, redisAddr string, conns int, tracer pgx.QueryTracer) (*env, error) {
	pool, err := b.pool(ctx, pgAddr, int32(conns), tracer)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: consumer, Retention: retention})
	if err != nil {
		pool.Close()
		return nil, err
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:         cmp.Or(redisAddr, b.cfg.redisAddr),
		PoolSize:     conns,
		MinIdleConns: conns,
	})
	if err := rdb.Ping(ctx).Err(); err != nil {
		pool.Close()
		rdb.Close()
		return nil, fmt.Errorf("connect to Redis at %s: %w", b.cfg.redisAddr, err)
	}
	e := &env{pool: pool, store: store, rdb: rdb, keyPrefix: b.keyPrefix()}
	e.claimSQL = `INSERT INTO ` + store.Table() + ` (key, consumer, message_id, expires_at) VALUES ($3::uuid, $1, $2, ` +
		fmt.Sprintf("now() + interval '%d microseconds'", retention.Microseconds()) + `)
ON CONFLICT DO NOTHING`
	return e, nil
}

func (e *env) close() {
	e.pool.Close()
	e.rdb.Close()
}

func randomHex(n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}
