package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// The attacker of issue 26 §1–§3: a role with CREATE on the dedup table's
// schema and no privilege on processed_messages. It plants objects under the
// names pgdedup would create. pgdedup refuses each, naming it and its owner,
// and never uses it.

// plantingRole returns a role that may create objects in b's schema and
// nothing more, and a pool logged in as it.
func plantingRole(t *testing.T, b *bundle) (string, *pgxpool.Pool) {
	t.Helper()
	role, url := b.db.NewRole(t)
	mustExec(t, b.pool, `GRANT CREATE ON SCHEMA `+b.db.Schema+` TO `+role)
	return role, pgtest.Pool(t, url, 2)
}

// partitionNameAt is the name pgdedup gives the partition of processed_messages
// starting at from.
func partitionNameAt(from time.Time) string {
	return "processed_messages_p" + from.UTC().Format("20060102t150405")
}

// gained reports what role may do on processed_messages or as a superuser.
func gained(t *testing.T, b *bundle, role string) string {
	t.Helper()
	var got string
	err := b.pool.QueryRow(context.Background(), `SELECT concat_ws(' ',
CASE WHEN has_table_privilege($1, 'processed_messages', 'SELECT') THEN 'SELECT' END,
CASE WHEN has_table_privilege($1, 'processed_messages', 'DELETE') THEN 'DELETE' END,
CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = $1) THEN 'SUPERUSER' END)`, role).Scan(&got)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// refusedNaming fails t unless err names object and owner.
func refusedNaming(t *testing.T, what string, err error, object, owner string) {
	t.Helper()
	t.Logf("%s: %v", what, err)
	if err == nil || !strings.Contains(err.Error(), object) || !strings.Contains(err.Error(), owner) {
		t.Fatalf("%s: err=%v, want an error naming %s and its owner %s", what, err, object, owner)
	}
}

// §1: a pgdedup_partitions planted before Setup, with a trigger that grants
// the attacker whatever the session running Setup may grant.
func TestSetupRefusesPlantedPartitionsTable(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: 20 * time.Second, Partitions: 10})
	ctx := ctxT(t)
	role, attacker := plantingRole(t, b)
	for _, sql := range []string{
		`CREATE TABLE pgdedup_partitions (parent regclass PRIMARY KEY, span interval NOT NULL, sealed timestamptz NOT NULL)`,
		`GRANT ALL ON pgdedup_partitions TO PUBLIC`,
		`CREATE FUNCTION planted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT SELECT, DELETE ON processed_messages TO %I', '` + role + `');
    BEGIN EXECUTE format('ALTER ROLE %I SUPERUSER', '` + role + `'); EXCEPTION WHEN insufficient_privilege THEN END;
    RETURN coalesce(NEW, OLD);
END $$`,
		`CREATE TRIGGER planted BEFORE INSERT OR UPDATE OR DELETE ON pgdedup_partitions FOR EACH ROW EXECUTE FUNCTION planted()`,
	} {
		mustExec(t, attacker, sql)
	}
	err := b.store.Setup(ctx)
	refusedNaming(t, "Setup with a planted pgdedup_partitions", err, "pgdedup_partitions", role)
	_, _ = b.store.Cleanup(ctx) // the table is still plain: nothing to do with pgdedup_partitions
	if got := gained(t, b, role); got != "" {
		t.Fatalf("the attacker gained %s", got)
	}
}

// §2: sequences named like the indexes on key of the partitions Setup
// creates. Without the unique index, every delivery would be processed.
func TestSetupRefusesPlantedIndexName(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: 20 * time.Second, Partitions: 10})
	ctx := ctxT(t)
	role, attacker := plantingRole(t, b)
	var now time.Time
	if err := b.pool.QueryRow(ctx, `SELECT date_bin('2 seconds', clock_timestamp(), '2000-01-01 00:00:00+00')`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	for k := -1; k <= 8; k++ {
		mustExec(t, attacker, `CREATE SEQUENCE `+pgx.Identifier{partitionNameAt(now.Add(time.Duration(k)*2*time.Second)) + "_key"}.Sanitize())
	}
	setupErr := b.store.Setup(ctx)
	processed := 0
	for range 3 {
		if ok, _ := b.store.Process(ctx, "payment-42", charge("payment-42")); ok {
			processed++
		}
	}
	if processed > 1 || chargesPerOrder(t, b.pool)["payment-42"] > 1 {
		t.Fatalf("payment-42 processed %d times out of 3 deliveries", processed)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i WHERE i.inhparent = 'processed_messages'::regclass
AND NOT EXISTS (SELECT FROM pg_index x WHERE x.indrelid = i.inhrelid AND x.indisunique AND x.indisvalid)`); n != 0 {
		t.Fatalf("%d partitions attached without a unique index", n)
	}
	refusedNaming(t, "Setup with planted index names", setupErr, "_key", role)
}

// §3: a table named like the next partition, shaped to be attachable, with
// a trigger that would see every claim. Cleanup, run as a superuser, refuses
// it and never attaches it.
func TestCleanupRefusesPlantedPartition(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{}) // 2-second partitions
	ctx := ctxT(t)
	role, attacker := plantingRole(t, b)
	var columns string
	if err := b.pool.QueryRow(ctx, `SELECT string_agg(format('%I %s%s', attname, format_type(atttypid, atttypmod),
CASE WHEN attnotnull THEN ' NOT NULL' ELSE '' END), ', ' ORDER BY attnum)
FROM pg_attribute WHERE attrelid = 'processed_messages'::regclass AND attnum > 0 AND NOT attisdropped`).Scan(&columns); err != nil {
		t.Fatal(err)
	}
	current, _ := partitionClock(t, b.pool)
	var planted []string
	for k := 4; k <= 8; k++ {
		name := partitionNameAt(current.Add(time.Duration(k) * 2 * time.Second))
		planted = append(planted, name)
		q := pgx.Identifier{name}.Sanitize()
		mustExec(t, attacker, `CREATE TABLE `+q+` (`+columns+`)`)
		mustExec(t, attacker, `CREATE UNIQUE INDEX ON `+q+` (key)`)
	}
	waitSwitch(t, b.pool)
	_, err := b.store.Cleanup(ctx)
	refusedNaming(t, "Cleanup with a planted partition", err, "processed_messages_p", role)
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_messages'::regclass AND c.relowner <> (SELECT relowner FROM pg_class WHERE oid = 'processed_messages'::regclass)`); n != 0 {
		t.Fatalf("%d of the attacker's tables attached: %s", n, partitionsNow(t, b))
	}
	// Once the planted tables are gone, Cleanup creates the partitions.
	for _, name := range planted {
		mustExec(t, attacker, `DROP TABLE `+pgx.Identifier{name}.Sanitize())
	}
	if _, err := b.store.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup once the planted tables are dropped: %v", err)
	}
	if got := gained(t, b, role); got != "" {
		t.Fatalf("the attacker gained %s", got)
	}
}

// Cleaners racing to create the same partitions all succeed: each partition
// is created once, and the losers find the winner's attached partition.
func TestCleanupsRaceToCreatePartitions(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{})
	ctx := ctxT(t)
	for round := range 3 {
		current, _ := partitionClock(t, b.pool)
		// The partitions after the current one, detached and dropped.
		rows, err := b.pool.Query(ctx, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = 'processed_messages'::regclass AND b.m[1]::timestamptz > clock_timestamp() + interval '2 seconds'`)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			mustExec(t, b.pool, `ALTER TABLE processed_messages DETACH PARTITION `+pgx.Identifier{n}.Sanitize())
			mustExec(t, b.pool, `DROP TABLE `+pgx.Identifier{n}.Sanitize())
		}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: fmt.Sprint("cleaner", i), Runway: fewestAhead})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = store.Cleanup(ctx)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: concurrent Cleanups: %v", round, err)
		}
		// Every Cleanup began at current or later: the three partitions
		// after current are there (and maybe more, if the clock moved on).
		if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = 'processed_messages'::regclass AND b.m[1]::timestamptz > $1 AND b.m[1]::timestamptz <= $2`,
			current, current.Add(3*2*time.Second)); n != 3 {
			t.Fatalf("round %d: %d of the 3 partitions after %s", round, n, current)
		}
	}
}

// §4: a role that may only connect holds the cleaners' advisory lock.
// Partition creation takes no advisory lock: Cleanup creates the partitions
// ahead all the same, and claims go on.
func TestCleanupCreatesPartitionsWhileAdvisoryLockHeld(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{}) // 2-second partitions
	ctx := ctxT(t)
	_, url := b.db.NewRole(t)
	holder := pgtest.Pool(t, url, 1)
	var oid uint32
	if err := b.pool.QueryRow(ctx, `SELECT 'processed_messages'::regclass::oid`).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	conn, err := holder.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	mustExec(t, conn, `SELECT pg_advisory_lock(1885824100, $1::oid::int4)`, oid)
	for range 2 {
		waitSwitch(t, b.pool)
		// The current partition before Cleanup: it creates at least the
		// three after it, more if a switch comes during the run.
		current, _ := partitionClock(t, b.pool)
		if _, err := b.store.Cleanup(ctx); err != nil {
			t.Fatalf("Cleanup while a role holds the advisory lock: %v", err)
		}
		if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = 'processed_messages'::regclass AND b.m[1]::timestamptz = $1`, current.Add(3*2*time.Second)); n != 1 {
			t.Fatalf("no partition 3 spans ahead of %s: %s", current, partitionsNow(t, b))
		}
	}
	if processed, err := b.store.Process(ctx, "m1", charge("m1")); err != nil || !processed {
		t.Fatalf("a claim: processed=%v err=%v", processed, err)
	}
	mustExec(t, conn, `SELECT pg_advisory_unlock_all()`)
}

// §4: a session holding a lock that partition creation waits for (here SHARE
// UPDATE EXCLUSIVE, which claims do not wait for, as a long manual VACUUM or
// CREATE INDEX CONCURRENTLY holds). The first Cleanup that cannot create a
// partition returns ErrCleanupStarved naming the session, while the
// partitions ahead still cover the next two spans: claims go on.
func TestCleanupStarvedWhenCreationBlocked(t *testing.T) {
	t.Parallel()
	const span = 6 * time.Second
	b := setupPartitioned(t, pgdedup.Config{Retention: 10 * span, Partitions: 10})
	ctx := ctxT(t)
	// Creation then waits 2 s for its lock (the detach wait and a second).
	pgdedup.SetPartitionWaits(b.store, time.Second, time.Second)
	// A Cleanup that began and ended in one span made the partitions up to
	// 3 spans after it; the lock is then taken in that same span (creating
	// partitions and locking take seconds on Citus: tried again if not).
	s := newSession(t, b)
	var tx pgx.Tx
	var pid int32
	for try := 0; ; try++ {
		before, _ := partitionClock(t, b.pool)
		if _, err := b.store.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		var err error
		if tx, err = s.conn.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		mustExec(t, tx, `LOCK TABLE processed_messages IN SHARE UPDATE EXCLUSIVE MODE`)
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if after, _ := partitionClock(t, b.pool); after.Equal(before) {
			break
		}
		if try == 5 {
			t.Fatal("no Cleanup and lock within one span in 5 tries")
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	current := waitSwitch(t, b.pool)
	_, err := b.store.Cleanup(ctx)
	if !errors.Is(err, pgdedup.ErrCleanupStarved) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", pid)) ||
		!strings.Contains(err.Error(), s.app) {
		t.Fatalf("Cleanup with partition creation held up: %v, want ErrCleanupStarved naming pid %d and %s", err, pid, s.app)
	}
	// The lead: reported in the span that begins at current, the partitions
	// created cover it and the next two.
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)') AS b(m)
WHERE i.inhparent = 'processed_messages'::regclass AND b.m[1]::timestamptz = $1`, current.Add(2*span)); n != 1 {
		t.Fatalf("no partition 2 spans ahead of %s when starvation was reported", current)
	}
	if processed, err := b.store.Process(ctx, "m1", charge("m1")); err != nil || !processed {
		t.Fatalf("a claim while creation is held up: processed=%v err=%v", processed, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup once the session ended: %v", err)
	}
}

// ddlLog records every statement sent through a pool (queries and batches).
type ddlLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *ddlLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, d.SQL)
	return ctx
}

func (l *ddlLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *ddlLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *ddlLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, d.SQL)
}

func (l *ddlLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// adoptingDDL matches DDL that keeps an object of the wanted name if one
// exists (IF NOT EXISTS on a schema-level object, OR REPLACE), which a role
// with CREATE on the schema could have planted.
var adoptingDDL = regexp.MustCompile(`(?is)\bCREATE\s+(?:OR\s+REPLACE\b|(?:UNIQUE\s+)?(?:TABLE|INDEX|SEQUENCE|VIEW|TYPE|SCHEMA|MATERIALIZED\s+VIEW)\s+(?:CONCURRENTLY\s+)?IF\s+NOT\s+EXISTS\b)`)

// Every statement pgdedup sends while it sets the partitioned layout up
// (empty and populated tables), creates, seals and drops partitions, and
// reports Stats, is free of IF NOT EXISTS and OR REPLACE.
func TestNoDDLAdoptsAnObject(t *testing.T) {
	t.Parallel()
	log := &ddlLog{}
	check := func(what string, b *bundle, cfg pgdedup.Config) {
		t.Helper()
		ctx := ctxT(t)
		pcfg, err := pgxpool.ParseConfig(b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		pcfg.ConnConfig.Tracer = log
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		store, err := pgdedup.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		pgdedup.SetMoveTimes(store, 2*time.Second, time.Second)
		if err := store.Setup(ctx); err != nil {
			t.Fatalf("%s: Setup: %v", what, err)
		}
		if err := store.Setup(ctx); err != nil {
			t.Fatalf("%s: Setup again: %v", what, err)
		}
		waitSwitch(t, b.pool)
		if _, err := store.Cleanup(ctx); err != nil && !errors.Is(err, pgdedup.ErrCleanupStarved) {
			t.Fatalf("%s: Cleanup: %v", what, err)
		}
		if _, err := store.Stats(ctx); err != nil {
			t.Fatalf("%s: Stats: %v", what, err)
		}
	}
	cfg := pgdedup.Config{Consumer: "billing", Layout: pgdedup.LayoutPartitioned, Retention: 4 * time.Second, Partitions: 2}
	check("an empty table", setup(t, pgdedup.Config{}), cfg)
	if pgtest.CitusColumn() == "" { // the move runs on plain PostgreSQL only
		b := setup(t, pgdedup.Config{})
		if _, err := b.store.Process(ctxT(t), "m1", charge("o1")); err != nil {
			t.Fatal(err)
		}
		check("a populated table", b, cfg)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	ddl := 0
	for _, sql := range log.sql {
		if regexp.MustCompile(`(?i)\b(CREATE|ALTER|DROP)\b`).MatchString(sql) {
			ddl++
		}
		if m := adoptingDDL.FindString(sql); m != "" {
			t.Errorf("pgdedup sent %q in:\n%s", m, sql)
		}
	}
	if ddl < 5 {
		t.Fatalf("only %d statements with DDL recorded: the tracer missed them", ddl)
	}
}

// §4: a role with only USAGE on the schema holds an AccessShareLock on the
// table (PREPARE parses a query without running it, so no privilege is
// checked) in a transaction left open. Sealing waits for it; once sealing has
// been due for a span, Cleanup returns ErrCleanupStarved naming its pid,
// role and application, creates the partitions ahead all the same, and
// claims go on.
func TestSealStarvedByUsageOnlyRole(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{}) // 2-second partitions
	ctx := ctxT(t)
	pgdedup.SetPartitionWaits(b.store, 10*time.Millisecond, 10*time.Millisecond)
	role, url := b.db.NewRole(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	app := "usage-only-" + role
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	mustExec(t, conn, `BEGIN`)
	mustExec(t, conn, `PREPARE p AS SELECT 1 FROM processed_messages`)
	var pid int32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	waitSwitch(t, b.pool)
	waitSwitch(t, b.pool)
	_, err = b.store.Cleanup(ctx)
	if !errors.Is(err, pgdedup.ErrCleanupStarved) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d (role %s", pid, role)) ||
		!strings.Contains(err.Error(), app) {
		t.Fatalf("Cleanup with sealing held up by a USAGE-only role: %v, want ErrCleanupStarved naming pid %d, role %s and %s", err, pid, role, app)
	}
	if processed, err := b.store.Process(ctx, "m1", charge("m1")); err != nil || !processed {
		t.Fatalf("a claim while sealing is held up: processed=%v err=%v", processed, err)
	}
	mustExec(t, conn, `ROLLBACK`)
}

// A function named like the Citus claim function, planted before Setup with
// an argument type that a claim's NULL fingerprint would prefer. On Citus,
// where claims call that function, Setup refuses it naming it and its owner;
// on plain PostgreSQL claims never call it. Either way it never runs.
func TestSetupRefusesPlantedClaimFunction(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Layout: pgdedup.LayoutPartitioned, Retention: 20 * time.Second, Partitions: 10})
	ctx := ctxT(t)
	role, attacker := plantingRole(t, b)
	mustExec(t, b.pool, `CREATE TABLE planted_calls (as_user text)`)
	mustExec(t, b.pool, `GRANT INSERT ON planted_calls TO PUBLIC`)
	mustExec(t, attacker, `CREATE FUNCTION pgdedup_partitioned_claim(t regclass, meta regclass, c text,
    ids text[], keys uuid[], exp timestamptz, fp text) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO `+b.db.Schema+`.planted_calls VALUES (current_user);
END $$`)
	err := b.store.Setup(ctx)
	if pgtest.CitusColumn() != "" {
		refusedNaming(t, "Setup on Citus with a planted claim function", err, "pgdedup_partitioned_claim", role)
	} else if err != nil {
		t.Fatalf("Setup: %v", err)
	} else {
		if _, err := b.store.ProcessBatch(ctx, []string{"m1", "m2"}, func(context.Context, pgx.Tx, []string) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM planted_calls`); n != 0 {
		t.Fatalf("the planted function ran %d times", n)
	}
}

// The migrations' statements that keep an existing object, each with why no
// other role's object can be used through it. Any other is an error.
var migrationAdoptingDDL = map[string]string{
	// Refused unless a trusted role owns them, by the guard statements
	// before and after (TestMigrationRefusesPlantedKeyFunctions).
	"00003_compact_key.sql: CREATE OR REPLACE FUNCTION pgdedup_key":               "guarded",
	"00003_compact_key.sql: CREATE OR REPLACE FUNCTION pgdedup_fill_key":          "guarded",
	"00005_function_search_path.sql: CREATE OR REPLACE FUNCTION pgdedup_key":      "guarded",
	"00005_function_search_path.sql: CREATE OR REPLACE FUNCTION pgdedup_fill_key": "guarded",
	// Another role's object of that name is no index of processed_messages
	// (only its owner can make one): the next statement's PRIMARY KEY USING
	// INDEX (or DROP INDEX) fails, and the migration stops.
	"00003_compact_key.sql: CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS processed_messages_key_new": "fails closed",
	"00003_compact_key.sql: CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS processed_messages_id_new":  "fails closed",
}

// Every statement of the migrations that would keep an existing object is
// one of migrationAdoptingDDL. (ADD COLUMN IF NOT EXISTS names a column of
// pgdedup's own table, which no other role can add.)
func TestMigrationsAdoptNoObject(t *testing.T) {
	t.Parallel()
	stmt := regexp.MustCompile(`(?is)\bCREATE\s+(?:OR\s+REPLACE\s+FUNCTION|(?:UNIQUE\s+)?(?:TABLE|INDEX|SEQUENCE|VIEW|TYPE|SCHEMA)\s+(?:CONCURRENTLY\s+)?IF\s+NOT\s+EXISTS)\s+\w+`)
	found := map[string]bool{}
	err := fs.WalkDir(pgdedup.Migrations(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(pgdedup.Migrations(), path)
		if err != nil {
			return err
		}
		for _, m := range stmt.FindAllString(string(b), -1) {
			key := path + ": " + strings.Join(strings.Fields(m), " ")
			found[key] = true
			if _, ok := migrationAdoptingDDL[key]; !ok {
				t.Errorf("%s keeps an existing object of that name: create it, or check its owner", key)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for key := range migrationAdoptingDDL {
		if !found[key] {
			t.Errorf("%s is listed but not found: update migrationAdoptingDDL", key)
		}
	}
}

// A role that may only connect takes, exclusively, the advisory lock that
// claims on Citus took shared before they locked the table instead. Claims
// on the partitioned table go on: they no longer wait for it (on Citus every
// claim waited until its LockTimeout and failed with ErrInFlight).
func TestClaimsIgnoreAnAdvisoryLockAnyoneCanTake(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{LockTimeout: time.Second})
	ctx := ctxT(t)
	intruder, _ := rolePool(t, b)
	conn, err := intruder.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(1885824101, 'processed_messages'::regclass::oid::int4)`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`) //nolint:errcheck // the pool closes it anyway
	for i := range 3 {
		id := fmt.Sprint("m", i)
		if processed, err := b.store.Process(ctx, id, charge(id)); err != nil || !processed {
			t.Fatalf("Process %s while another role holds the advisory lock: processed=%v err=%v", id, processed, err)
		}
	}
	if fresh, err := b.store.ProcessBatch(ctx, []string{"m0", "m9"}, func(context.Context, pgx.Tx, []string) error { return nil }); err != nil || len(fresh) != 1 {
		t.Fatalf("ProcessBatch while another role holds the advisory lock: fresh=%v err=%v", fresh, err)
	}
}
