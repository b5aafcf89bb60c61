package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/cli"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// up, status, down and up again on an empty schema, checking the table each
// time by using it. The migrations are read from pgdedup.Migrations(), so adding
// one does not change this test.
func TestMigrateLifecycle(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	migrate := func(action string) result { return run(t, "migrate", action, "--database-url", db.URL) }
	files, err := fs.Glob(pgdedup.Migrations(), "*.sql")
	if err != nil || len(files) < 2 || files[0] != "00001_processed_messages.sql" {
		t.Fatalf("migrations %v, %v; want 00001_processed_messages.sql first of several", files, err)
	}
	version := func(file string) int { v, _ := strconv.Atoi(file[:5]); return v }
	last := files[len(files)-1]

	r := migrate("status")
	if r.code != 0 || !regexp.MustCompile(`00001_processed_messages.sql +pending`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, fmt.Sprintf("%d pending: run `pgdedup migrate up`", len(files))) {
		t.Errorf("status before up: %s", r)
	}
	if exists(t, db.Pool, pgdedup.VersionTable) {
		t.Errorf("status created %s; it must change nothing", pgdedup.VersionTable)
	}

	r = migrate("up")
	for _, f := range files {
		if !strings.Contains(r.stdout, "applied "+f+" in ") {
			t.Errorf("up did not apply %s", f)
		}
	}
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("now at version %d", version(last))) {
		t.Errorf("up: %s", r)
	}
	usable(t, db.Pool)
	if r = migrate("up"); r.code != 0 || r.stdout != fmt.Sprintf("already up to date at version %d\n", version(last)) {
		t.Errorf("second up: %s", r)
	}
	r = migrate("status")
	if r.code != 0 || !regexp.MustCompile(`00001_processed_messages.sql +applied +20`).MatchString(r.stdout) || !strings.HasSuffix(r.stdout, "up to date\n") {
		t.Errorf("status after up: %s", r)
	}

	// down reverts one migration at a time, the newest first, with --confirm.
	// processed_messages holds the rows usable wrote, so reverting 00001 also
	// needs --discard-data.
	for i := len(files) - 1; i >= 0; i-- {
		want := 0
		if i > 0 {
			want = version(files[i-1])
		}
		r = migrate("down")
		if r.code != 1 || !strings.Contains(r.stdout, "migrate down reverts "+files[i]) || !strings.Contains(r.stderr, "--confirm") {
			t.Errorf("down from %s without --confirm: %s", files[i], r)
		}
		// 00007's Down adds 00002's columns back, and this pgdedup needs
		// nothing that 00007 made.
		if strings.HasPrefix(files[i], "00007_") && (!strings.Contains(r.stdout, "It drops nothing.\n") || strings.Contains(r.stdout, "Afterwards")) {
			t.Errorf("down from %s: %s", files[i], r)
		}
		args := []string{"migrate", "down", "--confirm", "--database-url", db.URL}
		if i == 0 {
			if r = run(t, args...); r.code != 1 || !strings.Contains(r.stdout, "table processed_messages: ") ||
				!strings.Contains(r.stderr, "--discard-data") {
				t.Errorf("down from %s with rows, without --discard-data: %s", files[i], r)
			}
			args = append(args, "--discard-data")
		}
		r = run(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "reverted "+files[i]+" in ") || !strings.Contains(r.stdout, fmt.Sprintf("now at version %d", want)) {
			t.Errorf("down from %s: %s", files[i], r)
		}
		switch {
		case want >= 3: // this code writes key, which 00003 adds
			usable(t, db.Pool)
		case want > 0:
			if pk := primaryKey(t, db.Pool); pk != "PRIMARY KEY (consumer, message_id)" {
				t.Errorf("primary key at version %d: %s", want, pk)
			}
		}
	}
	if exists(t, db.Pool, "processed_messages") {
		t.Error("processed_messages still exists after down")
	}
	if r = migrate("down"); r.code != 0 || !strings.Contains(r.stdout, "nothing to revert") {
		t.Errorf("down with nothing applied: %s", r)
	}
	if r = migrate("up"); r.code != 0 {
		t.Errorf("up after down: %s", r)
	}
	usable(t, db.Pool)
}

// migrate down says what it drops and how many rows are there, changes
// nothing without --confirm, and nothing with rows there without
// --discard-data as well.
func TestMigrateDownGuards(t *testing.T) {
	t.Parallel()
	db := upTo(t, 4) // the cases below are those of migrations 4 to 2
	down := func(flags ...string) result {
		return run(t, append([]string{"migrate", "down", "--database-url", db.URL}, flags...)...)
	}
	pgtest.Exec(t, db.Pool, `INSERT INTO processed_offsets (consumer, topic, partition, last_offset)
SELECT 'billing', 'orders', p, 1000 FROM generate_series(0, 2) p`)
	offsetsLeft := func() bool { return exists(t, db.Pool, "processed_offsets") }

	for _, flags := range [][]string{nil, {"--discard-data"}} {
		r := down(flags...)
		if r.code != 1 || !strings.Contains(r.stdout, "migrate down reverts 00004_processed_offsets.sql (version 4; afterwards at version 3)") ||
			!strings.Contains(r.stdout, "  table processed_offsets: 3 rows\n") ||
			!strings.Contains(r.stderr, "nothing was changed: run it again with --confirm") || !offsetsLeft() {
			t.Errorf("down %q: %s", flags, r)
		}
	}
	r := down("--confirm")
	if r.code != 1 || !strings.Contains(r.stdout, "table processed_offsets: 3 rows") ||
		!strings.Contains(r.stderr, "--confirm --discard-data") || !offsetsLeft() {
		t.Errorf("down --confirm with rows: %s", r)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_offsets`); n != 3 {
		t.Errorf("%d rows left in processed_offsets, want 3", n)
	}
	r = down("--confirm", "--discard-data")
	if r.code != 0 || !strings.Contains(r.stdout, "reverted 00004_processed_offsets.sql in ") || offsetsLeft() {
		t.Errorf("down --confirm --discard-data: %s", r)
	}

	// 00003 drops key, computed from the other columns (--confirm is
	// enough), and the functions and trigger that fill it. This pgdedup's
	// claims and lookup need key, which the summary says.
	r = down()
	if r.code != 1 || !strings.Contains(r.stdout, "It drops:\n"+
		"  columns key of processed_messages: computed from consumer and message_id, nothing is lost\n"+
		"  constraint processed_messages_pkey of processed_messages, added again (redefined)\n"+
		"  trigger processed_messages_fill_key of processed_messages\n"+
		"  function pgdedup_fill_key()\n"+
		"  function pgdedup_key(text, text)\n"+
		"Afterwards this pgdedup fails where it needs version 3: every claim, Lookup and Forget (`pgdedup lookup`, `pgdedup forget`) use key.") {
		t.Errorf("down of 00003 without --confirm: %s", r)
	}
	if r = down("--confirm"); r.code != 0 || !strings.Contains(r.stdout, "reverted 00003_compact_key.sql") {
		t.Errorf("down --confirm of 00003: %s", r)
	}
	// 00002 drops the stored responses' columns. It is refused while one holds
	// a value, not because of rows without any.
	pgtest.Seed(t, db.Pool, "billing", "m-", 5, time.Hour)
	r = down("--confirm")
	if r.code != 0 || !strings.Contains(r.stdout, "columns request_fingerprint, response_status, response_headers, response_body of processed_messages: 0 rows hold a value") {
		t.Errorf("down --confirm of 00002 with message rows only: %s", r)
	}

	for _, args := range [][]string{
		{"migrate", "up", "--confirm"},
		{"migrate", "status", "--discard-data"},
		{"migrate", "sql", "--confirm"},
	} {
		if r := run(t, args...); r.code != 2 || !strings.Contains(r.stderr, "--confirm and --discard-data only go with down") {
			t.Errorf("%q: %s", args, r)
		}
	}
}

// A held column value blocks the revert of 00002 as a table's rows do.
func TestMigrateDownGuardsColumns(t *testing.T) {
	t.Parallel()
	db := upTo(t, 4)
	pgtest.Exec(t, db.Pool, `INSERT INTO processed_messages (key, consumer, message_id, expires_at, response_status)
VALUES (gen_random_uuid(), 'http', 'k1', now() + interval '1 hour', 201)`)
	for range 2 { // 00004 and 00003 drop no data
		if r := run(t, "migrate", "down", "--confirm", "--database-url", db.URL); r.code != 0 {
			t.Fatal(r)
		}
	}
	r := run(t, "migrate", "down", "--confirm", "--database-url", db.URL)
	if r.code != 1 || !strings.Contains(r.stdout, "of processed_messages: 1 rows hold a value in them") || !strings.Contains(r.stderr, "refused") {
		t.Errorf("down of 00002 with a stored response: %s", r)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE response_status = 201`); n != 1 {
		t.Errorf("the stored response is gone")
	}
}

// migrate status reads only and never waits for the migration lock. It
// answers while another process migrates (holding the lock and keeping others
// from writing pgdedup's tables), and says who that is.
func TestMigrateStatusIsReadOnlyAndLockFree(t *testing.T) {
	t.Parallel()
	db := upTo(t, 1)
	ctx := context.Background()
	// Another process is migrating. It holds the lock's row, and in an open
	// transaction no one else may write the version or the lock table.
	pgtest.Exec(t, db.Pool, `UPDATE `+pgdedup.LockTable+` SET locked = true, locked_by = 'deploy-host-77-c0ffee',
	locked_at = '2026-03-01T10:00:00Z', lease_expires_at = now() + interval '1 hour'`)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the test's end
	if _, err := tx.Exec(ctx, `LOCK TABLE `+pgdedup.VersionTable+`, `+pgdedup.LockTable+` IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	var out, errs bytes.Buffer
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second) // a hang guard, as status must not wait at all
	defer cancel()
	code := cli.Main(sctx, []string{"migrate", "status", "--database-url", db.URL}, &out, &errs)
	r := result{code, out.String(), errs.String()}
	if r.code != 0 || !regexp.MustCompile(`00001_processed_messages.sql +applied +20`).MatchString(r.stdout) ||
		!regexp.MustCompile(`00002_idempotency_responses.sql +pending +-`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, `migrating now: the migration lock is held by "deploy-host-77-c0ffee", since 2026-03-01T10:00:00Z`) {
		t.Errorf("status while another process migrates: %s", r)
	}
}

// migrate sql prints SQL that creates a working table when run as is, and with
// --down SQL that removes it. It needs no database.
func TestMigrateSQL(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	up, down := run(t, "migrate", "sql"), run(t, "migrate", "sql", "--down")
	for _, r := range []result{up, down} {
		if r.code != 0 || strings.Contains(r.stdout, "+goose") || !strings.Contains(r.stdout, "BEGIN;") || !strings.Contains(r.stdout, "COMMIT;") {
			t.Fatalf("migrate sql: %s", r)
		}
	}
	if strings.Contains(up.stdout, "DROP TABLE") || !strings.Contains(down.stdout, "DROP TABLE") {
		t.Fatalf("up and down mixed:\n%s\n---\n%s", up.stdout, down.stdout)
	}
	if err := runLikePsql(db.Pool, up.stdout); err != nil {
		t.Fatalf("running migrate sql: %v\n%s", err, up.stdout)
	}
	usable(t, db.Pool)
	r := run(t, "migrate", "up", "--database-url", db.URL)
	if r.code != 1 || !strings.Contains(r.stderr, "processed_messages was created by another migration tool") {
		t.Errorf("migrate up over a table made by migrate sql: %s", r)
	}
	if err := runLikePsql(db.Pool, down.stdout); err != nil {
		t.Fatalf("running migrate sql --down: %v\n%s", err, down.stdout)
	}
	if exists(t, db.Pool, "processed_messages") {
		t.Error("processed_messages still exists after the down SQL")
	}
}

// migrate sql --goose-dir writes files the host's goose CLI applies after its
// own migrations. Afterwards migrate up and status say that goose owns them.
func TestMigrateSQLGooseDir(t *testing.T) {
	t.Parallel()
	goose := pgtest.NewGoose(t)
	db := pgtest.NewUnmigrated(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "00001_add_users.sql"),
		[]byte("-- +goose Up\nCREATE TABLE users (id int);\n-- +goose Down\nDROP TABLE users;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	goose.Up(dir, db)

	r := run(t, "migrate", "sql", "--goose-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "wrote "+filepath.Join(dir, "00002_pgdedup_00001_processed_messages.sql")) ||
		!strings.Contains(r.stdout, "goose -dir "+dir+" postgres") {
		t.Fatalf("migrate sql --goose-dir: %s", r)
	}
	goose.Up(dir, db)
	usable(t, db.Pool)
	if r := run(t, "migrate", "sql", "--goose-dir", dir); r.code != 0 || !strings.Contains(r.stdout, "nothing to write") {
		t.Fatalf("second export: %s", r)
	}

	// up and down refuse, and status says who owns the migrations. None of
	// them creates pgdedup's tables next to goose's.
	for _, down := range [][]string{{"migrate", "down"}, {"migrate", "down", "--confirm", "--discard-data"}} {
		r = run(t, append(down, "--database-url", db.URL)...)
		if r.code != 1 || !strings.Contains(r.stderr, "processed_messages was created by another migration tool") ||
			!strings.Contains(r.stderr, "--goose-dir") || strings.Contains(r.stdout, "nothing to revert") {
			t.Errorf("%q on a database goose migrated: %s", down, r)
		}
	}
	usable(t, db.Pool)
	r = run(t, "migrate", "up", "--database-url", db.URL)
	if r.code != 1 || !strings.Contains(r.stderr, "processed_messages was created by another migration tool") || !strings.Contains(r.stderr, "--goose-dir") {
		t.Errorf("migrate up on a database goose migrated: %s", r)
	}
	r = run(t, "migrate", "status", "--database-url", db.URL)
	if r.code != 0 || !strings.Contains(r.stdout, "goose status") || strings.Contains(r.stdout, "pending") {
		t.Errorf("migrate status on a database goose migrated: %s", r)
	}
	for _, table := range []string{pgdedup.VersionTable, pgdedup.LockTable} {
		if exists(t, db.Pool, table) {
			t.Errorf("%s created on a database goose migrates", table)
		}
	}
	for _, args := range [][]string{
		{"migrate", "sql", "--goose-dir", dir, "--down"},
		{"migrate", "sql", "--after", "3"},
		{"migrate", "up", "--goose-dir", dir},
	} {
		if r := run(t, args...); r.code != 2 {
			t.Errorf("%q: %s", args, r)
		}
	}
	if r := run(t, "migrate", "sql", "--goose-dir", filepath.Join(dir, "nope")); r.code != 1 || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("missing directory: %s", r)
	}
}

func TestMigrateUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"migrate"},
		{"migrate", "sideways"},
		{"migrate", "up", "now"},
		{"migrate", "up", "--down"},
	} {
		if r := run(t, args...); r.code != 2 || !strings.Contains(r.stderr, "pgdedup migrate --help") {
			t.Errorf("%q: %s", args, r)
		}
	}
}

// migrate up waits for another process's migration lock, saying whose it is,
// and when it gives up (here when its context ends) says it again.
func TestMigrateUpNamesTheLockHolder(t *testing.T) {
	t.Parallel()
	db := upTo(t, 1)
	pgtest.Exec(t, db.Pool, `UPDATE `+pgdedup.LockTable+` SET locked = true, locked_by = 'deploy-host-77-c0ffee',
	locked_at = '2026-03-01T10:00:00Z', lease_expires_at = now() + interval '1 hour'`)
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // how long this run is willing to wait
	defer cancel()
	code := cli.Main(ctx, []string{"migrate", "up", "--database-url", db.URL}, &out, &errs)
	r := result{code, out.String(), errs.String()}
	holder := `held by "deploy-host-77-c0ffee", since 2026-03-01T10:00:00Z`
	if r.code != 1 || !strings.HasPrefix(r.stderr, "pgdedup migrate: waiting for the migration lock (up to 10 minutes; Ctrl-C to stop): "+holder) ||
		strings.Count(r.stderr, holder) != 2 || !strings.Contains(r.stderr, "context deadline exceeded") {
		t.Errorf("migrate up while another process holds the lock: %s", r)
	}
}

// upTo returns a new schema migrated up to version.
func upTo(t *testing.T, version int64) *pgtest.DB {
	t.Helper()
	db := pgtest.NewUnmigrated(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(context.Background(), version); err != nil {
		t.Fatal(err)
	}
	return db
}

// runLikePsql runs script one statement at a time on one connection, as psql
// does. Statements end with a semicolon at the end of a line outside $$
// quotes. Migration 00003 must run outside a transaction block, so the script
// cannot go as one multi-statement query.
func runLikePsql(pool *pgxpool.Pool, script string) error {
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var stmt strings.Builder
	for line := range strings.Lines(script) {
		stmt.WriteString(line)
		if strings.Count(stmt.String(), "$$")%2 == 0 && strings.HasSuffix(strings.TrimSpace(line), ";") {
			if _, err := conn.Exec(ctx, stmt.String()); err != nil {
				return fmt.Errorf("%w in\n%s", err, stmt.String())
			}
			stmt.Reset()
		}
	}
	return nil
}

func primaryKey(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var pk string
	err := pool.QueryRow(context.Background(),
		`SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'processed_messages'::regclass AND contype = 'p'`).Scan(&pk)
	if err != nil {
		t.Fatal(err)
	}
	return pk
}

func exists(t *testing.T, pool *pgxpool.Pool, table string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// usable checks that processed_messages works. An ID processed once is a
// duplicate the second time.
func usable(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	id := fmt.Sprint("m-", time.Now().UnixNano()) // new each call, as the table may hold earlier IDs
	for i, want := range []bool{true, false} {
		if ok, err := store.Process(context.Background(), id, noop); ok != want || err != nil {
			t.Fatalf("Process #%d = %v, %v; want %v", i+1, ok, err, want)
		}
	}
}
