package citus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// A claim whose two-phase commit did not finish on one node: the coordinator
// committed (its advisory lock, the lock sealing waits for, is free), and a
// worker still holds the claim's row prepared, invisible, until Citus's
// recovery commits it. Forced here by preparing the claim's row on its
// worker by hand. Sealing must wait for it: sealed, the partition would only
// be looked up, the redelivery would miss the prepared row and be processed
// a second time. Unsealed, the redelivery inserts into that partition too
// and waits on the prepared row (ErrInFlight under LockTimeout). Once the
// transaction is committed, sealing goes on, although another transaction
// touching no shard of the table is still prepared on that worker, and the
// redelivery is a duplicate.
func TestPartitionedSealWaitsForPreparedClaims(t *testing.T) {
	t.Parallel()
	s := newSchema(t, 4)
	ctx := ctxT(t, 2*time.Minute)
	store := s.store(t, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: 20 * time.Second, Partitions: 10,
		LockTimeout: 300 * time.Millisecond}) // 2-second partitions
	if err := store.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	// Setup kept the table's shard group: charges is still co-located.
	var groups int
	if err := s.pool.QueryRow(ctx, `SELECT count(DISTINCT colocationid) FROM pg_dist_partition
WHERE logicalrelid IN ('processed_messages'::regclass, 'charges'::regclass)`).Scan(&groups); err != nil || groups != 1 {
		t.Fatalf("processed_messages and charges in %d shard groups after Setup (%v), want 1", groups, err)
	}
	if _, err := store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	const id = "in-doubt"

	// The current partition, the shard of id in it, and the worker holding it.
	var partition, shard, host string
	var port int
	var at, end time.Time
	current := func() error {
		return s.pool.QueryRow(ctx, `SELECT c.relname::text, clock_timestamp(), b.m[2]::timestamptz
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = 'processed_messages'::regclass
AND clock_timestamp() >= b.m[1]::timestamptz AND clock_timestamp() < b.m[2]::timestamptz - interval '500 ms'`).Scan(&partition, &at, &end)
	}
	err := current()
	for errors.Is(err, pgx.ErrNoRows) { // too close to a switch: the next partition
		time.Sleep(600 * time.Millisecond)
		err = current()
	}
	if err != nil {
		t.Fatal(err)
	}
	err = s.pool.QueryRow(ctx, `SELECT shard_name(p, sh.shardid), sh.nodename, sh.nodeport
FROM (SELECT $1::regclass AS p) r, citus_shards sh
WHERE sh.shardid = get_shard_id_for_distribution_column(r.p, $2::text)`, partition, id).Scan(&shard, &host, &port)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(s.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port = host, uint16(port)
	worker, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { worker.Close(context.Background()) })

	// A transaction prepared on the same worker that touches no shard of the
	// table: sealing must not wait for it (checked at the end).
	other := "pgdedup_other_" + s.name
	for _, q := range []string{`CREATE TABLE public.` + other + ` (a int)`, `BEGIN`, `INSERT INTO public.` + other + ` VALUES (1)`,
		`PREPARE TRANSACTION '` + other + `'`} {
		if _, err := worker.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		worker.Exec(context.Background(), `ROLLBACK PREPARED '`+other+`'`) //nolint:errcheck // best effort
		worker.Exec(context.Background(), `DROP TABLE public.`+other)      //nolint:errcheck // best effort
	})

	// The claim, prepared on its worker and never committed by the coordinator.
	gid := fmt.Sprintf("pgdedup_test_%s", s.name)
	for _, q := range []string{`BEGIN`, `SET LOCAL citus.enable_manual_changes_to_shards = on`,
		fmt.Sprintf(`INSERT INTO %s (consumer, message_id, key, processed_at, expires_at) VALUES ('billing', $1, $2, $3::timestamptz, $3::timestamptz + interval '20 s')`,
			pgx.Identifier(strings.Split(shard, ".")).Sanitize()),
		`PREPARE TRANSACTION '` + gid + `'`} {
		args := []any{}
		if strings.HasPrefix(q, "INSERT") {
			args = []any{id, pgdedup.Key("billing", id), at}
		}
		if _, err := worker.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	committed := false
	t.Cleanup(func() { // before the schema is dropped, which would wait for it
		if !committed {
			worker.Exec(context.Background(), `ROLLBACK PREPARED '`+gid+`'`) //nolint:errcheck // best effort
		}
	})

	// The partition ends: sealing is due, and waits.
	sealed := func() time.Time {
		t.Helper()
		var v time.Time
		if err := s.pool.QueryRow(ctx, `SELECT sealed FROM pgdedup_partitions WHERE parent = 'processed_messages'::regclass`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for {
		var past bool
		if err := s.pool.QueryRow(ctx, `SELECT clock_timestamp() >= $1`, end).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if past {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := store.Cleanup(ctx); err != nil && !errors.Is(err, pgdedup.ErrCleanupStarved) {
		t.Fatal(err)
	}
	if v := sealed(); !v.Before(end) {
		t.Fatalf("sealed up to %s, past %s, while a claim in it is prepared on %s:%d", v, partition, host, port)
	}
	charged := 0
	processed, err := store.Process(ctx, id, func(context.Context, pgx.Tx) error { charged++; return nil })
	if !errors.Is(err, pgdedup.ErrInFlight) || processed || charged != 0 {
		t.Fatalf("redelivery while the claim is prepared: processed=%v err=%v, charged %d times; want ErrInFlight, not charged",
			processed, err, charged)
	}

	// Citus's recovery would commit it (the coordinator's record says so).
	if _, err := worker.Exec(ctx, `COMMIT PREPARED '`+gid+`'`); err != nil {
		t.Fatal(err)
	}
	committed = true
	if _, err := store.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if v := sealed(); v.Before(end) {
		t.Errorf("sealed up to %s once the prepared claim committed (another transaction, on no shard of the table, still prepared), want past %s", v, end)
	}
	processed, err = store.Process(ctx, id, func(context.Context, pgx.Tx) error { charged++; return nil })
	if err != nil || processed || charged != 0 {
		t.Fatalf("redelivery after the commit: processed=%v err=%v, charged %d times; want a duplicate", processed, err, charged)
	}
}
