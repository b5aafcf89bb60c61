package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
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
	WAL *struct {
		Held              time.Duration `json:"held"`
		PlainImages       float64       `json:"plain_images"`
		PartitionedImages float64       `json:"partitioned_images"`
	} `json:"wal_estimate"`
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

	// The plain table's WAL estimate: its oldest row is 11 months old, so
	// every claim would log a page image, and the partitioned layout fewer.
	if !onCitus && (st.WAL == nil || st.WAL.Held < 300*24*time.Hour || st.WAL.PlainImages < 0.9 || st.WAL.PartitionedImages >= st.WAL.PlainImages) {
		t.Errorf("wal_estimate: %+v", st.WAL)
	}

	r = run(t, "stats", "--database-url", db.URL)
	if !onCitus {
		for _, want := range []string{" dead tuples; last vacuum never, last autovacuum ", "\nINDEX ", " btree ", "\nWAL: holding "} {
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

// Consumer names are written by any role with INSERT. stats shows them
// without a control or formatting character reaching the terminal, and
// without breaking its columns. --json keeps them exact, escaped by JSON.
func TestStatsEscapesConsumerNames(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	hostile := map[string]string{ // name → how the table shows it
		"\x1b[2J\x1b[31mbilling\x1b[0m":    `"\x1b[2J\x1b[31mbilling\x1b[0m"`,
		"evil\nprocessed_messages: 0 rows": `"evil\nprocessed_messages: 0 rows"`,
		"tab\there":                        `"tab\there"`,
		"gnp\u202eusd":                     `"gnp\u202eusd"`,
		" padded":                          `" padded"`,
		`"quoted"`:                         `"\"quoted\""`,
		"order service":                    "order service",
		"zahlungsdienst-ü":                 "zahlungsdienst-ü",
		strings.Repeat("x", 5000):          strings.Repeat("x", 100) + "…(5000 bytes)",
		"\x07" + strings.Repeat("é", 60):   `"\a` + strings.Repeat("é", 49) + `"…(121 bytes)`, // cut on a character's start
	}
	for name := range hostile {
		pgtest.Seed(t, db.Pool, name, "m", 1, time.Hour)
	}
	r := run(t, "stats", "--database-url", db.URL)
	if r.code != 0 {
		t.Fatal(r)
	}
	for _, b := range []byte(r.stdout) {
		if b < 0x20 && b != '\n' || b == 0x7f {
			t.Fatalf("stats printed control byte %#x:\n%q", b, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "\u202e") {
		t.Errorf("stats printed a right-to-left override:\n%q", r.stdout)
	}
	for name, want := range hostile {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + ` +1 +0 +`).MatchString(r.stdout) {
			t.Errorf("no row for %.40q… shown as %.60s…:\n%s", name, want, r.stdout)
		}
	}

	r = run(t, "stats", "--json", "--database-url", db.URL)
	var st statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 0 || strings.ContainsRune(r.stdout, 0x1b) {
		t.Fatalf("stats --json: %v\n%s", err, r)
	}
	for _, cs := range st.Consumers {
		if _, ok := hostile[cs.Consumer]; !ok {
			t.Errorf("--json consumer %q is not one of the names written", cs.Consumer)
		}
	}
	if len(st.Consumers) != len(hostile) {
		t.Errorf("--json: %d consumers, want %d", len(st.Consumers), len(hostile))
	}
}

// stats shows the --max-consumers consumers with the most rows, in name
// order, and says how many more there are and what they hold.
func TestStatsCapsConsumers(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for i, n := range []int{5, 1, 7, 2, 6, 1, 3} { // c0 … c6
		pgtest.Seed(t, db.Pool, fmt.Sprintf("c%d", i), "m", n, -time.Minute) // expired
	}
	r := run(t, "stats", "--max-consumers", "3", "--database-url", db.URL)
	if r.code != 0 || !regexp.MustCompile(`CONSUMER[^\n]*\nc0 +5 [^\n]*\nc2 +7 [^\n]*\nc4 +6 [^\n]*\n… and 4 more consumers, with 7 rows, 7 expired \(shown: the 3 with the most rows; --max-consumers to change\)\n`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "processed_messages: 25 rows, 25 expired") {
		t.Errorf("stats --max-consumers 3: %s", r)
	}
	r = run(t, "stats", "--json", "--max-consumers", "3", "--database-url", db.URL)
	var st struct {
		Rows      int64 `json:"rows"`
		Consumers []struct {
			Consumer string `json:"consumer"`
		} `json:"consumers"`
		LeftOut struct {
			Consumers   int   `json:"consumers"`
			Rows        int64 `json:"rows"`
			ExpiredRows int64 `json:"expired_rows"`
		} `json:"consumers_left_out"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 0 || st.Rows != 25 || len(st.Consumers) != 3 ||
		st.Consumers[0].Consumer != "c0" || st.Consumers[2].Consumer != "c4" || st.LeftOut.Consumers != 4 || st.LeftOut.Rows != 7 || st.LeftOut.ExpiredRows != 7 {
		t.Errorf("stats --json --max-consumers 3: %+v, %v\n%s", st, err, r)
	}
	r = run(t, "stats", "--database-url", db.URL) // the default shows all 7
	if r.code != 0 || strings.Contains(r.stdout, "more consumers") || !strings.Contains(r.stdout, "\nc6 ") {
		t.Errorf("stats: %s", r)
	}
	if r := run(t, "stats", "--max-consumers", "0", "--database-url", db.URL); r.code != 2 || !strings.Contains(r.stderr, "--max-consumers must be a positive number") {
		t.Errorf("--max-consumers 0: %s", r)
	}
}

// On a partitioned table, stats lists the partitions in text as --json does,
// each with its span, rows, size and state (the past one Setup made sealed,
// the one holding the claims current, those ahead of the clock ahead).
func TestStatsCommandPartitioned(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store := partitionedStore(t, db)
	for _, id := range []string{"a", "b"} {
		if _, err := store.Process(ctx, id, func(context.Context, pgx.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	var st struct {
		Now        time.Time                `json:"now"`
		Partitions []pgdedup.PartitionStats `json:"partitions"`
		Runway     time.Duration            `json:"partition_runway"`
		WAL        *json.RawMessage         `json:"wal_estimate"`
	}
	var text result
	// Both outputs in one 5-minute partition (again if one began between).
	for st.Now.IsZero() || !st.Now.Truncate(5*time.Minute).Equal(time.Now().Add(-time.Second).Truncate(5*time.Minute)) {
		r := run(t, "stats", "--json", "--database-url", db.URL)
		if err := json.Unmarshal([]byte(r.stdout), &st); r.code != 0 || err != nil || len(st.Partitions) < 5 {
			t.Fatalf("stats --json: %v: %s, want 5 partitions or more (the past one, the current one, 3 ahead)", err, r)
		}
		text = run(t, "stats", "--database-url", db.URL)
	}
	if st.WAL != nil || strings.Contains(text.stdout, "\nWAL: ") {
		t.Errorf("a WAL estimate for the plain layout on a partitioned table: %s", text)
	}
	if text.code != 0 || !regexp.MustCompile(`\n\d+ partitions of 5m0s each, sealed before \S+Z \(rows include hand-over copies\)\nPARTITION +FROM +TO +ROWS +SIZE +STATE\n`).MatchString(text.stdout) {
		t.Fatalf("stats: no partitions header in %s", text)
	}
	states := map[string]int{}
	for _, p := range st.Partitions {
		state := "ahead"
		switch {
		case p.Sealed:
			state = "sealed"
		case !p.From.After(st.Now) && p.To.After(st.Now):
			state = "current"
		case !p.From.After(st.Now):
			state = "unsealed"
		}
		states[state]++
		line := regexp.MustCompile(fmt.Sprintf(`\n%s +%s +%s +%d +[0-9.]+ [kMG]?B +%s\n`, regexp.QuoteMeta(p.Name),
			regexp.QuoteMeta(p.From.Format(time.RFC3339)), regexp.QuoteMeta(p.To.Format(time.RFC3339)), p.Rows, state))
		if p.Bytes <= 0 || !line.MatchString(text.stdout) {
			t.Errorf("stats: no line for %+v (%s) in\n%s", p, state, text.stdout)
		}
	}
	if states["sealed"] == 0 || states["current"] != 1 || states["ahead"] < 3 {
		t.Errorf("partition states %v, want the past one sealed, one current, 3 ahead", states)
	}
	// The runway reaches to the end of the last partition ahead, 3 to 4 spans.
	last := st.Partitions[len(st.Partitions)-1].To
	if want := last.Sub(st.Now); st.Runway != want || st.Runway <= 15*time.Minute || st.Runway > 20*time.Minute {
		t.Errorf("partition_runway %s, want %s (to %s), between 3 and 4 spans", st.Runway, want, last)
	}
	if !regexp.MustCompile(`\nrunway \S+: without a cleanup, claims find a partition until \S+\n`).MatchString(text.stdout) {
		t.Errorf("stats: no runway line in\n%s", text.stdout)
	}
}
