package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/examples/internal/cli"
)

// compareConfig is what runCompare measures.
type compareConfig struct {
	DatabaseURL string
	Records     int // records per round of each batched scenario; a tenth of it for one record per transaction
	Rounds      int
	Batch       int // records per transaction in the batched scenarios
	Partitions  int // one worker each
	Keep        bool
}

// scenario is one way of consuming the same records.
type scenario struct {
	name   string
	perTx  int
	method string // "offsets", "rows" or "none"
	topic  string
}

// scenarioResult accumulates a scenario's rounds.
type scenarioResult struct {
	records int64
	wal     int64     // bytes, LSN difference over its rounds
	rates   []float64 // records/s, one per round
}

func runCompare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var cfg compareConfig
	fs.StringVar(&cfg.DatabaseURL, "database-url", cli.Env("DATABASE_URL", defaultDatabaseURL), "Postgres URL (env DATABASE_URL); a schema of its own is created and dropped")
	fs.IntVar(&cfg.Records, "records", 20_000, "records per round of each batched scenario (a tenth of it for one record per transaction)")
	fs.IntVar(&cfg.Rounds, "rounds", 5, "rounds; the scenarios take turns in each")
	fs.IntVar(&cfg.Batch, "batch", 100, "records per transaction in the batched scenarios")
	fs.IntVar(&cfg.Partitions, "partitions", 4, "partitions, each with a worker of its own")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the schema")
	if err := cli.Parse(fs, args, stderr); err != nil {
		return err
	}
	switch {
	case cfg.Records < 10 || cfg.Rounds < 1 || cfg.Batch < 1 || cfg.Partitions < 1:
		return errors.New("-records must be at least 10, -rounds, -batch and -partitions at least 1")
	}
	return compare(ctx, cfg, stdout)
}

// compare consumes the same synthetic records with the offset in the
// transaction, with one processed_messages row per record (ID
// "topic/partition/offset", through Store.ProcessBatch and Store.Process), and
// with no dedup at all, batched and one record per transaction, and prints
// throughput, WAL per record and what each method keeps.
func compare(ctx context.Context, cfg compareConfig, stdout io.Writer) error {
	schema := fmt.Sprintf("pgdedup_compare_%08x", rand.Uint32())
	pool, err := schemaPool(ctx, cfg.DatabaseURL, schema, int32(cfg.Partitions)+1)
	if err != nil {
		return err
	}
	defer pool.Close()
	if !cfg.Keep {
		defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA `+schema+` CASCADE`) }()
	}
	if err := migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE compare_charges (record text NOT NULL, amount_cents bigint NOT NULL)`); err != nil {
		return err
	}
	stores := map[string]*pgdedup.Store{}
	for _, m := range []string{"offsets", "rows"} {
		if stores[m], err = pgdedup.New(pool, pgdedup.Config{Consumer: "compare-" + m}); err != nil {
			return err
		}
	}
	scenarios := []scenario{
		{"offset in the transaction (ProcessOffsets)", cfg.Batch, "offsets", "batched-offsets"},
		{"one row per record (ProcessBatch)", cfg.Batch, "rows", "batched-rows"},
		{"no dedup (the charges alone)", cfg.Batch, "none", "batched-none"},
		{"offset in the transaction (ProcessOffset)", 1, "offsets", "single-offsets"},
		{"one row per record (Process)", 1, "rows", "single-rows"},
		{"no dedup (the charge alone)", 1, "none", "single-none"},
	}
	results := make([]scenarioResult, len(scenarios))
	next := make([][]int64, len(scenarios)) // next offset per partition
	for i := range next {
		next[i] = make([]int64, cfg.Partitions)
	}
	start := time.Now()
	for round := range cfg.Rounds {
		for k := range scenarios {
			i := (k + round) % len(scenarios) // rotate who goes first
			sc := scenarios[i]
			records := cfg.Records
			if sc.perTx == 1 {
				records = max(cfg.Records/10, cfg.Partitions)
			}
			var before, after int64
			if err := pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&before); err != nil {
				return err
			}
			t0 := time.Now()
			if err := runScenario(ctx, pool, stores[sc.method], sc, next[i], records/cfg.Partitions); err != nil {
				return fmt.Errorf("%s: %w", sc.name, err)
			}
			elapsed := time.Since(t0)
			if err := pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&after); err != nil {
				return err
			}
			n := int64(records / cfg.Partitions * cfg.Partitions)
			results[i].records += n
			results[i].wal += after - before
			results[i].rates = append(results[i].rates, float64(n)/elapsed.Seconds())
		}
	}

	kept := map[string][2]int64{} // method → rows, bytes
	for _, m := range []string{"offsets", "rows"} {
		table := map[string]string{"offsets": "processed_offsets", "rows": "processed_messages"}[m]
		var rows, bytes int64
		err := pool.QueryRow(ctx, `SELECT count(*), pg_total_relation_size($2::regclass) FROM `+table+` WHERE consumer = $1`,
			"compare-"+m, table).Scan(&rows, &bytes)
		if err != nil {
			return err
		}
		kept[m] = [2]int64{rows, bytes}
	}
	var perMethod int64 // records each method consumed, batched and single
	for i, sc := range scenarios {
		if sc.method == "offsets" {
			perMethod += results[i].records
		}
	}

	fmt.Fprintf(stdout, "%d rounds of %d records per batched scenario (%d per transaction) and %d per one-record scenario, %d partitions with a worker each, in %s\n\n",
		cfg.Rounds, cfg.Records, cfg.Batch, max(cfg.Records/10, cfg.Partitions), cfg.Partitions, time.Since(start).Round(time.Second))
	fmt.Fprintln(stdout, "| method | records per transaction | records/s (median) | vs no dedup | WAL bytes per record |")
	fmt.Fprintln(stdout, "|---|--:|--:|--:|--:|")
	for i, sc := range scenarios {
		base := median(results[(i/3)*3+2].rates)
		fmt.Fprintf(stdout, "| %s | %d | %.0f | %.2f× | %.0f |\n", sc.name, sc.perTx, median(results[i].rates),
			median(results[i].rates)/base, float64(results[i].wal)/float64(results[i].records))
	}
	fmt.Fprintf(stdout, "\nkept after %d records by each method: offsets %d rows (%s, table and index); one row per record %d rows (%s)\n",
		perMethod, kept["offsets"][0], size(kept["offsets"][1]), kept["rows"][0], size(kept["rows"][1]))
	return nil
}

// runScenario consumes perPartition records of each partition, perTx to a
// transaction, one worker per partition.
func runScenario(ctx context.Context, pool *pgxpool.Pool, store *pgdedup.Store, sc scenario, next []int64, perPartition int) error {
	var wg sync.WaitGroup
	errs := make([]error, len(next))
	for p := range next {
		wg.Go(func() {
			part := pgdedup.TopicPartition{Topic: sc.topic, Partition: int32(p)}
			for done := 0; done < perPartition && errs[p] == nil; {
				n := min(sc.perTx, perPartition-done)
				offsets := make([]int64, n)
				ids := make([]string, n)
				for j := range offsets {
					offsets[j] = next[p] + int64(j)
					ids[j] = fmt.Sprintf("%s/%d/%d", sc.topic, p, offsets[j])
				}
				charge := func(ctx context.Context, tx pgx.Tx, ids []string) error {
					_, err := tx.Exec(ctx, `INSERT INTO compare_charges (record, amount_cents) SELECT unnest($1::text[]), 100`, ids)
					return err
				}
				var err error
				switch {
				case sc.method == "offsets" && n == 1:
					_, err = store.ProcessOffset(ctx, part, offsets[0], func(ctx context.Context, tx pgx.Tx) error { return charge(ctx, tx, ids) })
				case sc.method == "offsets":
					_, err = store.ProcessOffsets(ctx, part, offsets, func(ctx context.Context, tx pgx.Tx, _ []int64) error { return charge(ctx, tx, ids) })
				case sc.method == "rows" && n == 1:
					_, err = store.Process(ctx, ids[0], func(ctx context.Context, tx pgx.Tx) error { return charge(ctx, tx, ids) })
				case sc.method == "rows":
					_, err = store.ProcessBatch(ctx, ids, func(ctx context.Context, tx pgx.Tx, fresh []string) error { return charge(ctx, tx, fresh) })
				default:
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return charge(ctx, tx, ids) })
				}
				errs[p] = err
				next[p] += int64(n)
				done += n
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// schemaPool creates schema and returns a pool whose connections use it.
func schemaPool(ctx context.Context, url, schema string, maxConns int32) (*pgxpool.Pool, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	_, err = conn.Exec(ctx, `CREATE SCHEMA `+schema)
	_ = conn.Close(ctx)
	if err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pcfg.MaxConns = maxConns
	return pgxpool.NewWithConfig(ctx, pcfg)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func size(b int64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(b)/(1<<20))
	default:
		return fmt.Sprintf("%d kB", b/1024)
	}
}
