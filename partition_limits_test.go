package pgdedup_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// At MaxPartitions, with as many partitions attached as the steady state
// has (those of the last Retention, one a Retention old, the current one
// and three ahead: 65), the first claim of a session (which plans) and a
// batch each hold at most about 3 locks per partition they look in plus 12
// (201 for 63 partitions: all but those ahead of the next one), the figure
// the docs and the ConfigError give. MaxPartitions is accepted, one more is
// refused (TestNewRejectsBadConfig).
func TestPartitionedClaimLocks(t *testing.T) {
	t.Parallel()
	n := pgdedup.MaxPartitions
	b := setupPartitioned(t, pgdedup.Config{Retention: time.Duration(n) * time.Hour, Partitions: n})
	ctx := ctxT(t)
	// Setup's one partition for the past Retention, replaced by n + 1
	// hourly ones (on Citus the indexes name the distribution column).
	cols := "key"
	if c := pgtest.CitusColumn(); c != "" && c != "key" {
		cols += ", " + c
	}
	mustExec(t, b.pool, fmt.Sprintf(`DO $$ DECLARE r record; cur timestamptz := date_bin('1 hour', now(), '2000-01-01'); k int; BEGIN
FOR r IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE inhparent = 'processed_messages'::regclass
  AND (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz <= cur LOOP
  EXECUTE format('ALTER TABLE processed_messages DETACH PARTITION %%I', r.relname);
  EXECUTE format('DROP TABLE %%I', r.relname);
END LOOP;
FOR k IN 1..%d LOOP
  EXECUTE format('CREATE TABLE %%I PARTITION OF processed_messages FOR VALUES FROM (%%L) TO (%%L)', 'past_' || k,
    cur - k * interval '1 hour', cur - (k - 1) * interval '1 hour');
  EXECUTE format('CREATE UNIQUE INDEX ON %%I (%s)', 'past_' || k);
  EXECUTE format('CREATE INDEX ON %%I (expires_at)', 'past_' || k);
END LOOP; END $$`, n+1, cols))
	attached := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'processed_messages'::regclass`)
	if attached != n+5 {
		t.Fatalf("%d partitions attached, want %d", attached, n+5)
	}
	limit := 3*(attached-2) + 12
	for _, batch := range []bool{false, true} {
		conn := newSession(t, b) // a session of its own: the claim plans
		tx, err := conn.conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if batch {
			_, err = b.store.ClaimBatch(ctx, tx, []string{"a", "b", "c"})
		} else {
			_, err = b.store.Claim(ctx, tx, "x")
		}
		if err != nil {
			t.Fatal(err)
		}
		locks := pgtest.Count(t, tx, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()`)
		_ = tx.Rollback(ctx)
		t.Logf("batch=%v: %d locks with %d partitions attached", batch, locks, attached)
		if locks > limit {
			t.Errorf("batch=%v: a claim holds %d locks with %d partitions attached, over the documented %d", batch, locks, attached, limit)
		}
	}
}
