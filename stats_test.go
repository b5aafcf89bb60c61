package pgdedup_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Stats counts what the table holds, per consumer, against the database's clock.
func TestStatsCountsRowsPerConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	mustExec(t, b.pool, `INSERT INTO processed_messages (consumer, message_id, processed_at, expires_at) VALUES
	('billing', 'a', '2026-01-01T00:00:00Z', '2000-01-01T00:00:00Z'),
	('billing', 'b', '2026-01-02T00:00:00Z', '2999-01-01T00:00:00Z'),
	('billing', 'c', '2026-01-03T00:00:00Z', '2999-06-01T00:00:00Z'),
	('emails', 'a', now() - interval '1 hour', now() - interval '1 minute')`)
	// A claim through the Store counts like any other row, and is not expired.
	if _, err := b.store.Process(ctx, "d", charge("d")); err != nil {
		t.Fatal(err)
	}

	st, err := b.store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows != 5 || st.ExpiredRows != 2 || time.Since(st.Now).Abs() > time.Minute || st.Now.Location() != time.UTC {
		t.Errorf("totals: rows %d, expired %d, now %v", st.Rows, st.ExpiredRows, st.Now)
	}
	if st.TableBytes <= 0 || st.IndexBytes <= 0 || st.TotalBytes < st.TableBytes+st.IndexBytes {
		t.Errorf("sizes: table %d, indexes %d, total %d", st.TableBytes, st.IndexBytes, st.TotalBytes)
	}
	if len(st.Consumers) != 2 {
		t.Fatalf("consumers: %+v", st.Consumers)
	}
	billing, emails := st.Consumers[0], st.Consumers[1]
	if billing.Consumer != "billing" || billing.Rows != 4 || billing.ExpiredRows != 1 ||
		!billing.OldestProcessedAt.Equal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) ||
		billing.NextExpiry == nil || billing.NextExpiry.Sub(st.Now) < 47*time.Hour || billing.NextExpiry.Sub(st.Now) > 49*time.Hour {
		t.Errorf("billing: %+v (next expiry %v, now %v): want the claim's now()+48h as next expiry", billing, billing.NextExpiry, st.Now)
	}
	if emails.Consumer != "emails" || emails.Rows != 1 || emails.ExpiredRows != 1 || emails.NextExpiry != nil {
		t.Errorf("emails: %+v", emails)
	}
}

func TestStatsEmptyAndMissingTable(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	st, err := b.store.Stats(ctx)
	if err != nil || st.Rows != 0 || st.Consumers == nil || len(st.Consumers) != 0 {
		t.Errorf("empty table: %+v, %v; want no rows and an empty, non-nil Consumers", st, err)
	}

	missing, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", Table: "nowhere"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := missing.Stats(ctx); err == nil || !strings.Contains(err.Error(), `"nowhere": table not found`) {
		t.Errorf("missing table: %v", err)
	}
}

// Deleted rows count as dead tuples until a VACUUM removes them, and the
// VACUUM is reported; every index is listed with its size, and they add up.
func TestStatsDeadTuplesVacuumAndIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	// Autovacuum (on in CI) must not vacuum behind the test's back.
	mustExec(t, b.pool, `ALTER TABLE processed_messages SET (autovacuum_enabled = false)`)
	pgtest.Seed(t, b.pool, "billing", "old-", 1_000, -time.Hour)
	pgtest.Seed(t, b.pool, "billing", "live-", 10, time.Hour)
	// The deleting session's statistics reach the shared ones when it goes idle,
	// at most once a second unless forced.
	mustExec(t, b.pool, `DELETE FROM processed_messages WHERE expires_at < now(); SELECT pg_stat_force_next_flush()`)

	st, err := b.store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pgtest.CitusColumn() != "" { // see Store.Stats
		if st.DeadTuples != 0 || st.LastVacuum != nil || len(st.Indexes) != 0 {
			t.Errorf("on Citus: dead tuples %d, last vacuum %v, indexes %+v; want none", st.DeadTuples, st.LastVacuum, st.Indexes)
		}
		return
	}
	if st.DeadTuples != 1_000 || st.LastVacuum != nil || st.LastAutovacuum != nil {
		t.Errorf("after deleting 1000 rows: dead tuples %d, last vacuum %v, last autovacuum %v; want 1000, never, never",
			st.DeadTuples, st.LastVacuum, st.LastAutovacuum)
	}
	var sum int64
	for _, ix := range st.Indexes {
		if ix.Name == "" || ix.Method == "" || ix.Bytes <= 0 {
			t.Errorf("index %+v", ix)
		}
		sum += ix.Bytes
	}
	if len(st.Indexes) < 2 || sum != st.IndexBytes {
		t.Errorf("indexes %+v add up to %d bytes, want at least 2 adding up to IndexBytes %d", st.Indexes, sum, st.IndexBytes)
	}

	mustExec(t, b.pool, `VACUUM processed_messages`) // reported at once
	st, err = b.store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// VACUUM leaves the dead tuples an older snapshot may still see (another
	// test's, on a shared server): they are counted until the next one.
	if st.DeadTuples > 1_000 || st.LastVacuum == nil || st.LastVacuum.Sub(st.Now).Abs() > time.Minute || st.LastVacuum.Location() != time.UTC {
		t.Errorf("after VACUUM: dead tuples %d, last vacuum %v (now %v); want at most 1000, just now in UTC", st.DeadTuples, st.LastVacuum, st.Now)
	}
}
