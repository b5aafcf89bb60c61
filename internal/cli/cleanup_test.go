package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// --dry-run counts and deletes nothing. cleanup deletes the expired rows of
// every consumer, in batches of --batch, and only those.
func TestCleanupCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pgtest.Seed(t, db.Pool, "billing", "old-", 1_500, -time.Hour)
	pgtest.Seed(t, db.Pool, "emails", "old-", 1_000, -time.Second)
	pgtest.Seed(t, db.Pool, "emails", "live-", 10, time.Hour)

	r := run(t, "cleanup", "--dry-run", "--batch", "1000", "--database-url", db.URL)
	if r.code != 0 || r.stdout != "dry run: 2500 expired rows in processed_messages would be deleted, in 3 batches of at most 1000; nothing was deleted\n" {
		t.Errorf("dry run: %s", r)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`); n != 2_510 {
		t.Fatalf("%d rows after a dry run, want 2510", n)
	}

	r = run(t, "cleanup", "--batch", "1000", "--verbose", "--database-url", db.URL)
	if r.code != 0 || !regexp.MustCompile(`^deleted 2500 expired rows from processed_messages in [0-9.]+m?s\n$`).MatchString(r.stdout) {
		t.Errorf("cleanup: %s", r)
	}
	// On Citus, Cleanup deletes by windows of expires_at, each of at most
	// --batch rows, so there are at least 3 of them.
	if n := strings.Count(r.stderr, `msg="pgdedup: cleanup batch"`); n != 3 && (pgtest.CitusColumn() == "" || n < 3) {
		t.Errorf("--verbose logged %d batches, want 3:\n%s", n, r.stderr)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`); n != 10 {
		t.Errorf("%d rows left, want the 10 live ones", n)
	}
	if r = run(t, "cleanup", "--database-url", db.URL); r.code != 0 || !strings.HasPrefix(r.stdout, "deleted 0 expired rows") {
		t.Errorf("cleanup with nothing to do: %s", r)
	}
}

// Bad flags are refused before connecting (the URL here answers nothing).
func TestCleanupCommandBadInput(t *testing.T) {
	t.Parallel()
	nowhere := "postgres://app@127.0.0.1:1/app"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch", "0"}, "--batch must be a positive number of rows, got 0"},
		{[]string{"--batch", "-5"}, "--batch must be a positive number of rows, got -5"},
		{[]string{"--batch", "many"}, `pgdedup cleanup: --batch "many": not a whole number`},
		{[]string{"--table", "my-table"}, `--table "my-table": "my-table" is not a plain identifier`},
		{[]string{"--table", "a.b.c"}, `--table "a.b.c" is not table or schema.table`},
		{[]string{"--timeout", "-1s"}, "--timeout must not be negative"},
		{[]string{"--turn-wait", "-1s"}, "--turn-wait must not be negative"},
		{[]string{"now"}, `unexpected argument "now"`},
	} {
		r := run(t, append([]string{"cleanup", "--database-url", nowhere}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("cleanup %q: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
}

// A bad flag is reported with the command's prefix, the flag as written
// (--name), and why, above all a duration's missing unit.
func TestFlagErrors(t *testing.T) {
	t.Parallel()
	nowhere := "postgres://app@127.0.0.1:1/app"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cleanup", "--timeout", "5"}, "pgdedup cleanup: --timeout 5: missing unit; write 5s, 5m or 5h\n"},
		{[]string{"cleanup", "--timeout", "1.5"}, "pgdedup cleanup: --timeout 1.5: missing unit; write 1.5s, 1.5m or 1.5h\n"},
		{[]string{"cleanup", "--timeout", "5min"}, `pgdedup cleanup: --timeout "5min": unknown unit; write a number and a unit, such as 30s, 5m or 1h30m` + "\n"},
		{[]string{"cleanup", "--timeout", "soon"}, `pgdedup cleanup: --timeout "soon": not a duration; write`},
		{[]string{"cleanup", "--batch", "1e99"}, `pgdedup cleanup: --batch "1e99": not a whole number`},
		{[]string{"cleanup", "--batch", "99999999999999999999"}, "pgdedup cleanup: --batch 99999999999999999999: out of range"},
		{[]string{"cleanup", "--dry-run=maybe"}, `pgdedup cleanup: --dry-run="maybe": want true or false`},
		{[]string{"cleanup", "--bacth", "5"}, "pgdedup cleanup: unknown flag --bacth\n"},
		{[]string{"cleanup", "--batch"}, "pgdedup cleanup: --batch needs a value\n"},
		{[]string{"stats", "-json=2"}, `pgdedup stats: --json="2": want true or false`},
		{[]string{"migrate", "sql", "--after", "x"}, `pgdedup migrate: --after "x": not a whole number`},
		{[]string{"demo", "--orders", "x"}, `pgdedup demo: --orders "x": not a whole number`},
		{[]string{"demo", "--crash-rate", "lots"}, `pgdedup demo: --crash-rate "lots": not a number`},
	} {
		r := run(t, append([]string{tc.args[0], "--database-url", nowhere}, tc.args[1:]...)...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "pgdedup ") || !strings.Contains(r.stderr, tc.want) ||
			regexp.MustCompile(`flag -[a-z]`).MatchString(r.stderr) || strings.Count(r.stderr, "pgdedup ") != 2 {
			t.Errorf("%q: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
}

// A missing table is a failure that says what to run.
func TestCleanupAndStatsMissingTable(t *testing.T) {
	t.Parallel()
	unmigrated, migrated := pgtest.NewUnmigrated(t), pgtest.New(t)
	for _, cmd := range []string{"cleanup", "stats"} {
		r := run(t, cmd, "--database-url", unmigrated.URL)
		if r.code != 1 || !strings.Contains(r.stderr, "table processed_messages not found") ||
			!strings.Contains(r.stderr, "run `pgdedup migrate up`") || !strings.Contains(r.stderr, unmigrated.Schema) {
			t.Errorf("%s on an unmigrated schema: %s", cmd, r)
		}
		r = run(t, cmd, "--table", "ops.dedup", "--database-url", migrated.URL)
		if r.code != 1 || !strings.Contains(r.stderr, "table ops.dedup not found") {
			t.Errorf("%s --table ops.dedup: %s", cmd, r)
		}
	}
}

// --help lists every flag with its value and default, from the definitions.
func TestCleanupHelpListsTheFlags(t *testing.T) {
	t.Parallel()
	r := run(t, "cleanup", "--help")
	for _, want := range []string{"--batch N ", "(default: 10000)", "--database-url URL ", "--dry-run ", "--table NAME ",
		"processed_messages)", "--timeout D ", "--verbose "} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("cleanup --help lacks %q: %s", want, r)
		}
	}
}

// A session that holds the cleaners' advisory lock does not make cleanup print
// "deleted 0" and exit 0. It waits --turn-wait, then exits 1 naming the
// session. With --turn-wait 0 it tries once and fails the same way.
func TestCleanupCommandStarved(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pgtest.Seed(t, db.Pool, "billing", "old-", 10, -time.Hour)
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	// The lock is taken inside an open transaction. Behind PgBouncer in
	// transaction pooling, a session lock would go back to the pool with its
	// server connection.
	if _, err := holder.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid(), pg_advisory_xact_lock(1885824100, 'processed_messages'::regclass::oid::int4)`).Scan(&pid, nil); err != nil {
		t.Fatal(err)
	}
	for _, wait := range []string{"200ms", "0"} {
		r := run(t, "cleanup", "--turn-wait", wait, "--database-url", db.URL)
		if r.code != 1 || !strings.Contains(r.stderr, "never got its turn") || !strings.Contains(r.stderr, fmt.Sprintf("pid %d", pid)) {
			t.Errorf("cleanup --turn-wait %s with the turn held: %s, want exit 1 naming pid %d", wait, r, pid)
		}
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`); n != 10 {
		t.Fatalf("%d rows, want the 10 expired ones still there", n)
	}
	if _, err := holder.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	if r := run(t, "cleanup", "--database-url", db.URL); r.code != 0 || !strings.HasPrefix(r.stdout, "deleted 10 expired rows") {
		t.Errorf("cleanup once the holder let go: %s", r)
	}
}

// On a partitioned table, cleanup prints each partition it dropped and created,
// with its span, in text and in JSON. An old empty partition is dropped. The
// test attaches it by hand, years past, because the CLI keeps the default
// Retention, 48h, past a partition's end. The newest is dropped by hand, so
// that cleanup creates it again.
func TestCleanupCommandPartitioned(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	partitionedStore(t, db)
	old := pgdedup.PartitionSpan{Name: "processed_messages_old",
		From: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), To: time.Date(2020, 1, 2, 0, 0, 0, 0, time.UTC)}
	prepare := func() pgdedup.PartitionSpan {
		t.Helper()
		pgtest.Exec(t, db.Pool, `CREATE TABLE processed_messages_old (LIKE processed_messages INCLUDING DEFAULTS)`)
		pgtest.Exec(t, db.Pool, `ALTER TABLE processed_messages ATTACH PARTITION processed_messages_old FOR VALUES FROM ('2020-01-01Z') TO ('2020-01-02Z')`)
		var newest pgdedup.PartitionSpan
		if err := db.Pool.QueryRow(ctx, `SELECT c.relname::text, b.m[1]::timestamptz, b.m[2]::timestamptz
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = 'processed_messages'::regclass ORDER BY 2 DESC LIMIT 1`).Scan(&newest.Name, &newest.From, &newest.To); err != nil {
			t.Fatal(err)
		}
		pgtest.Exec(t, db.Pool, `DROP TABLE `+pgx.Identifier{newest.Name}.Sanitize())
		newest.From, newest.To = newest.From.UTC(), newest.To.UTC()
		return newest
	}
	same := func(a, b pgdedup.PartitionSpan) bool {
		return a.Name == b.Name && a.From.Equal(b.From) && a.To.Equal(b.To)
	}

	newest := prepare()
	r := run(t, "cleanup", "--json", "--database-url", db.URL)
	var out struct {
		Table   string                  `json:"table"`
		Deleted *int64                  `json:"deleted_rows"`
		Created []pgdedup.PartitionSpan `json:"created_partitions"`
		Dropped []pgdedup.PartitionSpan `json:"dropped_partitions"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); r.code != 0 || err != nil {
		t.Fatalf("cleanup --json: %v: %s", err, r)
	}
	if out.Table != "processed_messages" || out.Deleted == nil || *out.Deleted != 0 || len(out.Dropped) != 1 || !same(out.Dropped[0], old) ||
		!slices.ContainsFunc(out.Created, func(p pgdedup.PartitionSpan) bool { return same(p, newest) }) {
		// Contains, not last: a switch during the run adds the next one.
		t.Errorf("cleanup --json: %s\nwant %+v dropped and %+v created", r.stdout, old, newest)
	}

	newest = prepare()
	r = run(t, "cleanup", "--database-url", db.URL)
	span := func(p pgdedup.PartitionSpan) string {
		return p.Name + ": " + p.From.Format(time.RFC3339) + " to " + p.To.Format(time.RFC3339) + "\n"
	}
	if r.code != 0 || !regexp.MustCompile(`^dropped 1 and created [1-9][0-9]* partitions of processed_messages \(about 0 rows dropped\) in [0-9.]+m?s\n`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "\ndropped "+span(old)) || !strings.Contains(r.stdout, "\ncreated "+span(newest)) {
		t.Errorf("cleanup: %s\nwant %s dropped and %s created", r, span(old), span(newest))
	}
}

// With cleanup --retention, a partition of a partitioned table is dropped only
// once it ended that long ago (the consumers' Retention). The default, 48 h,
// keeps a partition that ended 2 hours ago, and --retention 1h drops it (a
// dry run says so and drops nothing). A --retention below the minimum is
// refused before connecting.
func TestCleanupCommandRetention(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	partitionedStore(t, db)
	// A sealed partition that ended two hours ago, before those Setup made
	// for the past Retention.
	pgtest.Exec(t, db.Pool, `CREATE TABLE processed_messages_old (LIKE processed_messages INCLUDING DEFAULTS)`)
	pgtest.Exec(t, db.Pool, `DO $$ BEGIN EXECUTE format('ALTER TABLE processed_messages ATTACH PARTITION processed_messages_old FOR VALUES FROM (%L) TO (%L)',
  date_bin('1 hour', now(), '2000-01-01Z') - interval '4 hours', date_bin('1 hour', now(), '2000-01-01Z') - interval '2 hours'); END $$`)
	old := func() int {
		return pgtest.Count(t, db.Pool, `SELECT count(to_regclass('processed_messages_old'))`)
	}
	if r := run(t, "cleanup", "--database-url", db.URL); r.code != 0 || old() != 1 || strings.Contains(r.stdout, "dropped processed_messages_old") {
		t.Fatalf("cleanup with the default --retention (48h): %s; the partition that ended 2 hours ago is left: %v, want it left", r, old() == 1)
	}
	if r := run(t, "cleanup", "--dry-run", "--retention", "1h", "--database-url", db.URL); r.code != 0 || old() != 1 ||
		!strings.Contains(r.stdout, "a partitioned table: cleanup deletes no row") || !strings.Contains(r.stdout, "ended --retention (1h0m0s) ago; nothing was changed") {
		t.Fatalf("cleanup --dry-run on a partitioned table: %s; partition left: %v, want it left and the dry run to say what cleanup would do", r, old() == 1)
	}
	if r := run(t, "cleanup", "--retention", "1h", "--database-url", db.URL); r.code != 0 || old() != 0 || !strings.Contains(r.stdout, "\ndropped processed_messages_old: ") {
		t.Fatalf("cleanup --retention 1h: %s; the partition that ended 2 hours ago is gone: %v, want it dropped", r, old() == 0)
	}
	if r := run(t, "cleanup", "--retention", "500ms", "--database-url", "postgres://nobody@127.0.0.1:1/none"); r.code != 2 || !strings.Contains(r.stderr, "--retention must be at least 1s") {
		t.Errorf("cleanup --retention 500ms: %s, want a usage error (exit 2) before connecting", r)
	}
}

// partitionedStore returns a Store of consumer billing whose table Setup
// made Partitioned (Retention 1 h, 12 partitions).
func partitionedStore(t *testing.T, db *pgtest.DB) *pgdedup.Store {
	t.Helper()
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing", Layout: pgdedup.LayoutPartitioned, Retention: time.Hour, Partitions: 12})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	return store
}
