package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// sentTimes gives each ID the time it was first sent, as a producer would.
// A broker's redelivery keeps it (see bundle.opts).
type sentTimes struct {
	mu    sync.Mutex
	first map[string]time.Time
}

// opts are the options of a claim of id in b: WithSentAt with id's first
// time if b's claims carry times, else none.
func (b *bundle) opts(id string) []pgdedup.Option {
	if b.times == nil {
		return nil
	}
	b.times.mu.Lock()
	defer b.times.mu.Unlock()
	t, ok := b.times.first[id]
	if !ok {
		t = time.Now()
		b.times.first[id] = t
	}
	return []pgdedup.Option{pgdedup.WithSentAt(t)}
}

// withTimes makes b's claims carry times (see opts).
func withTimes(b *bundle) *bundle {
	b.times = &sentTimes{first: map[string]time.Time{}}
	return b
}

// timeVariants runs f without and with times on the claims: once as
// before, once bounded by SentAtMargin (50 ms, a same-machine clock).
func timeVariants(t *testing.T, f func(t *testing.T, timed bool)) {
	for _, timed := range []bool{false, true} {
		t.Run(map[bool]string{false: "no-time", true: "time"}[timed], func(t *testing.T) {
			t.Parallel()
			f(t, timed)
		})
	}
}

// boundedMargin is SentAtMargin in the tests of bounded claims. The test
// and the database share a machine, so their clocks agree.
const boundedMargin = 50 * time.Millisecond

// partitionsLocked returns the partitions of processed_messages that tx
// holds a lock on, by start.
func partitionsLocked(t *testing.T, tx pgx.Tx) []time.Time {
	t.Helper()
	rows, err := tx.Query(context.Background(), `SELECT b.m[1]::timestamptz
FROM pg_locks l JOIN pg_inherits i ON i.inhrelid = l.relation AND i.inhparent = 'processed_messages'::regclass
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)') AS b(m)
WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	starts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		t.Fatal(err)
	}
	return starts
}

// A claim with a time locks only the partitions that can hold its ID: from
// the partition of its time less SentAtMargin to the one after the
// current one. A claim without a time locks no partition created ahead.
// The table has a Retention of hourly partitions behind the current one and
// two days of them ahead.
func TestBoundedClaimLocksOnlyItsPartitions(t *testing.T) {
	t.Parallel()
	if pgtest.CitusColumn() != "" {
		t.Log("on Citus the claim is a function of its own; this checks the one-server claim")
		return
	}
	const n = 12
	b := setupPartitioned(t, pgdedup.Config{Retention: n * time.Hour, Partitions: n, SentAtMargin: 10 * time.Minute})
	// Setup's one partition for the past Retention is replaced by hourly
	// ones.
	mustExec(t, b.pool, fmt.Sprintf(`DO $$ DECLARE r record; cur timestamptz := date_bin('1 hour', now(), '2000-01-01'); k int; BEGIN
FOR r IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE inhparent = 'processed_messages'::regclass
  AND (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz <= cur LOOP
  EXECUTE format('ALTER TABLE processed_messages DETACH PARTITION %%I', r.relname);
  EXECUTE format('DROP TABLE %%I', r.relname);
END LOOP;
FOR k IN -%d..48 LOOP
  IF NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'processed_messages'::regclass
      AND (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz = cur + k * interval '1 hour') THEN
    EXECUTE format('CREATE TABLE %%I PARTITION OF processed_messages FOR VALUES FROM (%%L) TO (%%L)', 'extra_' || (k + 100),
      cur + k * interval '1 hour', cur + (k + 1) * interval '1 hour');
    EXECUTE format('CREATE UNIQUE INDEX ON %%I (key)', 'extra_' || (k + 100));
  END IF;
END LOOP; END $$`, n))
	ctx := ctxT(t)
	cases := []struct {
		name  string
		opts  []pgdedup.Option
		from  time.Duration // the earliest partition locked may start this long before the current one
		batch bool
	}{
		{"no time", nil, -n * time.Hour, false},
		{"sent now", []pgdedup.Option{pgdedup.WithSentAt(time.Now())}, -time.Hour, false},
		{"sent 3h ago", []pgdedup.Option{pgdedup.WithSentAt(time.Now().Add(-3 * time.Hour))}, -4 * time.Hour, false},
		{"fingerprint, sent now", []pgdedup.Option{pgdedup.WithSentAt(time.Now()), pgdedup.WithFingerprint([]byte("p"))}, -time.Hour, false},
		{"batch", nil, -n * time.Hour, true},
		{"batch, sent 2h ago", []pgdedup.Option{pgdedup.WithSentAt(time.Now().Add(-2 * time.Hour))}, -3 * time.Hour, true},
	}
	for i, c := range cases {
		conn := newSession(t, b) // a session of its own: the claim plans
		tx, err := conn.conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.batch {
			if fresh, err := b.store.ClaimBatch(ctx, tx, []string{"b1", "b2"}, c.opts...); err != nil || len(fresh) != 2 {
				t.Fatalf("%s: ClaimBatch: %v %v", c.name, fresh, err)
			}
		} else if claimed, err := b.store.Claim(ctx, tx, fmt.Sprintf("m%d", i), c.opts...); err != nil || !claimed {
			t.Fatalf("%s: Claim: %v %v", c.name, claimed, err)
		}
		current, _ := partitionClock(t, b.pool)
		locked := partitionsLocked(t, tx)
		_ = tx.Rollback(ctx)
		t.Logf("%s: %d partitions locked, %s to %s", c.name, len(locked), locked[0], locked[len(locked)-1])
		for _, p := range locked {
			if p.After(current.Add(time.Hour)) {
				t.Errorf("%s: locked the partition at %s, created ahead of the current one (%s) and the next", c.name, p, current)
			}
			if p.Before(current.Add(c.from)) {
				t.Errorf("%s: locked the partition at %s, older than its ID can be (from %s)", c.name, p, current.Add(c.from))
			}
		}
	}
}

// Redeliveries with the message's first time find it across switches and
// seals, with the cleaner running, and so does a producer's retry whose
// time is later by less than SentAtMargin. Each ID's order is charged once.
func TestBoundedClaimRedeliveriesAcrossSwitches(t *testing.T) {
	t.Parallel()
	const margin = time.Second
	// 1 s spans (testSpan); a Retention of 30 of them, so that the
	// late-message guard (27 spans) stays far from the rounds'
	// redeliveries on a loaded machine.
	b := setupPartitioned(t, pgdedup.Config{Retention: 30 * testSpan(time.Second), Partitions: 30, SentAtMargin: margin})
	keepPartitions(t, b)
	ctx := ctxT(t)
	sent := map[string]time.Time{}
	for i := range 20 {
		id := fmt.Sprintf("m%d", i)
		sent[id] = time.Now()
		if processed, err := b.store.Process(ctx, id, charge(id), pgdedup.WithSentAt(sent[id])); err != nil || !processed {
			t.Fatalf("first delivery of %s: %v %v", id, processed, err)
		}
	}
	for round := range 3 {
		waitSwitch(t, b.pool)
		for id, at := range sent {
			// The broker's redelivery keeps the time. A producer's retry,
			// sent again after a timeout, has a later one, within the margin.
			for _, opt := range []pgdedup.Option{pgdedup.WithSentAt(at), pgdedup.WithSentAt(at.Add(margin - 100*time.Millisecond))} {
				if processed, err := b.store.Process(ctx, id, charge(id), opt); err != nil || processed {
					t.Fatalf("round %d: redelivery of %s: processed=%v err=%v, want a duplicate", round, id, processed, err)
				}
			}
		}
		// A batch of them all, with its earliest time, finds each.
		ids := make([]string, 0, len(sent))
		for id := range sent {
			ids = append(ids, id)
		}
		fresh, err := b.store.ProcessBatch(ctx, ids, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
			for _, id := range fresh {
				if err := charge(id)(ctx, tx); err != nil {
					return err
				}
			}
			return nil
		}, pgdedup.WithSentAt(sent["m0"]))
		if err != nil || len(fresh) != 0 {
			t.Fatalf("round %d: batch redelivery: fresh %v, err %v; want none fresh", round, fresh, err)
		}
	}
	if _, sealed := partitionClock(t, b.pool); !sealed.After(sent["m0"]) {
		t.Errorf("the first deliveries' partition was never sealed (sealed up to %s): the redeliveries did not cross a seal", sealed)
	}
	for id, n := range chargesPerOrder(t, b.pool) {
		if n != 1 {
			t.Errorf("%s charged %d times, want 1", id, n)
		}
	}
}

// A time further ahead of the consumer's clock than SentAtMargin is refused
// before anything is sent. Within the margin it is accepted.
func TestBoundedClaimRefusesFutureTimes(t *testing.T) {
	t.Parallel()
	b := setupPartitioned(t, pgdedup.Config{SentAtMargin: time.Minute})
	ctx := ctxT(t)
	_, err := b.store.Process(ctx, "m1", charge("o1"), pgdedup.WithSentAt(time.Now().Add(2*time.Minute)))
	if !errors.Is(err, pgdedup.ErrInvalidOption) {
		t.Fatalf("a time 2 minutes ahead: %v, want ErrInvalidOption", err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("%d IDs recorded after a refused call, want 0", n)
	}
	if processed, err := b.store.Process(ctx, "m1", charge("o1"), pgdedup.WithSentAt(time.Now().Add(30*time.Second))); err != nil || !processed {
		t.Fatalf("a time 30 s ahead: processed=%v err=%v, want processed", processed, err)
	}
}

// When the client's clock puts the claim's bounds away from the database's
// partition, the claim writes nothing, says so, and is sent again without
// bounds in the same transaction: still exactly once, in the caller's
// transaction too. A client clock behind by ten spans misses every time.
// One ahead by ten spans only looks in more partitions.
func TestBoundedClaimClockMisses(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{-20 * time.Second, 20 * time.Second} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) {
			t.Parallel()
			b := setupPartitioned(t, pgdedup.Config{SentAtMargin: boundedMargin}) // 2 s spans
			keepPartitions(t, b)
			store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", SentAtMargin: boundedMargin})
			if err != nil {
				t.Fatal(err)
			}
			pgdedup.SetClock(store, func() time.Time { return time.Now().Add(skew) })
			ctx := ctxT(t)
			sent := time.Now()
			for i := range 2 {
				if processed, err := store.Process(ctx, "m1", charge("o1"), pgdedup.WithSentAt(sent)); err != nil || processed != (i == 0) {
					t.Fatalf("Process #%d: processed=%v err=%v", i+1, processed, err)
				}
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					claimed, err := store.Claim(ctx, tx, "m1", pgdedup.WithSentAt(sent))
					if err != nil || claimed {
						t.Errorf("Claim #%d in the caller's transaction: claimed=%v err=%v, want a duplicate", i+1, claimed, err)
					}
					id := fmt.Sprint("b", i)
					fresh, err := store.ClaimBatch(ctx, tx, []string{"m1", id, "b0"})
					if err != nil || len(fresh) != 1 || fresh[0] != id {
						t.Errorf("ClaimBatch #%d: fresh=%v err=%v, want [%s]", i+1, fresh, err, id)
					}
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				waitSwitch(t, b.pool)
			}
			if n := chargesPerOrder(t, b.pool)["o1"]; n != 1 {
				t.Errorf("o1 charged %d times, want 1", n)
			}
		})
	}
}

// freshTracer counts the fresh claims a pool sends (the bounded claim of a
// message sent in the client's current partition, one INSERT): those that
// inserted the ID, and those that inserted nothing and so were sent again.
//
// On Citus a fresh claim inserts into the partition of the coordinator's
// clock, whichever that is, and a row outside the client's partition is
// deleted before the claim is sent again: those count as sent again.
type freshTracer struct {
	inserted, again atomic.Int64
}

func (f *freshTracer) count(sql string, tag pgconn.CommandTag, err error) {
	switch {
	case err != nil:
	case strings.Contains(sql, "FROM (SELECT pg_catalog.clock_timestamp() AS t) c WHERE c.t >="): // one server
		if tag.RowsAffected() == 1 {
			f.inserted.Add(1)
		} else {
			f.again.Add(1)
		}
	case strings.Contains(sql, "pg_catalog.clock_timestamp(), ") && strings.Contains(sql, "RETURNING processed_at"): // Citus
		f.inserted.Add(tag.RowsAffected())
	case strings.HasPrefix(sql, "DELETE") && strings.Contains(sql, "AND processed_at = $4::pg_catalog.timestamptz"): // Citus: undone
		f.inserted.Add(-tag.RowsAffected())
		f.again.Add(tag.RowsAffected())
	}
}

func (f *freshTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (f *freshTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (f *freshTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (f *freshTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	f.count(d.SQL, d.CommandTag, d.Err)
}
func (f *freshTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A claim of a message sent in the client's current partition is one
// INSERT. When the database's clock lies in the next partition, or the ID
// is there, it inserts nothing, and is sent again as a bounded claim. The
// client's clock here is half a span behind the database's, so half the
// fresh claims miss. Four consumers deliver every message at once, and
// again a span later: each order is charged once, and both ways of a fresh
// claim were taken. On Citus, the missed ones wrote a row in the
// coordinator's partition and deleted it.
func TestFreshClaim(t *testing.T) {
	t.Parallel()
	const span = 4 * time.Second
	b := setupPartitioned(t, pgdedup.Config{Retention: 10 * span, Partitions: 10, SentAtMargin: 100 * time.Millisecond})
	keepPartitions(t, b)
	tracer := &freshTracer{}
	pool := tracedPool(t, b.db.URL, tracer)
	clock := func() time.Time { return time.Now().Add(-span / 2) }
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", SentAtMargin: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pgdedup.SetClock(store, clock)
	ids := deliverTwiceByFour(t, b, store, span, clock)
	t.Logf("%d messages; fresh claims: %d inserted, %d sent again", len(ids), tracer.inserted.Load(), tracer.again.Load())
	if tracer.inserted.Load() == 0 || tracer.again.Load() == 0 {
		t.Errorf("fresh claims: %d inserted, %d sent again; want some of each", tracer.inserted.Load(), tracer.again.Load())
	}
}

// A message sent before the client's current partition looks itself up
// from its time's partition. On Citus that is a read of sealed, a routed
// look-up and the routed INSERT, without the claim function while the
// partitions before are sealed. Messages sent a span and a half ago are
// delivered by four consumers at once, and again after a switch, when
// their first claims lie in a partition sealed since; the cleaner seals
// every 200 ms, so some claims come just after a switch, before the seal.
// Each order is charged once, and on Citus the routed INSERT claimed some.
func TestClaimSentBeforeThePartition(t *testing.T) {
	t.Parallel()
	const span = 4 * time.Second
	b := setupPartitioned(t, pgdedup.Config{Retention: 10 * span, Partitions: 10, SentAtMargin: 100 * time.Millisecond})
	keepPartitions(t, b)
	tracer := &freshTracer{}
	store, err := pgdedup.New(tracedPool(t, b.db.URL, tracer), pgdedup.Config{Consumer: "billing", SentAtMargin: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ids := deliverTwiceByFour(t, b, store, span, func() time.Time { return time.Now().Add(-span * 3 / 2) })
	t.Logf("%d messages; routed INSERTs kept: %d", len(ids), tracer.inserted.Load())
	if pgtest.CitusColumn() != "" && tracer.inserted.Load() == 0 {
		t.Error("no claim sent before the partition was the routed INSERT on Citus")
	}
}

// deliverTwiceByFour sends a new message every 50 ms for two spans, each
// with sentAt's time and delivered by four consumers at once, then, after a
// switch, delivers them all again. It checks that each order was charged
// once and returns the IDs.
func deliverTwiceByFour(t *testing.T, b *bundle, store *pgdedup.Store, span time.Duration, sentAt func() time.Time) []string {
	t.Helper()
	ctx := ctxT(t)
	var ids []string
	sent := map[string]time.Time{}
	deliver := func(id string) {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if _, err := store.Process(ctx, id, charge(id), pgdedup.WithSentAt(sent[id])); err != nil {
					t.Errorf("Process %s: %v", id, err)
				}
			})
		}
		wg.Wait()
	}
	for end := time.Now().Add(2 * span); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		id := fmt.Sprint("m", len(ids))
		ids, sent[id] = append(ids, id), sentAt()
		deliver(id)
	}
	waitSwitch(t, b.pool)
	for _, id := range ids {
		deliver(id)
	}
	charges := chargesPerOrder(t, b.pool)
	for _, id := range ids {
		if charges[id] != 1 {
			t.Errorf("%s charged %d times, want 1", id, charges[id])
		}
	}
	return ids
}

// tracedPool is a pool on url whose statements tracer sees.
func tracedPool(t *testing.T, url string, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctxT(t), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// On Citus a claim calls pgdedup_partitioned_claim, which now takes the
// claim's time. The release before made it without one. A Store of this
// release on such a table claims as before, without bounds. Setup then
// makes the function with a time and turns the old one into a wrapper,
// which the older Store keeps calling, while a Store started after Setup
// passes times. Each order is charged once throughout.
func TestCitusClaimFunctionUpgrade(t *testing.T) {
	t.Parallel()
	if pgtest.CitusColumn() == "" {
		t.Log("the claim function exists on Citus only")
		return
	}
	b := setupPartitioned(t, pgdedup.Config{Retention: time.Hour, Partitions: 6})
	ctx := ctxT(t)
	const with, without = `pgdedup_partitioned_claim(regclass, regclass, text, text[], uuid[], timestamptz, bytea, timestamptz)`,
		`pgdedup_partitioned_claim(regclass, regclass, text, text[], uuid[], timestamptz, bytea)`
	exists := func(fn string) bool {
		return pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_proc WHERE oid = to_regprocedure($1)`, fn) == 1
	}
	if !exists(with) || !exists(without) {
		t.Fatalf("after Setup: the function with a time exists: %v, without: %v; want both", exists(with), exists(without))
	}
	// The release before: one function, without a time, with a body of its
	// own (here, the function with a time under another name).
	mustExec(t, b.pool, `ALTER FUNCTION `+with+` RENAME TO pgdedup_claim_before`)
	mustExec(t, b.pool, `DROP FUNCTION `+without)
	mustExec(t, b.pool, `CREATE FUNCTION pgdedup_partitioned_claim(t regclass, meta regclass, c text, ids text[], keys uuid[], exp timestamptz, fp bytea)
RETURNS SETOF text LANGUAGE sql SET search_path = pg_catalog, pg_temp
AS 'SELECT * FROM `+b.db.Schema+`.pgdedup_claim_before(t, meta, c, ids, keys, exp, fp, NULL)'`)
	newStore := func() *pgdedup.Store {
		s, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	deliver := func(s *pgdedup.Store, id string, want bool) {
		t.Helper()
		if processed, err := s.Process(ctx, id, charge(id), pgdedup.WithSentAt(time.Now())); err != nil || processed != want {
			t.Fatalf("Process %s: processed=%v err=%v, want %v", id, processed, err, want)
		}
		if fresh, err := s.ProcessBatch(ctx, []string{id, id + "-b"}, func(context.Context, pgx.Tx, []string) error { return nil },
			pgdedup.WithSentAt(time.Now())); err != nil || len(fresh) != map[bool]int{true: 1, false: 0}[want] {
			t.Fatalf("ProcessBatch %s: fresh=%v err=%v", id, fresh, err)
		}
	}
	before := newStore()
	deliver(before, "m1", true)
	deliver(before, "m1", false)
	if err := b.store.Setup(ctx); err != nil {
		t.Fatalf("Setup again: %v", err)
	}
	if !exists(with) || !exists(without) {
		t.Fatalf("after the second Setup: the function with a time exists: %v, without: %v; want both", exists(with), exists(without))
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_proc WHERE oid = to_regprocedure($1) AND prosrc LIKE '%pgdedup_claim_before%'`, without); n != 0 {
		t.Errorf("the old function without a time was kept; want it replaced by the wrapper")
	}
	after := newStore()
	deliver(before, "m1", false)
	deliver(after, "m1", false)
	deliver(after, "m2", true)
	deliver(before, "m2", false)
	deliver(before, "m3", true)
	deliver(after, "m3", false)
	for _, id := range []string{"m1", "m2", "m3"} {
		if n := chargesPerOrder(t, b.pool)[id]; n != 1 {
			t.Errorf("%s charged %d times, want 1", id, n)
		}
	}
}
