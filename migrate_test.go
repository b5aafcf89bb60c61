package pgdedup_test

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	// The host service has its own goose table; pgdedup must leave it alone.
	mustExec(t, db.Pool, `CREATE TABLE goose_db_version (id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now())`)
	mustExec(t, db.Pool, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (0, true), (20240101, true)`)

	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	for range 2 { // idempotent
		if err := pgdedup.Migrate(ctx, sqlDB); err != nil {
			t.Fatal(err)
		}
	}
	if err := sqlDB.PingContext(ctx); err != nil {
		t.Fatalf("Migrate closed the caller's *sql.DB: %v", err)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM goose_db_version`); n != 2 {
		t.Fatalf("host goose_db_version has %d rows, want its 2", n)
	}
	// The table lands in the connection's search_path, with its key and index.
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename IN ('processed_messages', 'pgdedup_db_version')`, db.Schema); n != 2 {
		t.Fatalf("%d of processed_messages, pgdedup_db_version in schema %s, want 2", n, db.Schema)
	}
	// Only the catalog rows of this schema's table: pg_indexes would call
	// pg_get_indexdef on the indexes of other tests' schemas too, and fail
	// when one is dropped meanwhile.
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = to_regclass($1) AND i.indnatts = 1 AND a.attname = 'expires_at'`, db.Schema+".processed_messages"); n != 1 {
		t.Fatalf("no index on expires_at")
	}
	var pk string
	err := db.Pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'processed_messages'::regclass AND contype = 'p'`).Scan(&pk)
	if err != nil || pk != "PRIMARY KEY (key)" {
		t.Fatalf("primary key %q, %v", pk, err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id) VALUES ('c', 'm')`); err == nil {
		t.Fatal("expires_at is not required")
	}
}

// The files work with plain goose too, as a team running its own goose would
// use them: default version table, files copied from Migrations.
// A *sql.DB of one connection would wait forever inside goose (its run holds
// the connection its lock needs): Migrate says so before it starts.
func TestMigrateRefusesOneConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx, cancel := context.WithTimeout(ctxT(t), 30*time.Second)
	defer cancel()
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(1)
	err := pgdedup.Migrate(ctx, sqlDB)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "SetMaxOpenConns(1)") {
		t.Fatalf("Migrate on a *sql.DB of one connection: %v (context: %v); want the two-connections error at once", err, ctx.Err())
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, db.Schema); n != 0 {
		t.Errorf("Migrate made %d tables although it refused", n)
	}
	if _, err := pgdedup.NewMigrationProvider(sqlDB); err == nil || !strings.Contains(err.Error(), "SetMaxOpenConns(1)") {
		t.Errorf("NewMigrationProvider on a *sql.DB of one connection: %v; want the two-connections error", err)
	}
	sqlDB.SetMaxOpenConns(2)
	if err := pgdedup.Migrate(ctx, sqlDB); err != nil {
		t.Fatalf("Migrate with two connections: %v", err)
	}
}

func TestMigrationsWithPlainGoose(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	names, err := fs.Glob(pgdedup.Migrations(), "*.sql")
	if err != nil || len(names) == 0 || !strings.HasPrefix(names[0], "00001_") {
		t.Fatalf("Migrations holds %v, %v", names, err)
	}
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, pgdedup.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatal(n)
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'processed_messages'`, db.Schema); n != 0 {
		t.Fatal("down migration left processed_messages")
	}
}

// A host whose own goose applied pgdedup's files, and which then calls
// Migrate, is told so and nothing changes; a processed_messages elsewhere on
// the search_path is not mistaken for one.
func TestMigrateRefusesATableAnotherToolMigrates(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	host, err := goose.NewProvider(goose.DialectPostgres, sqlDB, pgdedup.Migrations()) // the host's goose_db_version
	if err != nil {
		t.Fatal(err)
	}
	if _, err := host.Up(ctx); err != nil {
		t.Fatal(err)
	}
	err = pgdedup.Migrate(ctx, sqlDB)
	if !errors.Is(err, pgdedup.ErrMigratedByAnotherTool) || !strings.Contains(err.Error(), "pgdedup migrate sql --goose-dir") {
		t.Fatalf("Migrate after the host's goose: %v", err)
	}
	if err := pgdedup.CheckMigrationOwner(ctx, sqlDB); !errors.Is(err, pgdedup.ErrMigratedByAnotherTool) {
		t.Fatalf("CheckMigrationOwner after the host's goose: %v", err)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = $2`, db.Schema, pgdedup.VersionTable); n != 0 {
		t.Fatalf("Migrate created %s", pgdedup.VersionTable)
	}
	// A pgdedup_db_version with no migration applied, as `pgdedup migrate up`
	// before this check left it, changes nothing either.
	mustExec(t, db.Pool, `CREATE TABLE `+pgdedup.VersionTable+` (id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now())`)
	mustExec(t, db.Pool, `INSERT INTO `+pgdedup.VersionTable+` (version_id, is_applied) VALUES (0, true)`)
	if err := pgdedup.CheckMigrationOwner(ctx, sqlDB); !errors.Is(err, pgdedup.ErrMigratedByAnotherTool) {
		t.Fatalf("CheckMigrationOwner with an empty %s: %v", pgdedup.VersionTable, err)
	}
	if err := pgdedup.Migrate(ctx, sqlDB); !errors.Is(err, pgdedup.ErrMigratedByAnotherTool) {
		t.Fatalf("Migrate with an empty %s: %v", pgdedup.VersionTable, err)
	}

	// A schema first on the search_path, with processed_messages only in the
	// next one: Migrate creates its own in the first.
	other := pgtest.NewUnmigrated(t)
	url, err := pgtest.WithSearchPath(db.URL, other.Schema+","+db.Schema)
	if pgtest.PgBouncer() { // which refuses a search_path startup parameter
		url = other.URL
		mustExec(t, db.Pool, `ALTER ROLE `+other.Schema+` SET search_path = `+other.Schema+`, `+db.Schema)
	}
	if err != nil {
		t.Fatal(err)
	}
	both, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer both.Close()
	if err := pgdedup.CheckMigrationOwner(ctx, both); err != nil {
		t.Fatalf("CheckMigrationOwner with processed_messages further down the search_path: %v", err)
	}
	if err := pgdedup.Migrate(ctx, both); err != nil {
		t.Fatalf("Migrate with processed_messages further down the search_path: %v", err)
	}
	if n := pgtest.Count(t, other.Pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename IN ('processed_messages', $2)`, other.Schema, pgdedup.VersionTable); n != 2 {
		t.Fatalf("%d of processed_messages, %s in the first schema, want 2", n, pgdedup.VersionTable)
	}
}

// A search_path naming only a schema that does not exist leaves no schema to
// create the tables in: Migrate says so, before creating anything.
func TestMigrateSearchPathWithoutSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	missing := db.Schema + "_missing"
	url, err := pgtest.WithSearchPath(db.URL, missing)
	if err != nil {
		t.Fatal(err)
	}
	if pgtest.PgBouncer() {
		// PgBouncer refuses a search_path startup parameter, and keeps the
		// sessions of the test's role open: a role of its own, whose first
		// session starts with the search_path.
		var role string
		role, url = db.NewRole(t)
		mustExec(t, db.Pool, `ALTER ROLE `+role+` SET search_path = `+missing)
	}
	sqlDB, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	err = pgdedup.Migrate(ctx, sqlDB)
	if err == nil || !strings.Contains(err.Error(), "no schema of the search_path ("+missing+") exists") ||
		strings.Contains(err.Error(), "22004") {
		t.Fatalf("Migrate with search_path %s: %v", missing, err)
	}
	if err := pgdedup.CheckMigrationOwner(ctx, sqlDB); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("CheckMigrationOwner with search_path %s: %v", missing, err)
	}
}

// While another process holds the migration lock, Migrate waits to apply
// what is pending; when it gives up (here when ctx ends), its error says who
// holds the lock and since when, as the lock's row records it.
func TestMigrateNamesTheLockHolder(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	if holder, err := pgdedup.MigrationLockHolder(ctxT(t), sqlDB); err != nil || holder != "" {
		t.Fatalf("lock holder before any migration: %q, %v", holder, err)
	}
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctxT(t), 1); err != nil { // the rest is pending
		t.Fatal(err)
	}
	if holder, err := pgdedup.MigrationLockHolder(ctxT(t), sqlDB); err != nil || holder != "" {
		t.Fatalf("lock holder after a migration: %q, %v", holder, err)
	}
	// Another migrator's row, as goose's table locker writes it; its lease
	// is renewed while it runs, so it does not lapse during the test.
	mustExec(t, db.Pool, `UPDATE `+pgdedup.LockTable+` SET locked = true, locked_by = 'deploy-7-host-4242-beef',
	locked_at = '2026-03-01T10:00:00Z', lease_expires_at = now() + interval '1 hour', updated_at = now()`)

	ctx, cancel := context.WithTimeout(ctxT(t), 2*time.Second) // how long this caller is willing to wait
	defer cancel()
	err = pgdedup.Migrate(ctx, sqlDB)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Migrate while the lock is held: %v, want the context's deadline", err)
	}
	for _, want := range []string{`held by "deploy-7-host-4242-beef", since 2026-03-01T10:00:00Z`, pgdedup.LockTable} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Migrate's error lacks %q: %v", want, err)
		}
	}
	if strings.Count(err.Error(), "pgdedup:") != 1 {
		t.Errorf("one pgdedup: prefix, not %d: %v", strings.Count(err.Error(), "pgdedup:"), err)
	}
	holder, err := pgdedup.MigrationLockHolder(ctxT(t), sqlDB)
	if err != nil || !strings.HasPrefix(holder, `"deploy-7-host-4242-beef", since 2026-03-01T10:00:00Z (lease until `) {
		t.Errorf("MigrationLockHolder = %q, %v", holder, err)
	}
}

// The runtime role may call Migrate at startup with nothing more than SELECT
// on the version table: on an up-to-date schema it is a check that changes
// nothing; with a migration pending it fails at once (the owner must apply
// it) and changes nothing either. Without that SELECT it fails saying which
// table.
func TestMigrateAsTheRuntimeRole(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	owner := stdlib.OpenDBFromPool(db.Pool)
	defer owner.Close()
	p, err := pgdedup.NewMigrationProvider(owner)
	if err != nil {
		t.Fatal(err)
	}
	sources := p.ListSources()
	if _, err := p.UpTo(ctx, sources[len(sources)-2].Version); err != nil { // the newest one pending
		t.Fatal(err)
	}
	role, url := db.NewRole(t)
	runtime, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.Close()
	mustExec(t, db.Pool, `GRANT SELECT, INSERT, DELETE ON processed_messages TO `+role)

	if err := pgdedup.Migrate(ctx, runtime); err == nil || !strings.Contains(err.Error(), "permission denied for table "+pgdedup.VersionTable) {
		t.Errorf("Migrate as a role without SELECT on %s: %v", pgdedup.VersionTable, err)
	}
	mustExec(t, db.Pool, `GRANT SELECT ON `+pgdedup.VersionTable+` TO `+role)
	version := func() int64 {
		v, err := p.GetDBVersion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := version()
	// At once, not after 10 minutes of retrying what waiting cannot fix.
	if err := pgdedup.Migrate(ctx, runtime); err == nil || !strings.Contains(err.Error(), "permission denied for table "+pgdedup.LockTable) {
		t.Errorf("Migrate as the runtime role, a migration pending: %v", err)
	}
	if v := version(); v != before {
		t.Errorf("the runtime role's Migrate moved the version from %d to %d", before, v)
	}
	if err := pgdedup.Migrate(ctx, owner); err != nil {
		t.Fatal(err)
	}
	if err := pgdedup.Migrate(ctx, runtime); err != nil {
		t.Errorf("Migrate as the runtime role on an up-to-date schema: %v", err)
	}
}

// legacyColumns are the columns of migration 00002, which 00007 drops.
var legacyColumns = []string{"request_fingerprint", "response_status", "response_headers", "response_body"}

// columnsLeft counts the columns of 00002 on processed_messages and on each
// of its partitions.
func columnsLeft(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	return pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_attribute
WHERE attrelid IN (SELECT 'processed_messages'::regclass UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = 'processed_messages'::regclass)
  AND attnum > 0 AND NOT attisdropped AND attname = ANY($1::text[])`, legacyColumns)
}

// migrationCheckLeft says whether 00007's check is on processed_messages.
func migrationCheckLeft(t *testing.T, db *pgtest.DB) bool {
	t.Helper()
	return pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_constraint
WHERE conrelid = 'processed_messages'::regclass AND conname = 'processed_messages_00002_unused'`) > 0
}

// Migration 00007 drops the columns of 00002. It refuses, changing nothing,
// while a row holds an unexpired answer in them, and says until when. Once
// that answer has expired it drops them, and the rows stay. Its Down adds
// them back empty, and Up runs again.
func TestMigration00007WaitsForLegacyAnswersToExpire(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	// An HTTP key answered before 00006 and still live, another one expired
	// but not yet deleted, and a message ID.
	mustExec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id, expires_at, request_fingerprint, response_status, response_headers, response_body)
VALUES ('http', 'live', '2999-01-02 03:04:05+00', '\x01', 201, '{}', 'ok'),
       ('http', 'expired', now() - interval '1 second', '\x02', 201, '{}', 'ok')`)
	mustExec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id, expires_at) VALUES ('billing', 'm1', now() + interval '1 hour')`)

	_, err = p.UpTo(ctx, 7)
	if err == nil || !strings.Contains(err.Error(), "(SQLSTATE PGD06)") ||
		!strings.Contains(err.Error(), "holds 1 unexpired answers in the columns of migration 00002, the last expiring at 2999-01-02T03:04:05Z") ||
		!strings.Contains(err.Error(), "Nothing was changed") {
		t.Fatalf("00007 with a live answer in the columns of 00002: %v", err)
	}
	if v, err := p.GetDBVersion(ctx); err != nil || v != 6 {
		t.Fatalf("version after the refusal: %d, %v; want 6", v, err)
	}
	if n := columnsLeft(t, db); n != len(legacyColumns) || migrationCheckLeft(t, db) {
		t.Fatalf("after the refusal: %d columns of 00002, check left %v; want all four and no check", n, migrationCheckLeft(t, db))
	}

	mustExec(t, db.Pool, `UPDATE processed_messages SET expires_at = now() - interval '1 second' WHERE message_id = 'live'`)
	if _, err := p.UpTo(ctx, 7); err != nil {
		t.Fatalf("00007 once the answer expired: %v", err)
	}
	if n := columnsLeft(t, db); n != 0 || migrationCheckLeft(t, db) {
		t.Fatalf("after 00007: %d columns of 00002 left, check left %v", n, migrationCheckLeft(t, db))
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages`); n != 3 {
		t.Fatalf("%d rows after 00007, want 3", n)
	}

	// Down adds the columns back, empty, and Up drops them again.
	if _, err := p.Down(ctx); err != nil {
		t.Fatalf("down of 00007: %v", err)
	}
	if n := columnsLeft(t, db); n != len(legacyColumns) {
		t.Fatalf("after the down of 00007: %d columns of 00002, want 4", n)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE response_status IS NOT NULL OR response_body IS NOT NULL`); n != 0 {
		t.Fatalf("%d rows hold a value in the columns added back", n)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if n := columnsLeft(t, db); n != 0 {
		t.Fatalf("after up again: %d columns of 00002 left", n)
	}
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"m1": false, "m2": true} {
		if got, err := store.Process(ctx, id, func(context.Context, pgx.Tx) error { return nil }); err != nil || got != want {
			t.Errorf("Process(%s) after 00007 = %v, %v; want %v", id, got, err, want)
		}
	}
}

// An answer written into the columns of 00002 while 00007 runs, by a
// transaction that was open when it started, is seen. The migration's check
// waits for that transaction, the second look finds the answer, and the
// migration drops its check again and refuses.
func TestMigration00007SeesAnswersWrittenWhileItRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	// A release before 00006, in the middle of storing an answer.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, expires_at, request_fingerprint, response_status)
VALUES ('http', 'late', '2999-01-02 03:04:05+00', '\x01', 201)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := p.UpTo(ctx, 7); done <- err }()
	// The migration is past its first look once it tries to add its check.
	// Adding it waits for this transaction's lock.
	for pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_locks
WHERE relation = 'processed_messages'::regclass AND mode = 'AccessExclusiveLock' AND NOT granted`) == 0 {
		select {
		case err := <-done:
			t.Fatalf("00007 ended before adding its check: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if err == nil || !strings.Contains(err.Error(), "(SQLSTATE PGD06)") ||
		!strings.Contains(err.Error(), "holds 1 unexpired answers in the columns of migration 00002, the last expiring at 2999-01-02T03:04:05Z") ||
		!strings.Contains(err.Error(), "while this migration ran") {
		t.Fatalf("00007 with an answer written while it ran: %v", err)
	}
	if v, err := p.GetDBVersion(ctx); err != nil || v != 6 {
		t.Fatalf("version after the refusal: %d, %v; want 6", v, err)
	}
	if n := columnsLeft(t, db); n != len(legacyColumns) || migrationCheckLeft(t, db) {
		t.Fatalf("after the refusal: %d columns of 00002, check left %v; want all four and no check", n, migrationCheckLeft(t, db))
	}
}

// On the Partitioned layout the columns of 00002 are on every partition.
// 00007 looks for answers through the partitioned table, refuses while one
// is live, and then drops the columns from the table and every partition.
func TestMigration00007OnAPartitionedTable(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{Retention: time.Hour})
	ctx := ctxT(t)
	sqlDB := stdlib.OpenDBFromPool(b.pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 6); err != nil {
		t.Fatalf("down to 6 on a partitioned table: %v", err)
	}
	if n := columnsLeft(t, b.db); n < 2*len(legacyColumns) {
		t.Fatalf("%d columns of 00002 on the table and its partitions after the down of 00007", n)
	}
	mustExec(t, b.pool, `INSERT INTO processed_messages (key, consumer, message_id, expires_at, response_status)
VALUES (pgdedup_key('http', 'live'), 'http', 'live', now() + interval '1 hour', 201)`)
	if _, err := p.Up(ctx); err == nil || !strings.Contains(err.Error(), "holds 1 unexpired answers in the columns of migration 00002") {
		t.Fatalf("00007 on a partitioned table with a live answer: %v", err)
	}
	if migrationCheckLeft(t, b.db) {
		t.Fatal("00007 left its check after refusing")
	}
	mustExec(t, b.pool, `UPDATE processed_messages SET expires_at = now() - interval '1 second' WHERE message_id = 'live'`)
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("00007 on a partitioned table: %v", err)
	}
	if n := columnsLeft(t, b.db); n != 0 {
		t.Fatalf("%d columns of 00002 left on the table and its partitions", n)
	}
	for i, want := range []bool{true, false} {
		if got, err := b.store.Process(ctx, "m1", charge("o1")); err != nil || got != want {
			t.Fatalf("Process #%d after 00007: %v, %v; want %v", i+1, got, err, want)
		}
	}
}
