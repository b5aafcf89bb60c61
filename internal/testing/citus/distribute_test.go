package citus

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/cli"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// pgdedup citus distribute on a migrated schema with rows in it: the dedup
// table and the business table end up distributed by message_id and
// co-located, the rows are kept (moved into the shards), a second run does
// nothing, and Process then works with exactly-once effects.
func TestDistributeCommand(t *testing.T) {
	t.Parallel()
	base := need(t, "TEST_CITUS_URL")
	ctx := ctxT(t, 2*time.Minute)
	admin := pgtest.Pool(t, base, 2)
	schema := fmt.Sprintf("pgdedup_citus_cli_%d", time.Now().UnixNano()%1e12)
	pgtest.Exec(t, admin, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	url, err := pgtest.WithSearchPath(base, schema)
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, url, 4)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := pgdedup.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, pool, `CREATE TABLE charges (message_id text PRIMARY KEY, consumer text NOT NULL, amount bigint NOT NULL)`)
	pgtest.Seed(t, pool, "billing", "old-", 500, time.Hour)

	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := cli.Main(ctx, append([]string{"citus", "distribute", "--database-url", url}, args...), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	code, out, errOut := run("--sql", "--colocate", "charges:message_id", "--shard-count", "4")
	if code != 0 || !strings.Contains(out, `SELECT create_distributed_table('"processed_messages"', 'message_id', shard_count => 4);
SELECT create_distributed_table('"charges"', 'message_id', colocate_with => '"processed_messages"');
`) {
		t.Fatalf("--sql: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'processed_messages'::regclass`); n != 0 {
		t.Fatal("--sql distributed the table")
	}
	code, out, errOut = run("--colocate", "charges:message_id", "--shard-count", "4")
	if code != 0 || !strings.Contains(out, `distributed "processed_messages" by message_id, "charges" by message_id (4 shards per table`) {
		t.Fatalf("distribute: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	var groups int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT colocationid) FROM pg_dist_partition
WHERE logicalrelid IN ('processed_messages'::regclass, 'charges'::regclass)
AND column_to_column_name(logicalrelid, partkey) = 'message_id'`).Scan(&groups); err != nil || groups != 1 {
		t.Fatalf("want both tables distributed by message_id in one co-location group, got %d groups (%v)", groups, err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM processed_messages`); n != 500 {
		t.Errorf("%d rows after distributing, want the 500 seeded", n)
	}
	if n := pgtest.Count(t, pool, `SELECT pg_relation_size('processed_messages')`); n != 0 {
		t.Errorf("the coordinator's local copy still takes %d bytes", n)
	}
	if code, out, _ = run("--colocate", "charges:message_id"); code != 0 || strings.Count(out, "already distributed by message_id") != 2 {
		t.Errorf("second run: exit %d, stdout %q", code, out)
	}
	if code, _, errOut = run("--colocate", "charges:consumer"); code != 1 || !strings.Contains(errOut, "already distributed by message_id, not consumer") {
		t.Errorf("distributing charges by another column: exit %d, stderr %q", code, errOut)
	}

	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := store.Process(ctx, "new-1", charge("new-1")); err != nil {
			t.Fatal(err)
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM charges WHERE message_id = 'new-1'`); n != 1 {
		t.Errorf("new-1 charged %d times", n)
	}
}

// --by key: the primary key stays key, the business table co-locates by the
// key it stores (pgdedup.Key), and Process, ClaimBatch and Cleanup work.
func TestDistributeByKey(t *testing.T) {
	t.Parallel()
	base := need(t, "TEST_CITUS_URL")
	ctx := ctxT(t, 2*time.Minute)
	admin := pgtest.Pool(t, base, 2)
	schema := fmt.Sprintf("pgdedup_citus_key_%d", time.Now().UnixNano()%1e12)
	pgtest.Exec(t, admin, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	url, err := pgtest.WithSearchPath(base, schema)
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Pool(t, url, 4)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := pgdedup.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, pool, `CREATE TABLE charges (key uuid PRIMARY KEY, message_id text NOT NULL, amount bigint NOT NULL)`)
	var stdout, stderr bytes.Buffer
	if code := cli.Main(ctx, []string{"citus", "distribute", "--by", "key", "--colocate", "charges:key", "--database-url", url}, &stdout, &stderr); code != 0 {
		t.Fatalf("distribute --by key: exit %d: %s%s", code, stdout.String(), stderr.String())
	}
	if n := pgtest.Count(t, pool, `SELECT count(DISTINCT colocationid) FROM pg_dist_partition
WHERE logicalrelid IN ('processed_messages'::regclass, 'charges'::regclass) AND column_to_column_name(logicalrelid, partkey) = 'key'`); n != 1 {
		t.Fatalf("want both tables distributed by key in one co-location group, got %d groups", n)
	}
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", CleanupBatchSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"k-1", "k-2", "k-1"} {
		_, err := store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO charges (key, message_id, amount) VALUES ($1, $2, 100)`, pgdedup.Key("billing", id), id)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM charges`); n != 2 {
		t.Errorf("%d charges, want 2", n)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		fresh, err := store.ClaimBatch(ctx, tx, []string{"k-1", "b-1", "b-2"})
		if err == nil && strings.Join(fresh, ",") != "b-1,b-2" {
			err = fmt.Errorf("ClaimBatch fresh = %v, want b-1 b-2", fresh)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, pool, `UPDATE processed_messages SET expires_at = now() - interval '1 hour' WHERE key = $1::uuid`, pgdedup.Key("billing", "b-1"))
	if n, err := store.Cleanup(ctx); n != 1 || err != nil {
		t.Errorf("Cleanup = %d, %v; want 1, nil", n, err)
	}
}
