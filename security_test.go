package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// runtimeGrants are the README's GRANTs for a service's runtime role, which
// never runs migrations: SELECT, INSERT and DELETE, nothing more.
var runtimeGrants = []string{
	`GRANT SELECT, INSERT, DELETE ON processed_messages TO %s`,
}

// A role holding only the README's GRANTs (and the business table's own) runs
// everything a service does at runtime: Process, ProcessBatch, Claim,
// ClaimBatch, Cleanup, with LockTimeout set. It cannot change the schema or the
// recorded IDs.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pool, role := rolePool(t, b, runtimeGrants...)
	var user string
	var super bool
	if err := pool.QueryRow(ctx, `SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &super); err != nil {
		t.Fatal(err)
	}
	if user != role || super {
		t.Fatalf("connected as %q (superuser %v), want the unprivileged %q", user, super, role)
	}

	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		processed, err := store.Process(ctx, "m1", charge("o1"))
		if err != nil || processed != want {
			t.Fatalf("Process #%d: processed=%v err=%v, want %v, nil", i+1, processed, err, want)
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if claimed, err := store.Claim(ctx, tx, "m2"); err != nil || !claimed {
			t.Errorf("Claim m2: claimed=%v err=%v, want true, nil", claimed, err)
		}
		fresh, err := store.ClaimBatch(ctx, tx, []string{"m1", "m3", "m2", "m4", "m3"})
		if err != nil || !slices.Equal(fresh, []string{"m3", "m4"}) {
			t.Errorf("ClaimBatch: fresh=%q err=%v, want [m3 m4], nil", fresh, err)
		}
		return charge("o2")(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := store.ProcessBatch(ctx, []string{"m4", "m5"}, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
		return charge("o5")(ctx, tx)
	})
	if err != nil || !slices.Equal(fresh, []string{"m5"}) {
		t.Fatalf("ProcessBatch: fresh=%q err=%v, want [m5], nil", fresh, err)
	}

	// Rows of another consumer that have already expired; Cleanup deletes
	// exactly those.
	short, err := pgdedup.New(pool, pgdedup.Config{Consumer: "short"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := short.ProcessBatch(ctx, []string{"e1", "e2"}, func(context.Context, pgx.Tx, []string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	expire(t, b, "short")
	if n, err := store.Cleanup(ctx); err != nil || n != 2 {
		t.Fatalf("Cleanup: deleted=%d err=%v, want 2, nil", n, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'billing'`); n != 5 {
		t.Fatalf("%d billing IDs recorded, want 5 (m1..m5)", n)
	}
	if got := chargesPerOrder(t, b.pool); got["o1"] != 1 || got["o2"] != 1 || got["o5"] != 1 || len(got) != 3 {
		t.Fatalf("charges per order %v, want o1, o2, o5 once each", got)
	}

	for _, sql := range []string{
		`CREATE TABLE evil (id int)`,
		`CREATE INDEX evil ON processed_messages (processed_at)`,
		`ALTER TABLE processed_messages ADD COLUMN evil int`,
		`DROP TABLE processed_messages`,
		`TRUNCATE processed_messages`,
		`UPDATE processed_messages SET message_id = 'forged'`,
		`UPDATE processed_messages SET expires_at = 'infinity'`,
		`CREATE TABLE public.evil (id int)`,
	} {
		_, err := pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		// Citus refuses to change a distribution column before checking privileges.
		refused := errors.As(err, &pgErr) && (pgErr.Code == "42501" ||
			pgErr.Code == "0A000" && pgtest.CitusColumn() == "message_id" && strings.Contains(sql, "SET message_id"))
		if !refused {
			t.Errorf("%s as the runtime role: err=%v, want insufficient_privilege (42501)", sql, err)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE message_id = 'forged'`); n != 0 {
		t.Fatalf("runtime role rewrote %d message IDs", n)
	}
}

// A consumer role without DELETE (cleanup left to another role) still
// processes messages, and cannot erase what it recorded: a compromised consumer
// cannot make a processed message new again.
func TestConsumerRoleWithoutDeleteCannotForget(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pool, _ := rolePool(t, b, `GRANT SELECT, INSERT ON processed_messages TO %s`)
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := store.ProcessBatch(ctx, []string{"m1", "m2"}, func(ctx context.Context, tx pgx.Tx, _ []string) error {
		return charge("o1")(ctx, tx)
	})
	if err != nil || len(fresh) != 2 {
		t.Fatalf("ProcessBatch: fresh=%q err=%v, want [m1 m2], nil", fresh, err)
	}
	expire(t, b, "billing")
	for _, sql := range []string{`DELETE FROM processed_messages`, `TRUNCATE processed_messages`} {
		_, err := pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s: err=%v, want insufficient_privilege (42501)", sql, err)
		}
	}
	if _, err := store.Cleanup(ctx); err == nil {
		t.Error("Cleanup without DELETE succeeded")
	}
	if !recorded(t, b.pool, "billing", "m1") || !recorded(t, b.pool, "billing", "m2") {
		t.Fatal("the consumer role erased recorded IDs")
	}
	if processed, err := store.Process(ctx, "m1", charge("o1")); err != nil || processed {
		t.Fatalf("m1 again: processed=%v err=%v, want a duplicate", processed, err)
	}
}

// plantShadows has a new unprivileged role, allowed to create objects in the
// test's schema (as every role could in public before PostgreSQL 15), plant
// functions and operators that shadow built-ins called with inexact argument
// types: convert_to(text, text) (the built-in takes a name), = (oid,
// regclass) and * (double precision, numeric). Each records in
// planted_calls that it ran, and as whom, then does what the built-in does.
// It returns a query counting those calls.
func plantShadows(t *testing.T, db *pgtest.DB) (role, calls string) {
	t.Helper()
	role, url := db.NewRole(t)
	pgtest.Exec(t, db.Pool, `CREATE TABLE planted_calls (fn text, as_user text)`)
	pgtest.Exec(t, db.Pool, `GRANT INSERT ON planted_calls TO PUBLIC`)
	pgtest.Exec(t, db.Pool, `GRANT CREATE ON SCHEMA `+db.Schema+` TO `+role)
	attacker := pgtest.Pool(t, url, 1)
	log := `INSERT INTO ` + db.Schema + `.planted_calls VALUES ('%s', current_user);`
	for _, sql := range []string{
		`CREATE FUNCTION convert_to(s text, enc text) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN ` + fmt.Sprintf(log, "convert_to") + ` RETURN pg_catalog.convert_to(s, enc::pg_catalog.name); END $$`,
		`CREATE FUNCTION planted_oid_eq(a oid, b regclass) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN ` + fmt.Sprintf(log, "=") + ` RETURN a OPERATOR(pg_catalog.=) b::pg_catalog.oid; END $$`,
		`CREATE OPERATOR = (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = planted_oid_eq)`,
		`CREATE FUNCTION planted_mul(a double precision, b numeric) RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN ` + fmt.Sprintf(log, "*") + ` RETURN a OPERATOR(pg_catalog.*) b::pg_catalog.float8; END $$`,
		`CREATE OPERATOR * (LEFTARG = double precision, RIGHTARG = numeric, FUNCTION = planted_mul)`,
	} {
		if _, err := attacker.Exec(context.Background(), sql); err != nil {
			t.Fatalf("plant as %s: %v\n%s", role, err, sql)
		}
	}
	return role, `SELECT count(*) FROM planted_calls`
}

// A role that may create objects in a schema on the search_path plants
// overloads of the built-ins migration 00003 calls, in a table at version 2
// that holds rows. The upgrade, run by the table's owner, backfills the keys
// without running any of them, and the keys are those of pgdedup.Key.
func TestUpgradeNeverRunsPlantedOverloads(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id, expires_at)
SELECT 'billing', 'm' || g, now() + interval '1 hour' FROM generate_series(1, 10) g`)
	_, calls := plantShadows(t, db)

	if err := pgdedup.Migrate(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, db.Pool, calls); n != 0 {
		t.Fatalf("the migration ran planted code %d times", n)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE key IS NULL`); n != 0 {
		t.Fatalf("%d rows left without a key", n)
	}
	for i := 1; i <= 10; i++ {
		id := fmt.Sprintf("m%d", i)
		if !recordedByKey(t, db.Pool, "billing", id) {
			t.Fatalf("%s: its key is not pgdedup.Key's", id)
		}
	}
}

// After the migrations, rows inserted without key (older code, an operator, an
// import) get it from the trigger, and pgdedup_key() computes it, without
// running overloads planted in a schema on the inserting role's search_path.
func TestKeyFunctionsNeverRunPlantedOverloads(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	_, calls := plantShadows(t, db)
	inserter, url := db.NewRole(t)
	pgtest.Exec(t, db.Pool, `GRANT SELECT, INSERT ON processed_messages TO `+inserter)
	pool := pgtest.Pool(t, url, 1)
	if _, err := pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, expires_at) VALUES ('billing', 'raw-1', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	var key string
	if err := pool.QueryRow(ctx, `SELECT pgdedup_key('billing', 'raw-2')::text`).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, db.Pool, calls); n != 0 {
		t.Fatalf("the key functions ran planted code %d times", n)
	}
	if !recordedByKey(t, db.Pool, "billing", "raw-1") {
		t.Fatal("the trigger's key is not pgdedup.Key's")
	}
	if want := pgdedup.Key("billing", "raw-2"); key != want {
		t.Fatalf("pgdedup_key = %s, want %s", key, want)
	}
}

// Every function the migrations create (the trigger function included) fixes
// its search_path, so no function or operator planted in a schema on a
// caller's search_path can run inside it. A future migration that adds one
// without it fails here.
func TestMigrationFunctionsFixTheirSearchPath(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rows, err := db.Pool.Query(ctxT(t), `SELECT p.proname, coalesce(array_to_string(p.proconfig, ';'), '') FROM pg_proc p
WHERE p.pronamespace = $1::regnamespace ORDER BY 1`, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	var name, config string
	n := 0
	_, err = pgx.ForEachRow(rows, []any{&name, &config}, func() error {
		n++
		if !slices.Contains(strings.Split(config, ";"), "search_path=pg_catalog, pg_temp") {
			t.Errorf("function %s: proconfig %q, want search_path=pg_catalog, pg_temp", name, config)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no function found in the migrated schema")
	}
}

// recordedByKey reports whether (consumer, id) is recorded under the key
// pgdedup.Key gives it.
func recordedByKey(t *testing.T, pool *pgxpool.Pool, consumer, id string) bool {
	t.Helper()
	return pgtest.Count(t, pool, `SELECT count(*) FROM processed_messages WHERE key = $1::uuid AND consumer = $2 AND message_id = $3`,
		pgdedup.Key(consumer, id), consumer, id) == 1
}

// A database that applied migration 00003 as first released has key functions
// that resolve built-ins through the caller's search_path. Migration 00005
// replaces them: afterwards a raw insert runs no planted overload.
func TestMigration00005ReplacesUnsafeKeyFunctions(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 4); err != nil {
		t.Fatal(err)
	}
	// The functions as the first release of 00003 created them.
	pgtest.Exec(t, db.Pool, `CREATE OR REPLACE FUNCTION pgdedup_key(consumer text, message_id text) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT encode(substring(sha256(convert_to(consumer, 'UTF8') || decode('00', 'hex') || convert_to(message_id, 'UTF8')) FROM 1 FOR 16), 'hex')::uuid
$$`)
	pgtest.Exec(t, db.Pool, `CREATE OR REPLACE FUNCTION pgdedup_fill_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.key := encode(substring(sha256(convert_to(NEW.consumer, 'UTF8') || decode('00', 'hex') || convert_to(NEW.message_id, 'UTF8')) FROM 1 FOR 16), 'hex')::uuid;
    RETURN NEW;
END $$`)
	_, calls := plantShadows(t, db)
	if err := pgdedup.Migrate(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id, expires_at) VALUES ('billing', 'raw-1', now() + interval '1 hour')`)
	if n := pgtest.Count(t, db.Pool, calls); n != 0 {
		t.Fatalf("planted code ran %d times after migration 00005", n)
	}
	if !recordedByKey(t, db.Pool, "billing", "raw-1") {
		t.Fatal("the trigger's key is not pgdedup.Key's")
	}
}

// A role with CREATE on the schema plants the key functions of migration
// 00003 before it runs. Migrate, run by a superuser (whose CREATE OR REPLACE
// would keep the planter as their owner), refuses them, naming the function
// and its owner, before any trigger calls them.
func TestMigrationRefusesPlantedKeyFunctions(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	ctx := ctxT(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := pgdedup.NewMigrationProvider(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	role, url := db.NewRole(t)
	pgtest.Exec(t, db.Pool, `GRANT CREATE ON SCHEMA `+db.Schema+` TO `+role)
	attacker := pgtest.Pool(t, url, 1)
	pgtest.Exec(t, attacker, `CREATE FUNCTION pgdedup_fill_key() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
	err = pgdedup.Migrate(ctx, sqlDB)
	if err == nil || !strings.Contains(err.Error(), "pgdedup_fill_key") || !strings.Contains(err.Error(), role) {
		t.Fatalf("Migrate with a planted pgdedup_fill_key: %v, want an error naming it and its owner %s", err, role)
	}
	if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid
WHERE pg_get_userbyid(p.proowner) = $1`, role); n != 0 {
		t.Fatalf("%d triggers call a function %s owns", n, role)
	}
}
