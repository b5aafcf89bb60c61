package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// 200,000 expired rows of two consumers among live ones: exactly the expired
// ones go, in bounded batches, and a live ID is still a duplicate afterwards.
func TestCleanupDeletesExactlyTheExpired(t *testing.T) {
	t.Parallel()
	sink, events := &logSink{}, &eventLog{}
	b := setup(t, pgdedup.Config{Logger: slog.New(sink), OnEvent: events.add})
	ctx := ctxT(t)
	pgtest.Seed(t, b.pool, "billing", "old-", 120_000, -time.Hour)
	pgtest.Seed(t, b.pool, "emails", "old-", 80_000, -time.Hour)
	pgtest.Seed(t, b.pool, "billing", "edge-", 1, -time.Millisecond)
	pgtest.Seed(t, b.pool, "billing", "live-", 1_000, time.Hour)
	pgtest.Seed(t, b.pool, "emails", "live-", 1_000, 24*time.Hour)
	for i := range 5 {
		id := fmt.Sprint("order-", i)
		if ok, err := b.store.Process(ctx, id, charge(id)); err != nil || !ok {
			t.Fatalf("Process(%s) = %v, %v", id, ok, err)
		}
	}

	deleted, err := b.store.Cleanup(ctx)
	if err != nil || deleted != 200_001 {
		t.Fatalf("Cleanup = %d, %v; want 200001, nil", deleted, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE expires_at < now()`); n != 0 {
		t.Errorf("%d expired rows left", n)
	}
	for consumer, want := range map[string]int{"billing": 1_005, "emails": 1_000} {
		if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE consumer = $1`, consumer); n != want {
			t.Errorf("%s: %d live rows left, want %d", consumer, n, want)
		}
	}
	for i := range 5 {
		id := fmt.Sprint("order-", i)
		if ok, err := b.store.Process(ctx, id, charge(id)); err != nil || ok {
			t.Errorf("Process(%s) after cleanup = %v, %v; want a duplicate", id, ok, err)
		}
		if n := chargesPerOrder(t, b.pool)[id]; n != 1 {
			t.Errorf("%s charged %d times", id, n)
		}
	}

	batches := sink.batches()
	if len(batches) != 21 && !citusBatches(t, batches, 10_000, 200_001) {
		t.Errorf("deleted in %d batches %v, want 20 of 10000 and 1 of 1", len(batches), batches)
	}
	for _, n := range batches {
		if n > 10_000 {
			t.Errorf("a batch deleted %d rows, more than the default 10000", n)
		}
	}
	runs := events.cleanups()
	if len(runs) != 1 || runs[0].Count != 200_001 || runs[0].Err != nil || runs[0].Duration <= 0 {
		t.Errorf("cleanup events = %+v; want one with Count 200001, a duration and no error", runs)
	}
	got := sink.Last("pgdedup: cleanup")
	if got == nil {
		t.Fatal("no info log of the cleanup")
	}
	if deleted, _ := pgtest.Attr(*got, "deleted"); deleted.Int64() != 200_001 {
		t.Errorf("the cleanup's log says %v rows deleted, want 200001", deleted)
	}
	if d, _ := pgtest.Attr(*got, "duration"); d.Duration() <= 0 {
		t.Errorf("the cleanup's log gives no duration: %v", *got)
	}
	if deleted, err := b.store.Cleanup(ctx); deleted != 0 || err != nil {
		t.Errorf("second Cleanup = %d, %v; want 0, nil", deleted, err)
	}
}

// Cancelling ctx stops Cleanup between batches; the committed batches stay
// deleted, and the next run takes the rest in batches of CleanupBatchSize.
func TestCleanupHonorsCtxBetweenBatches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(ctxT(t))
	sink := &logSink{}
	sink.onBatch = func(int64) { cancel() }
	b := setup(t, pgdedup.Config{CleanupBatchSize: 1_000, Logger: slog.New(sink)})
	pgtest.Seed(t, b.pool, "billing", "old-", 5_500, -time.Hour)
	pgtest.Seed(t, b.pool, "billing", "live-", 10, time.Hour)

	first := int64(1_000)
	if pgtest.CitusColumn() != "" {
		first = 0 // on Citus, the first batch's size depends on how its window adapted
		sink.onBatch = func(n int64) { first = n; cancel() }
	}
	deleted, err := b.store.Cleanup(ctx)
	if !errors.Is(err, context.Canceled) || deleted != first || first < 1 || first > 1_000 {
		t.Fatalf("cancelled Cleanup = %d, %v; want one batch of 1000, context.Canceled", deleted, err)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 5_510-int(first) {
		t.Fatalf("%d rows after the cancelled run, want %d: the first batch must stay deleted", n, 5_510-first)
	}

	sink.onBatch = nil
	deleted, err = b.store.Cleanup(ctxT(t))
	if err != nil || deleted != 5_500-first {
		t.Fatalf("Cleanup = %d, %v; want %d, nil", deleted, err, 5_500-first)
	}
	batches := sink.batches()
	if got, want := fmt.Sprint(batches), "[1000 1000 1000 1000 1000 500]"; got != want && !citusBatches(t, batches, 1_000, 5_500) {
		t.Errorf("batches %s, want %s", got, want)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 10 {
		t.Errorf("%d rows left, want the 10 live ones", n)
	}
}

// A batch's two statements (take the turn, delete) are one round trip and one
// implicit transaction in each of pgx's query modes, the simple protocol too:
// Cleanup deletes every expired row, in one round trip per batch once its
// statements are prepared (on plain PostgreSQL), and leaves on its connection
// neither the turn nor its lock. Behind PgBouncer (TEST_PGBOUNCER) the modes
// that prepare statements are left out: PgBouncer < 1.21 cannot run them.
func TestCleanupInEveryQueryMode(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	modes := []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	if os.Getenv("TEST_PGBOUNCER") == "" {
		modes = append(modes, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec)
	}
	proxy, proxied := pgtest.NewProxy(t, b.db.URL, wireproxy.Config{})
	for _, mode := range modes {
		cfg, err := pgx.ParseConfig(proxied)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DefaultQueryExecMode = mode
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		store, err := pgdedup.New(conn, pgdedup.Config{Consumer: "billing", CleanupBatchSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		pgtest.Seed(t, b.pool, "billing", "live-"+mode.String()+"-", 10, time.Hour)
		for run := range 2 { // the first prepares the statements, in the modes that do
			pgtest.Seed(t, b.pool, "billing", fmt.Sprintf("old-%s-%d-", mode, run), 250, -time.Hour)
			before := proxy.RoundTrips()
			if deleted, err := store.Cleanup(ctx); err != nil || deleted != 250 {
				t.Errorf("%s: Cleanup = %d, %v; want 250, nil", mode, deleted, err)
			}
			want := int64(3)
			if mode == pgx.QueryExecModeDescribeExec {
				want = 6 // it describes the statements first, for every query
			}
			// On Citus, Cleanup deletes by windows of expires_at (cleanup_citus.go).
			if rt := proxy.RoundTrips() - before; run == 1 && rt != want && pgtest.CitusColumn() == "" {
				t.Errorf("%s: Cleanup of 3 batches took %d round trips, want %d", mode, rt, want)
			}
		}
		var turn string
		var locks int
		err = conn.QueryRow(ctx, `SELECT coalesce(current_setting('pgdedup.cleanup_turn', true), ''),
(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())`).Scan(&turn, &locks)
		if err != nil || turn == "true" || locks != 0 {
			t.Errorf("%s: after Cleanup the connection has turn %q and %d advisory locks (%v); want neither", mode, turn, locks, err)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE expires_at < now()`); n != 0 {
		t.Errorf("%d expired rows left", n)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 10*len(modes) {
		t.Errorf("%d rows left, want the %d live ones", n, 10*len(modes))
	}
}

// The RunCleaner tests are not parallel: goleak looks at every goroutine of
// the test binary, and parallel tests run only after the sequential ones.

// A failed run (here: the table does not exist yet) does not end the loop:
// once the table is there, the next tick cleans it. Cancelling ctx stops the
// loop at once, with ctx.Err(), and leaves no goroutine behind.
func TestRunCleanerSurvivesFailuresAndStops(t *testing.T) {
	b := setup(t, pgdedup.Config{})
	conn := connect(t, b.db.URL) // no pool: no background goroutines of its own
	runs := make(chan pgdedup.Event, 1000)
	store, err := pgdedup.New(conn, pgdedup.Config{Consumer: "billing", Table: "later_table",
		OnEvent: func(_ context.Context, e pgdedup.Event) { runs <- e }})
	if err != nil {
		t.Fatal(err)
	}
	ignore := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(ctxT(t))
	stopped := make(chan error, 1)
	go func() { stopped <- store.RunCleaner(ctx, 10*time.Millisecond) }()

	for range 2 {
		var pgErr *pgconn.PgError
		if e := next(t, runs); !errors.As(e.Err, &pgErr) || pgErr.Code != "42P01" {
			t.Fatalf("run on a missing table: %+v, want undefined_table", e)
		}
	}
	mustExec(t, b.pool, `BEGIN;
CREATE TABLE later_table (LIKE processed_messages INCLUDING ALL);
INSERT INTO later_table (key, consumer, message_id, expires_at)
SELECT pgdedup_key('billing', 'id-' || g), 'billing', 'id-' || g, now() - interval '1 hour' FROM generate_series(1, 100) g;
COMMIT`)
	for i := 0; ; i++ {
		e := next(t, runs)
		if e.Err == nil && e.Count > 0 {
			if e.Count != 100 {
				t.Errorf("the first successful run deleted %d rows, want 100", e.Count)
			}
			break
		}
		if i == 500 {
			t.Fatalf("no successful run after the table was created; last: %+v", e)
		}
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM later_table`); n != 0 {
		t.Errorf("%d rows left after a successful run", n)
	}

	cancel()
	stopsPromptly(t, stopped)
	closed(conn)
	goleak.VerifyNone(t, ignore)
}

// Cancelling ctx in the middle of a long Cleanup stops RunCleaner promptly too;
// the batches committed before stay deleted.
func TestRunCleanerStopsMidRun(t *testing.T) {
	ctx, cancel := context.WithCancel(ctxT(t))
	sink := &logSink{}
	batches := make(chan int64, 1)
	sink.onBatch = func(n int64) {
		select {
		case batches <- n:
		default:
		}
	}
	b := setup(t, pgdedup.Config{})
	pgtest.Seed(t, b.pool, "billing", "old-", 20_000, -time.Hour)
	conn := connect(t, b.db.URL)
	store, err := pgdedup.New(conn, pgdedup.Config{Consumer: "billing", CleanupBatchSize: 50, Logger: slog.New(sink)})
	if err != nil {
		t.Fatal(err)
	}
	ignore := goleak.IgnoreCurrent()
	stopped := make(chan error, 1)
	go func() { stopped <- store.RunCleaner(ctx, time.Millisecond) }()
	select {
	case <-batches:
	case err := <-stopped:
		t.Fatalf("RunCleaner returned %v before its first batch", err)
	}
	cancel()
	stopsPromptly(t, stopped)
	closed(conn)
	goleak.VerifyNone(t, ignore)

	left := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`)
	var done int64
	for _, n := range sink.batches() {
		done += n
	}
	// The batch in flight when ctx was cancelled may have committed or not.
	if left == 0 || int64(left) > 20_000-done || int64(left) < 20_000-done-50 {
		t.Errorf("%d rows left after batches that deleted %d, want 20000-%[2]d or one batch of 50 fewer, and some left", left, done)
	}
}

func TestRunCleanerRejectsBadInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	for _, d := range []time.Duration{0, -time.Second, 1, 3600, pgdedup.MinCleanerInterval - 1} {
		if err := b.store.RunCleaner(context.Background(), d); err == nil || !strings.Contains(err.Error(), "at least 1ms") {
			t.Errorf("RunCleaner(%s) = %v, want an error saying the least interval", d, err)
		}
	}
}

// closed waits, if the cancellation closed conn, for pgx's goroutine that
// closes it to end: it sends a CancelRequest and drains the socket, bounded by
// its own 15 s deadline, and goleak would count it while it runs.
func closed(conn *pgx.Conn) {
	if conn.IsClosed() {
		<-conn.PgConn().CleanupDone()
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// next returns the next cleanup run reported, failing after settle (a hang
// guard: it returns as soon as the run is reported).
func next(t *testing.T, runs <-chan pgdedup.Event) pgdedup.Event {
	t.Helper()
	select {
	case e := <-runs:
		return e
	case <-time.After(settle):
		t.Fatalf("no cleanup run within %s", settle)
		return pgdedup.Event{}
	}
}

// stopsPromptly checks that RunCleaner returned context.Canceled within a
// second of its ctx being cancelled.
func stopsPromptly(t *testing.T, stopped <-chan error) {
	t.Helper()
	select {
	case err := <-stopped:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("RunCleaner returned %v, want context.Canceled", err)
		}
	case <-time.After(time.Second):
		t.Fatal("RunCleaner still running 1s after its ctx was cancelled")
	}
}

// Four cleaners at once (Stores of different consumers: Cleanup is for the
// whole table) finish without error or deadlock and delete each row once.
func TestCleanupConcurrentCleaners(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pgtest.Seed(t, b.pool, "billing", "old-", 30_000, -time.Hour)
	pgtest.Seed(t, b.pool, "emails", "old-", 30_000, -time.Hour)
	pgtest.Seed(t, b.pool, "emails", "live-", 100, time.Hour)

	var total atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 4 {
		store, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: fmt.Sprint("cleaner-", i), CleanupBatchSize: 500})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-start
			n, err := store.Cleanup(ctx)
			if err != nil {
				t.Errorf("cleaner %d: %v", i, err)
			}
			total.Add(n)
		})
	}
	close(start)
	wg.Wait()
	if n := total.Load(); n != 60_000 {
		t.Errorf("cleaners deleted %d rows in total, want 60000", n)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`); n != 100 {
		t.Errorf("%d rows left, want the 100 live ones", n)
	}
}

// Cleanup running while 8 goroutines Process new and duplicate IDs: no error,
// every ID recorded, every order charged exactly once.
func TestCleanupWhileProcessing(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	cleaning := make(chan struct{})
	var once sync.Once
	sink := &logSink{onBatch: func(int64) { once.Do(func() { close(cleaning) }) }}
	b := setup(t, pgdedup.Config{CleanupBatchSize: 500, Logger: slog.New(sink)})
	const orders = 300
	pgtest.Seed(t, b.pool, "billing", "old-", 20_000, -time.Hour)
	// The same IDs, expired, for another consumer: neighbours of the new claims
	// in the primary key index.
	pgtest.Seed(t, b.pool, "billing-v1", "order-", orders, -time.Hour)

	deliveries := make(chan string, 3*orders)
	var ids []string
	for i := range 3 * orders {
		ids = append(ids, pgtest.SeedID("order-", i%orders+1))
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	for _, id := range ids {
		deliveries <- id
	}
	close(deliveries)

	var deleted int64
	stop, cleanerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(cleanerDone)
		for {
			n, err := b.store.Cleanup(ctx)
			deleted += n
			if err != nil {
				t.Errorf("Cleanup: %v", err)
				return
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	select { // the workers start while the first run is mid-way
	case <-cleaning:
	case <-cleanerDone:
		t.Fatal("the cleaner stopped before its first batch")
	}
	var processed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for id := range deliveries {
				ok, err := b.store.Process(ctx, id, charge(id))
				if err != nil {
					t.Errorf("Process(%s): %v", id, err)
				}
				if ok {
					processed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-cleanerDone

	if n := processed.Load(); n != orders {
		t.Errorf("%d deliveries processed, want %d", n, orders)
	}
	charges := chargesPerOrder(t, b.pool)
	for i := 1; i <= orders; i++ {
		id := pgtest.SeedID("order-", i)
		if charges[id] != 1 || !recorded(t, b.pool, "billing", id) {
			t.Errorf("%s: charged %d times, recorded %v; want once, true", id, charges[id], recorded(t, b.pool, "billing", id))
		}
	}
	if deleted != 20_000+orders {
		t.Errorf("cleaner deleted %d rows, want %d", deleted, 20_000+orders)
	}
}

// The interleaving that made concurrent cleaners all return with expired rows
// left (issue 10), forced step by step. Cleaner B's batch starts while A's
// first batch is in flight and gets the turn only after that batch committed;
// meanwhile A, done with its batch, finds the turn taken and returns. B must
// then still delete everything that expired: a batch picks its rows from a
// snapshot taken once it holds the turn, never before.
//
// The steps are forced with gates inside the lock try: each cleaner logs in as
// a role of its own whose search_path puts the test's schema before
// pg_catalog, where a pg_try_advisory_xact_lock(int, int) of the test's waits,
// before trying the real one and after getting it, until the test opens that
// cleaner's gate (see cleanupGates). Each cleaner has only SELECT and DELETE.
func TestCleanupTurnTakenAfterAnotherBatchCommitted(t *testing.T) {
	t.Parallel()
	const batch = 100
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	pgtest.Seed(t, b.pool, "billing", "old-", 3*batch, -time.Hour)
	pgtest.Seed(t, b.pool, "billing", "live-", 10, time.Hour)
	gates := newCleanupGates(t, b, 0)

	// A pauses after its first batch, until resumeA.
	pausedA, resumeA := make(chan int64, 1), make(chan struct{})
	var firstA sync.Once
	sinkA := &logSink{onBatch: func(n int64) {
		firstA.Do(func() { pausedA <- n; <-resumeA })
	}}
	storeA := gates.cleaner(t, "a", pgdedup.Config{Consumer: "cleaner-a", CleanupBatchSize: batch, Logger: slog.New(sinkA)})
	storeB := gates.cleaner(t, "b", pgdedup.Config{Consumer: "cleaner-b", CleanupBatchSize: batch})
	afterA := gates.close(t, "a", "after")
	beforeB := gates.close(t, "b", "before")
	afterB := gates.close(t, "b", "after")

	type result struct {
		n   int64
		err error
	}
	doneA, doneB := make(chan result, 1), make(chan result, 1)
	go func() { n, err := storeA.Cleanup(ctx); doneA <- result{n, err} }()
	gates.waitBlocked(t, afterA) // A has the turn for its first batch
	go func() { n, err := storeB.Cleanup(ctx); doneB <- result{n, err} }()
	gates.waitBlocked(t, beforeB) // B's first batch started, before its lock try

	gates.open(t, afterA) // A's first batch deletes and commits
	if n := receive(t, pausedA, "A's first batch"); n < 1 || n > batch {
		t.Fatalf("A's first batch deleted %d rows, want 1 to %d", n, batch)
	}
	gates.open(t, beforeB)       // B tries now, after A's batch committed:
	gates.waitBlocked(t, afterB) // it has the turn
	close(resumeA)               // A's second batch finds the turn taken
	a := receive(t, doneA, "A's return")
	gates.open(t, afterB)
	bRes := receive(t, doneB, "B's return")

	if a.err != nil || bRes.err != nil {
		t.Fatalf("Cleanup errors: A %v, B %v", a.err, bRes.err)
	}
	left := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE expires_at < now()`)
	if left != 0 || a.n+bRes.n != 3*batch {
		t.Errorf("both cleaners returned (A deleted %d, B %d) with %d expired rows left; want 0 left, %d deleted",
			a.n, bRes.n, left, 3*batch)
	}
	if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE expires_at > now()`); n != 10 {
		t.Errorf("%d live rows left, want 10", n)
	}
}

// receive returns the next value from ch, failing the test after settle (a
// hang guard: it returns as soon as the value comes).
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(settle):
		t.Fatalf("no %s within %s", what, settle)
		panic("unreachable")
	}
}

// Eight cleaners at once with batch sizes of their own, round after round,
// while rows keep expiring under them: after each round, once all have
// returned without error, nothing that had expired before they started is
// left, nothing that expires after they returned is gone, each row was
// counted by exactly one cleaner, and the live rows are all there. Each lock
// try waits a random time of up to 2ms before it tries and after it got the
// lock (see cleanupGates), as a slow scan or a busy machine would: the windows
// a race between cleaners needs. The rounds stop after 30, or after 20 seconds.
func TestCleanupConcurrentCleanersStress(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{})
	ctx := ctxT(t)
	_, url := newCleanupGates(t, b, 2*time.Millisecond).role(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const cleaners, live = 8, 50
	stores := make([]*pgdedup.Store, cleaners)
	budget := time.Now().Add(20 * time.Second)
	rounds := 0
	for ; rounds < 30 && time.Now().Before(budget); rounds++ {
		mustExec(t, b.pool, `TRUNCATE processed_messages`)
		expired := 1_000 + rand.N(3_000)
		pgtest.Seed(t, b.pool, "billing", "old-", expired/2, -time.Hour)
		pgtest.Seed(t, b.pool, "emails", "old-", expired-expired/2, -time.Minute)
		pgtest.Seed(t, b.pool, "billing", "live-", live, time.Hour)
		// Rows expiring while the cleaners run, or after: they may go only
		// if they expired before the cleaners returned.
		mustExec(t, b.pool, `INSERT INTO processed_messages (consumer, message_id, expires_at)
SELECT 'soon', 'soon-' || g, now() + g * interval '5 milliseconds' FROM generate_series(1, 200) g`)
		soon := expiries(t, b.pool, `SELECT message_id, expires_at FROM processed_messages WHERE consumer = 'soon'`)
		for i := range stores {
			store, err := pgdedup.New(pool, pgdedup.Config{Consumer: fmt.Sprint("cleaner-", i), CleanupBatchSize: 20 + rand.N(300)})
			if err != nil {
				t.Fatal(err)
			}
			stores[i] = store
		}
		before := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`)
		var start time.Time
		if err := b.pool.QueryRow(ctx, `SELECT now()`).Scan(&start); err != nil {
			t.Fatal(err)
		}

		var total atomic.Int64
		var wg sync.WaitGroup
		for i, store := range stores {
			wg.Go(func() {
				time.Sleep(time.Duration(rand.N(10_000)) * time.Microsecond)
				n, err := store.Cleanup(ctx)
				if err != nil {
					t.Errorf("round %d, cleaner %d: %v", rounds, i, err)
				}
				total.Add(n)
			})
		}
		wg.Wait()
		var end time.Time
		if err := b.pool.QueryRow(ctx, `SELECT now()`).Scan(&end); err != nil {
			t.Fatal(err)
		}

		after := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages`)
		if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE expires_at < $1`, start); n != 0 {
			t.Errorf("round %d: all %d cleaners returned with %d of %d rows left that had expired before they started",
				rounds, cleaners, n, expired)
		}
		if n := total.Load(); n != int64(before-after) {
			t.Errorf("round %d: the cleaners counted %d rows deleted, the table lost %d", rounds, n, before-after)
		}
		left := expiries(t, b.pool, `SELECT message_id, expires_at FROM processed_messages WHERE consumer = 'soon'`)
		for id, at := range soon {
			if _, ok := left[id]; !ok && !at.Before(end) {
				t.Errorf("round %d: %s was deleted; it expires at %s, after the cleaners returned (%s)", rounds, id, at, end)
			}
		}
		if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'billing' AND message_id LIKE 'live-%'`); n != live {
			t.Errorf("round %d: %d live rows left, want %d", rounds, n, live)
		}
		if t.Failed() {
			break
		}
	}
	t.Logf("%d rounds of %d cleaners", rounds, cleaners)
}

// BenchmarkCleanup measures one Cleanup of PGDEDUP_BENCH_ROWS expired rows
// (default 1,000,000) at the default batch size, and reports rows deleted per
// second and the time per batch, which is how long each batch holds its row
// locks. It is a one-off measurement, not part of the test suite:
//
//	go test -run '^$' -bench BenchmarkCleanup -benchtime 1x .
//
// "old-snapshot" keeps a repeatable-read transaction open meanwhile, as a
// report or a stuck session would: vacuum cannot remove the deleted rows, and
// every index scan from the start of the index would visit them again.
func BenchmarkCleanup(b *testing.B) {
	rows := 1_000_000
	if s := os.Getenv("PGDEDUP_BENCH_ROWS"); s != "" {
		var err error
		if rows, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	for _, oldSnapshot := range []bool{false, true} {
		name := "quiet"
		if oldSnapshot {
			name = "old-snapshot"
		}
		b.Run(name, func(b *testing.B) { benchCleanup(b, rows, oldSnapshot, nil) })
	}
	// The same, side by side, with batches that each start from
	// the beginning of the expires_at index instead of where the previous one
	// ended: what Cleanup's resuming saves.
	b.Run("quiet-restarting", func(b *testing.B) { benchCleanup(b, rows, false, restartingCleanup) })
	b.Run("old-snapshot-restarting", func(b *testing.B) { benchCleanup(b, rows, true, restartingCleanup) })
}

// restartingCleanup is Cleanup without the resume point: every batch scans the
// index from its start, over the entries of the rows deleted before it.
func restartingCleanup(ctx context.Context, db *pgtest.DB, log *slog.Logger) (int64, error) {
	var deleted int64
	for {
		start := time.Now()
		tag, err := db.Pool.Exec(ctx, `DELETE FROM processed_messages WHERE ctid = ANY (ARRAY(
SELECT ctid FROM processed_messages WHERE expires_at < now() ORDER BY expires_at LIMIT 10000))
AND expires_at < now()`)
		if err != nil {
			return deleted, err
		}
		deleted += tag.RowsAffected()
		log.Debug("pgdedup: cleanup batch", "deleted", tag.RowsAffected(), "duration", time.Since(start))
		if tag.RowsAffected() < 10_000 {
			return deleted, nil
		}
	}
}

func benchCleanup(b *testing.B, rows int, oldSnapshot bool,
	cleanup func(context.Context, *pgtest.DB, *slog.Logger) (int64, error)) {
	db := pgtest.New(b)
	sink := &logSink{}
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "bench", Logger: slog.New(sink)})
	if err != nil {
		b.Fatal(err)
	}
	if cleanup == nil {
		cleanup = func(ctx context.Context, _ *pgtest.DB, _ *slog.Logger) (int64, error) { return store.Cleanup(ctx) }
	}
	ctx := context.Background()
	var deleted int64
	var spent time.Duration
	for range b.N {
		b.StopTimer()
		pgtest.Seed(b, db.Pool, "bench", "old-", rows, -time.Hour)
		mustExec(b, db.Pool, `ANALYZE processed_messages`)
		var old pgx.Tx
		if oldSnapshot {
			if old, err = db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}); err != nil {
				b.Fatal(err)
			}
			mustExec(b, old, `SELECT count(*) FROM pg_class`) // takes the snapshot
		}
		b.StartTimer()
		start := time.Now()
		n, err := cleanup(ctx, db, slog.New(sink))
		spent += time.Since(start)
		if old != nil {
			_ = old.Rollback(ctx)
		}
		if err != nil || n != int64(rows) {
			b.Fatalf("Cleanup = %d, %v; want %d", n, err, rows)
		}
		deleted += n
	}
	d := sink.batchDurations()
	slices.Sort(d)
	ms := func(q float64) float64 { return float64(d[int(q*float64(len(d)-1))]) / 1e6 }
	b.ReportMetric(float64(deleted)/spent.Seconds(), "rows/s")
	b.ReportMetric(ms(0.5), "ms/batch-p50")
	b.ReportMetric(ms(0.95), "ms/batch-p95")
	b.ReportMetric(ms(1), "ms/batch-max")
	b.ReportMetric(0, "ns/op")
}

// cleanupBatchMsg is the message Cleanup logs for each batch.
const cleanupBatchMsg = "pgdedup: cleanup batch"

// logSink captures what a Store logs (pgtest.LogCapture), reads its cleanup
// batches, and calls onBatch, when set, for each cleanup batch logged.
type logSink struct {
	pgtest.LogCapture
	onBatch func(deleted int64)
}

func (h *logSink) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *logSink) WithGroup(string) slog.Handler { return h }

func (h *logSink) Handle(ctx context.Context, r slog.Record) error {
	_ = h.LogCapture.Handle(ctx, r)
	if h.onBatch != nil && r.Message == cleanupBatchMsg {
		h.onBatch(batchDeleted(r))
	}
	return nil
}

// batches returns the rows deleted by each cleanup batch logged, in order.
func (h *logSink) batches() []int64 {
	var out []int64
	for _, r := range h.Records(cleanupBatchMsg) {
		out = append(out, batchDeleted(r))
	}
	return out
}

// batchDurations returns how long each cleanup batch took, in order.
func (h *logSink) batchDurations() []time.Duration {
	var out []time.Duration
	for _, r := range h.Records(cleanupBatchMsg) {
		v, _ := pgtest.Attr(r, "duration")
		out = append(out, v.Duration())
	}
	return out
}

func batchDeleted(r slog.Record) int64 {
	v, _ := pgtest.Attr(r, "deleted")
	return v.Int64()
}

// citusBatches reports, on Citus only, whether batches are what Cleanup's
// windows of expires_at may give there: every batch between 1 and size rows,
// total rows in all. On plain PostgreSQL it returns false, leaving the exact
// batch sizes to the caller's check.
func citusBatches(t testing.TB, batches []int64, size, total int64) bool {
	t.Helper()
	if pgtest.CitusColumn() == "" {
		return false
	}
	var sum int64
	for _, n := range batches {
		if n < 1 || n > size {
			return false
		}
		sum += n
	}
	return sum == total
}

// cleanupGates stops cleaners at chosen points of their lock try, to force an
// interleaving of concurrent cleaners. It shadows pg_try_advisory_xact_lock(int,
// int) with a function of the test's schema, found first by the cleaners'
// roles (search_path: the schema, then pg_catalog), which waits on the gate
// "before" of its role, tries the real lock and, if it got it, waits on the
// gate "after". A gate is an advisory lock the test holds in an open
// transaction; opening it ends that transaction, and it stays open.
type cleanupGates struct {
	b     *bundle
	keys  int32             // the last gate key used
	roles map[string]string // each cleaner's role
}

// cleanupGateClass is the first half of the gates' advisory lock keys.
const cleanupGateClass = 1885824199

// Each lock try also sleeps a random time of up to jitter before it tries, and
// as long again once it got the lock, to widen the windows that a race between
// cleaners needs.
func newCleanupGates(t *testing.T, b *bundle, jitter time.Duration) *cleanupGates {
	t.Helper()
	mustExec(t, b.pool, `CREATE TABLE cleanup_gates (role name, point text, key int, PRIMARY KEY (role, point))`)
	mustExec(t, b.pool, fmt.Sprintf(`CREATE FUNCTION pg_try_advisory_xact_lock(k1 int, k2 int) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
	gate int;
	got boolean;
BEGIN
	SELECT key INTO gate FROM cleanup_gates WHERE role = current_user AND point = 'before';
	IF FOUND THEN PERFORM pg_catalog.pg_advisory_xact_lock_shared(%[1]d, gate); END IF;
	PERFORM pg_catalog.pg_sleep(pg_catalog.random() * %[2]f);
	got := pg_catalog.pg_try_advisory_xact_lock(k1, k2);
	SELECT key INTO gate FROM cleanup_gates WHERE role = current_user AND point = 'after';
	IF got AND FOUND THEN PERFORM pg_catalog.pg_advisory_xact_lock_shared(%[1]d, gate); END IF;
	IF got THEN PERFORM pg_catalog.pg_sleep(pg_catalog.random() * %[2]f); END IF;
	RETURN got;
END $$`, cleanupGateClass, jitter.Seconds()))
	return &cleanupGates{b: b, roles: map[string]string{}}
}

// cleaner returns a Store, with cfg, for a role of its own named by who, that
// may only SELECT and DELETE (and read the gates), on a connection of its own.
func (g *cleanupGates) cleaner(t *testing.T, who string, cfg pgdedup.Config) *pgdedup.Store {
	t.Helper()
	role, url := g.role(t)
	g.roles[who] = role
	store, err := pgdedup.New(connect(t, url), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// role creates a role that finds the gated lock try first and may only SELECT
// and DELETE (and read the gates), and returns its name and a URL logging in
// as it.
func (g *cleanupGates) role(t *testing.T) (name, url string) {
	t.Helper()
	name, url = g.b.db.NewRole(t)
	mustExec(t, g.b.pool, `ALTER ROLE `+name+` SET search_path = `+g.b.db.Schema+`, pg_catalog`)
	mustExec(t, g.b.pool, `GRANT SELECT, DELETE ON processed_messages TO `+name)
	mustExec(t, g.b.pool, `GRANT SELECT ON cleanup_gates TO `+name)
	return name, url
}

// gate is a closed gate: the transaction holding its lock.
type gate struct {
	key int32
	tx  pgx.Tx
}

// close closes the gate point ("before" or "after") of the cleaner who.
func (g *cleanupGates) close(t *testing.T, who, point string) *gate {
	t.Helper()
	g.keys++
	key := g.keys
	tx, err := g.b.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // opens it if the test failed first
	if _, err := tx.Exec(context.Background(), `SELECT pg_advisory_xact_lock($1, $2)`, cleanupGateClass, key); err != nil {
		t.Fatal(err)
	}
	mustExec(t, g.b.pool, `INSERT INTO cleanup_gates VALUES ($1, $2, $3)`, g.roles[who], point, key)
	return &gate{key: key, tx: tx}
}

// open lets every cleaner waiting on gt, and every later one, through.
func (g *cleanupGates) open(t *testing.T, gt *gate) {
	t.Helper()
	if err := gt.tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// waitBlocked waits until a cleaner waits on gt, failing after 30 seconds.
func (g *cleanupGates) waitBlocked(t *testing.T, gt *gate) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := pgtest.Count(t, g.b.pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2`, cleanupGateClass, gt.key)
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no cleaner waits on gate %d after 30s", gt.key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expiries returns the message_id and expires_at of the rows sql selects.
func expiries(t *testing.T, pool *pgxpool.Pool, sql string) map[string]time.Time {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Time{}
	var id string
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { out[id] = at; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// Any role that can connect can take the cleaners' advisory lock and hold it.
// Cleanup does not then report "deleted 0" forever: with CleanupTurnWait it
// waits that long and returns ErrCleanupStarved naming the holder; without,
// the third run in a row (a second apart) that never had the turn, with the
// same holder and no expired row deleted, does. Each is an EventCleanup with
// the error. Once the holder lets go, the next run deletes the expired rows.
func TestCleanupStarvedByAHeldTurn(t *testing.T) {
	t.Parallel()
	var log eventLog
	b := setup(t, pgdedup.Config{OnEvent: log.add})
	ctx := ctxT(t)
	pgtest.Seed(t, b.pool, "billing", "old-", 100, -time.Hour)
	// The holder keeps the turn inside an open transaction: behind PgBouncer in
	// transaction pooling, a session lock would go back to the pool with its
	// server connection, and the cleaner handed that connection would hold it too.
	holder, err := connect(t, b.db.URL).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid(), pg_advisory_xact_lock(1885824100, 'processed_messages'::regclass::oid::int4)`).Scan(&pid, nil); err != nil {
		t.Fatal(err)
	}
	waiting, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "cron", CleanupTurnWait: 300 * time.Millisecond, OnEvent: log.add})
	if err != nil {
		t.Fatal(err)
	}
	_, err = waiting.Cleanup(ctx)
	if !errors.Is(err, pgdedup.ErrCleanupStarved) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", pid)) {
		t.Fatalf("Cleanup with a wait: err=%v, want ErrCleanupStarved naming pid %d", err, pid)
	}
	for run := 1; run <= 3; run++ {
		if run > 1 {
			time.Sleep(1100 * time.Millisecond) // runs closer together may fall within one cleaner's batch
		}
		n, err := b.store.Cleanup(ctx)
		if starved := errors.Is(err, pgdedup.ErrCleanupStarved); n != 0 || starved != (run == 3) || (run < 3 && err != nil) {
			t.Fatalf("run %d without a wait: deleted=%d err=%v, want ErrCleanupStarved on the third run only", run, n, err)
		}
	}
	var starvedEvents int
	for _, e := range log.cleanups() {
		if errors.Is(e.Err, pgdedup.ErrCleanupStarved) {
			starvedEvents++
		}
	}
	if starvedEvents != 2 {
		t.Fatalf("%d cleanup events with ErrCleanupStarved, want 2", starvedEvents)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.Cleanup(ctx); err != nil || n != 100 {
		t.Fatalf("after the holder let go: deleted=%d err=%v, want 100, nil", n, err)
	}
	if n, err := b.store.Cleanup(ctx); err != nil || n != 0 {
		t.Fatalf("the run after: deleted=%d err=%v, want 0, nil (the count of runs without the turn starts again)", n, err)
	}
}

// Cleaners at work are not starvation: a Cleanup that waits for the turn
// (CleanupTurnWait) while others delete a backlog batch after batch never
// returns ErrCleanupStarved, and together they delete every expired row.
func TestCleanupTurnWaitBesideWorkingCleaners(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{CleanupBatchSize: 100})
	ctx := ctxT(t)
	pgtest.Seed(t, b.pool, "billing", "old-", 20_000, -time.Hour)
	// The wait is longer than one batch of the others. On Citus a batch is a
	// two-phase commit across the workers, which on a loaded machine (CI
	// runs the Citus suites beside each other) took longer than 200 ms.
	wait := 200 * time.Millisecond
	if pgtest.CitusColumn() != "" {
		wait = 2 * time.Second
	}
	waiting, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "cron", CleanupBatchSize: 100, CleanupTurnWait: wait})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.FanOut(t, 4, func(i int) error {
		store := b.store
		if i == 0 {
			store = waiting
		}
		for pgtest.Count(t, b.pool, `SELECT count(*) FROM processed_messages WHERE expires_at < now()`) > 0 {
			if _, err := store.Cleanup(ctx); err != nil {
				return fmt.Errorf("cleaner %d: %w", i, err)
			}
		}
		return nil
	})
}
