package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// statsJSON mirrors the documented --json output.
type statsJSON struct {
	Table          string     `json:"table"`
	Now            time.Time  `json:"now"`
	Rows           int64      `json:"rows"`
	ExpiredRows    int64      `json:"expired_rows"`
	TableBytes     int64      `json:"table_bytes"`
	IndexBytes     int64      `json:"index_bytes"`
	TotalBytes     int64      `json:"total_bytes"`
	DeadTuples     int64      `json:"dead_tuples"`
	LastVacuum     *time.Time `json:"last_vacuum"`
	LastAutovacuum *time.Time `json:"last_autovacuum"`
	Indexes        []struct {
		Name   string `json:"name"`
		Method string `json:"method"`
		Bytes  int64  `json:"bytes"`
	} `json:"indexes"`
	Consumers []struct {
		Consumer          string     `json:"consumer"`
		Rows              int64      `json:"rows"`
		ExpiredRows       int64      `json:"expired_rows"`
		OldestProcessedAt time.Time  `json:"oldest_processed_at"`
		NextExpiry        *time.Time `json:"next_expiry"`
	} `json:"consumers"`
}

func TestStatsCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pgtest.Seed(t, db.Pool, "billing", "b", 3, time.Hour)
	pgtest.Seed(t, db.Pool, "emails", "e", 2, -time.Minute)
	// Exact times for the billing rows, which the output shows.
	pgtest.Exec(t, db.Pool, `UPDATE processed_messages SET processed_at = t.processed, expires_at = t.expires
FROM (VALUES ('b0000001', timestamptz '2026-01-01T00:00:00Z', timestamptz '2000-01-01T00:00:00Z'),
             ('b0000002', '2026-01-02T00:00:00Z', '2999-01-01T00:00:00Z'),
             ('b0000003', '2026-01-03T00:00:00Z', '2999-06-01T00:00:00Z')) AS t(id, processed, expires)
WHERE consumer = 'billing' AND message_id = t.id`)

	r := run(t, "stats", "--json", "--database-url", db.URL)
	if r.code != 0 {
		t.Fatalf("stats --json: %s", r)
	}
	var st statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("stats --json is not JSON: %v\n%s", err, r)
	}
	if st.Table != "processed_messages" || st.Rows != 5 || st.ExpiredRows != 3 || time.Since(st.Now).Abs() > time.Minute {
		t.Errorf("totals: %+v", st)
	}
	if st.TableBytes <= 0 || st.IndexBytes <= 0 || st.TotalBytes < st.TableBytes+st.IndexBytes {
		t.Errorf("sizes: table %d, indexes %d, total %d", st.TableBytes, st.IndexBytes, st.TotalBytes)
	}
	if len(st.Consumers) != 2 {
		t.Fatalf("consumers: %+v", st.Consumers)
	}
	billing, emails := st.Consumers[0], st.Consumers[1]
	if billing.Consumer != "billing" || billing.Rows != 3 || billing.ExpiredRows != 1 ||
		!billing.OldestProcessedAt.Equal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) ||
		billing.NextExpiry == nil || !billing.NextExpiry.Equal(time.Date(2999, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("billing: %+v (next expiry %v)", billing, billing.NextExpiry)
	}
	if emails.Consumer != "emails" || emails.Rows != 2 || emails.ExpiredRows != 2 || emails.NextExpiry != nil {
		t.Errorf("emails: %+v", emails)
	}
	onCitus := pgtest.CitusColumn() != "" // no vacuum figures nor indexes there (see pgdedup.Store.Stats)
	var indexBytes int64
	for _, ix := range st.Indexes {
		if ix.Name == "" || ix.Method == "" || ix.Bytes <= 0 {
			t.Errorf("index %+v", ix)
		}
		indexBytes += ix.Bytes
	}
	if !onCitus && (len(st.Indexes) == 0 || indexBytes != st.IndexBytes || st.DeadTuples < 0 || st.LastVacuum != nil) {
		t.Errorf("indexes %+v (%d bytes in all, IndexBytes %d), dead tuples %d, last vacuum %v",
			st.Indexes, indexBytes, st.IndexBytes, st.DeadTuples, st.LastVacuum)
	}

	r = run(t, "stats", "--database-url", db.URL)
	if !onCitus {
		for _, want := range []string{" dead tuples; last vacuum never, last autovacuum ", "\nINDEX ", " btree "} {
			if r.code != 0 || !strings.Contains(r.stdout, want) {
				t.Errorf("stats: no %q in %s", want, r)
			}
		}
	}
	for _, want := range []string{
		"processed_messages: 5 rows, 3 expired; ",
		"CONSUMER  ROWS  EXPIRED  OLDEST PROCESSED",
		"billing   3     1        2026-01-01T00:00:00Z (",
		"2999-01-01T00:00:00Z (in ",
		"3 expired rows wait for cleanup",
	} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("stats: no %q in %s", want, r)
		}
	}
}

func TestStatsEmptyTable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	if r := run(t, "stats", "--database-url", db.URL); r.code != 0 || !strings.Contains(r.stdout, "no rows") {
		t.Errorf("stats: %s", r)
	}
	r := run(t, "stats", "--json", "--database-url", db.URL)
	if r.code != 0 || !strings.Contains(r.stdout, `"consumers": []`) {
		t.Errorf("stats --json: %s", r)
	}
}
