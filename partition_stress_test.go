package pgdedup_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// Many consumers, every message delivered three times to workers at about
// the same time, over many fast switches (500 ms partitions) while a cleaner
// creates and seals partitions beside them: every message is charged exactly
// once (0 doubled, 0 lost). The consumers claim in READ COMMITTED,
// REPEATABLE READ and SERIALIZABLE transactions, one with LockTimeout, by
// Process and ProcessBatch; a failed delivery is delivered again, as a broker
// would. It runs rounds until the claims have spread over 10 partitions.
// Deliveries that find no partition (the cleaners behind the clock on a
// busy machine) are among the failures delivered again. On Citus, where
// attaching a partition takes a fifth of a second, partitions are of 2 s
// and the claims spread over 6. On plain PostgreSQL no claim is seen
// waiting 100 ms or more for a lock on a relation of the table (sampled
// every 2 ms; watchClaimsBlockedByDDL says why not never): the switches and
// seals never hold a claim up (drops: TestPartitionedDropWhileRead).
func TestPartitionedStress(t *testing.T) {
	t.Parallel()
	span, spread := 500*time.Millisecond, 10
	if pgtest.CitusColumn() != "" {
		span, spread = 2*time.Second, 6
	}
	b := setupPartitioned(t, pgdedup.Config{Retention: 30 * time.Second, Partitions: int(30 * time.Second / span)})
	ctx := ctxT(t)
	// The partitions holding claims (a row's processed_at is in its
	// partition; on Citus its tableoid is its shard's).
	spreadSQL := fmt.Sprintf(`SELECT count(DISTINCT date_bin('%d ms', processed_at, '2000-01-01 00:00:00+00')) FROM processed_messages`,
		span.Milliseconds())
	keepPartitionsEvery(t, b, 10*time.Millisecond, time.Millisecond) // creates
	keepPartitionsEvery(t, b, 50*time.Millisecond, time.Second)      // seals
	blocked := watchClaimsBlockedByDDL(t, b)

	opts := []pgdedup.Config{
		{Consumer: "c-rc"},
		{Consumer: "c-rr", TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, MaxAttempts: 10},
		{Consumer: "c-ser", TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}, MaxAttempts: 10},
		{Consumer: "c-lock", LockTimeout: 20 * time.Millisecond},
	}
	stores := make([]*pgdedup.Store, len(opts))
	for i, cfg := range opts {
		cfg.Retention = 30 * time.Second
		var err error
		if stores[i], err = pgdedup.New(b.pool, cfg); err != nil {
			t.Fatal(err)
		}
	}
	type delivery struct {
		store int
		id    string
	}
	var (
		mu        sync.Mutex
		delivered = map[string]bool{}
		failures  = map[string]int{}
	)
	deliver := func(d delivery, batch bool) {
		order := opts[d.store].Consumer + "/" + d.id
		for ctx.Err() == nil {
			var err error
			if batch {
				_, err = stores[d.store].ProcessBatch(ctx, []string{d.id}, func(ctx context.Context, tx pgx.Tx, fresh []string) error {
					return charge(order)(ctx, tx)
				})
			} else {
				_, err = stores[d.store].Process(ctx, d.id, charge(order))
			}
			if err == nil {
				return
			}
			mu.Lock()
			msg := err.Error()
			failures[msg[:min(len(msg), 60)]]++
			mu.Unlock()
		}
	}
	rounds := 0
	for ; pgtest.Count(t, b.pool, spreadSQL) < spread; rounds++ {
		var ds []delivery
		for s := range stores {
			for i := range 20 {
				id := fmt.Sprintf("r%d-%d", rounds, i)
				delivered[opts[s].Consumer+"/"+id] = true
				for range 3 {
					ds = append(ds, delivery{s, id})
				}
			}
		}
		// Copies of a message stay close together: shuffle within windows.
		for w := 0; w < len(ds); w += 12 {
			win := ds[w:min(w+12, len(ds))]
			rand.Shuffle(len(win), func(i, j int) { win[i], win[j] = win[j], win[i] })
		}
		work := make(chan delivery)
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for d := range work {
					deliver(d, w%4 == 3)
				}
			}()
		}
		for _, d := range ds {
			work <- d
		}
		close(work)
		wg.Wait()
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
	}
	charges := chargesPerOrder(t, b.pool)
	doubled, lost := 0, 0
	for order := range delivered {
		switch n := charges[order]; {
		case n == 0:
			lost++
		case n > 1:
			doubled++
			t.Errorf("%s charged %d times", order, n)
		}
	}
	if lost > 0 || doubled > 0 || len(charges) != len(delivered) {
		t.Errorf("%d messages: %d doubled, %d lost, %d charged", len(delivered), doubled, lost, len(charges))
	}
	samples, waits := blocked()
	t.Logf("%d rounds, %d messages over %d partitions; failed deliveries (delivered again): %v; %d samples of lock waits, %d claims seen waiting 100 ms or more for a relation lock",
		rounds, len(delivered), pgtest.Count(t, b.pool, spreadSQL), failures, samples, waits)
	// On plain PostgreSQL a switch never blocks a claim: nothing the cleaners
	// run takes a lock on the table that conflicts with ROW EXCLUSIVE. (On
	// Citus the plain DETACH does, up to its lock_timeout.)
	if waits > 0 && pgtest.CitusColumn() == "" {
		t.Errorf("claims were seen waiting 100 ms or more for a relation lock of the table %d times: a switch blocked claims", waits)
	}
}

// watchClaimsBlockedByDDL samples, every 2 ms until the test ends, the
// backends waiting for a lock on a relation of b's schema (the table, its
// partitions, their indexes) in a mode claims take, whose statement is not
// the cleaners' DDL (DO, ALTER, UPDATE, CREATE, DROP, COMMENT): claims. (A
// cleaner waiting for another's SHARE UPDATE EXCLUSIVE to create a
// partition may show another statement of its batch.) Claims of one key wait on
// each other's transaction, never on a relation.
//
// It counts a claim as blocked when it is seen waiting for the same relation
// for blockedFor or longer. A shorter wait is PostgreSQL's own: an ATTACH's
// commit is visible a moment before its lock on the new partition is
// released, and a claim planned in that moment waits for the release (seen
// here under load, on the code before this rule too). A switch that holds a
// lock claims wait for (a LOCK … IN SHARE MODE held 200 ms) is caught. The
// returned func stops it and reports the samples taken and the blocked
// claims seen in all.
func watchClaimsBlockedByDDL(t *testing.T, b *bundle) func() (samples, waits int) {
	const blockedFor = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	var n, w int
	done := make(chan struct{})
	go func() {
		defer close(done)
		since := map[string]time.Time{} // pid and relation: first seen waiting
		counted := map[string]bool{}
		for ctx.Err() == nil {
			rows, err := b.pool.Query(ctx, `SELECT l.pid::text || '/' || l.relation::text FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND l.locktype = 'relation' AND c.relnamespace = current_schema()::regnamespace
AND l.mode IN ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock')
AND a.query !~* '^\s*(DO|ALTER|UPDATE|CREATE|DROP|COMMENT)'`)
			if err != nil {
				return
			}
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return
			}
			now := time.Now()
			seen := map[string]time.Time{}
			for _, k := range keys {
				seen[k] = now
				if first, ok := since[k]; ok {
					seen[k] = first
					if now.Sub(first) >= blockedFor && !counted[k] {
						counted[k] = true
						w++
					}
				}
			}
			since = seen
			n++
			time.Sleep(2 * time.Millisecond)
		}
	}()
	stop := func() (int, int) { cancel(); <-done; return n, w }
	t.Cleanup(func() { stop() })
	return stop
}
