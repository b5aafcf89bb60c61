package pgdedup_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
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
