package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgdedup/pgdedup/examples/internal/fleet"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// TestKilledConsumersChargeEachOrderOnce produces a few thousand orders (some
// twice, a few unparseable) to a topic of franz-go's in-process Kafka (kfake),
// consumes them with a group of consumer processes while members join, leave,
// are SIGKILLed mid-batch, one is paused past its session timeout (a zombie)
// and one joins reading every partition from the start, and checks once every
// partition's offset in Postgres has reached its last record that every order
// was charged exactly once, with its own amount, and every record applied
// exactly once.
func TestKilledConsumersChargeEachOrderOnce(t *testing.T) {
	const (
		orders     = 3000
		partitions = 6
		consumers  = 3
		kills      = 5
		topic      = "orders"
		session    = time.Second
	)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	db := pgdeduptest.New(t)
	// Not a bound on speed: the fleet fails as stuck only when its state stops
	// changing (fleet.Stall); this only turns a hang into a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	rng := fleet.Rand(t)

	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	recs, want, dups := orderBatch{RunID: "t", Orders: orders, Duplicates: 0.1, Poison: 3}.records(rng, topic)
	firstPart := len(recs) * 2 / 3
	if err := produce(ctx, producer, recs[:firstPart]); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	args := []string{"-brokers", strings.Join(brokers, ","), "-topic", topic, "-group", "billing",
		"-max-poll-records", "12", "-handler-delay", "15ms", "-lock-timeout", "300ms", "-session-timeout", session.String(), "-rebalance-timeout", "5s"}
	var all, live []*proc
	startOne := func(extra ...string) *proc {
		name := fmt.Sprintf("c%02d", len(all)+1)
		// application_name tells the test which process holds which transaction.
		dbURL := db.URL + "&application_name=" + db.Schema + "-" + name
		p := startConsumer(t, name, append(slices.Clone(args), append(extra, "-database-url", dbURL)...)...)
		all, live = append(all, p), append(live, p)
		return p
	}
	for range consumers {
		startOne()
	}

	// Events at points of progress, so that they land while batches are
	// being processed however fast this machine is.
	type event struct {
		at   int
		what string
	}
	var events []event
	for i := range kills {
		events = append(events, event{int((float64(i) + rng.Float64()) / float64(kills+1) * orders), "kill"})
	}
	events = append(events, event{orders / 4, "produce"}, event{orders * 3 / 10, "rewinder joins"},
		event{orders / 2, "leave"}, event{orders * 6 / 10, "pause"})
	slices.SortStableFunc(events, func(a, b event) int { return a.at - b.at })

	killed, produced := 0, false
	var paused chan struct{}
	var rewinder *proc // kept out of the kills, so that it lives to read its partitions again
	var zombie *proc
	stall := fleet.Stall{Limit: time.Minute}
	for tick := time.NewTicker(50 * time.Millisecond); ; <-tick.C {
		charged := fleet.CountCharged(t, db)
		if ctx.Err() != nil || stall.Stuck(charged, batchesLogged(all)) {
			t.Fatalf("not drained, no progress for %s: %d orders charged of %d\n%s", stall.Limit, charged, orders, lastLines(all))
		}
		if len(events) > 0 && charged >= events[0].at {
			e := events[0]
			events = events[1:]
			// The victim is a consumer with a transaction open, so that kills
			// and the pause land inside transactions (else the one that logged
			// a batch last); the rewinder and a paused consumer are left alone.
			i := victim(t, db, live, rewinder, zombie)
			switch e.what {
			case "kill":
				victim := live[i]
				victim.Kill()
				live = slices.Delete(live, i, i+1)
				killed++
				p := startOne()
				t.Logf("SIGKILL %s at %d/%d orders charged (%d batches logged); %s joins", victim.Name, charged, orders, victim.Log.counts().batches, p.Name)
			case "produce":
				if err := produce(ctx, producer, recs[firstPart:]); err != nil {
					t.Fatal(err)
				}
				produced = true
				t.Logf("produced the last %d records at %d/%d orders charged", len(recs)-firstPart, charged, orders)
			case "rewinder joins":
				p := startOne("-rewind")
				rewinder = p
				t.Logf("%s joins with -rewind at %d/%d orders charged: it reads its partitions from offset 0", p.Name, charged, orders)
			case "leave":
				leaver := live[i]
				live = slices.Delete(live, i, i+1)
				if err := leaver.Stop(15 * time.Second); err != nil {
					t.Errorf("consumer %s after SIGTERM: %v\n%s", leaver.Name, err, leaver.Log.LastLines())
				}
				t.Logf("%s leaves (SIGTERM) at %d/%d orders charged", leaver.Name, charged, orders)
			case "pause":
				zombie = live[i]
				paused = make(chan struct{})
				go func(z *proc) { defer close(paused); z.Pause(3 * session) }(zombie)
				t.Logf("SIGSTOP %s for %s at %d/%d orders charged: it comes back a zombie", zombie.Name, 3*session, charged, orders)
			}
			continue
		}
		for _, p := range live {
			if !p.Running() {
				t.Fatalf("consumer %s exited: %v\n%s", p.Name, p.Err(), p.Log.LastLines())
			}
		}
		if produced && len(events) == 0 && drained(t, db, topic, recs) {
			break
		}
	}
	if paused != nil {
		<-paused
	}
	// SIGTERM all at once, as a deployment does: each finishes its batch,
	// leaves the group and exits cleanly.
	var stopping sync.WaitGroup
	for _, p := range live {
		stopping.Go(func() {
			if err := p.Stop(30 * time.Second); err != nil {
				t.Errorf("consumer %s after SIGTERM: %v\n%s", p.Name, err, p.Log.LastLines())
			}
		})
	}
	stopping.Wait()
	elapsed := time.Since(start)

	fleet.CheckOneChargePerOrder(t, db, want)
	if n := pgdeduptest.Count(t, db.Pool, "SELECT coalesce(sum(records), 0) FROM records_seen"); n != len(recs) {
		t.Errorf("records applied: %d, want each of the %d records once", n, len(recs))
	}
	if n := pgdeduptest.Count(t, db.Pool, "SELECT count(*) FROM processed_offsets WHERE consumer = 'billing'"); n != partitions {
		t.Errorf("processed_offsets holds %d rows for billing, want one per partition: %d", n, partitions)
	}
	if n := pgdeduptest.Count(t, db.Pool, "SELECT count(*) FROM processed_messages"); n != 0 {
		t.Errorf("processed_messages holds %d rows: offsets need none", n)
	}
	var total logCounts
	for _, p := range all {
		total.add(p.Log.counts())
	}
	rolledBack := pgdeduptest.Count(t, db.Pool, "SELECT coalesce(max(id), 0) - count(*) FROM charges")
	t.Logf("%d records (%d orders, %d produced twice, %d unparseable) on %d partitions in %s; %d consumer processes, %d SIGKILLed, 1 left, 1 paused",
		len(recs), orders, dups, 3, partitions, elapsed.Round(time.Millisecond), len(all), killed)
	t.Logf("batches logged %d (%d records): skipped as processed before %d records (%d batches whole), charged %d, produced twice %d, rejected %d; in-flight give-ups %d, fenced %d; assignments %d; charges rolled back by kills %d",
		total.batches, total.records, total.skipped, total.duplicate, total.charged, total.producedTwice, total.rejected, total.inFlight, total.fenced, total.assignments, rolledBack)

	// Which partitions the rewinder gets is the group balancer's choice: on a
	// slow machine it can join while a rebalance is in flight and end up with
	// none. That run says nothing about the offset check (asserted
	// deterministically by the root package's TestProcessOffsetsSkipsAtOrBelowStored);
	// every other assertion still holds.
	if rewinder != nil && rewinder.Log.counts().batches == 0 {
		t.Logf("the rewinding consumer %s read no batch (%d assignments): the offset check was not exercised by this run", rewinder.Name, rewinder.Log.counts().assignments)
	}
	switch {
	case total.races > 0:
		t.Errorf("the race detector reported %d data races in consumers", total.races)
	case total.failed > 0:
		t.Errorf("%d batches failed", total.failed)
	case killed < kills/2:
		t.Errorf("only %d consumers killed, want at least %d", killed, kills/2)
	case total.skipped == 0 && rewinder != nil && rewinder.Log.counts().batches > 0:
		t.Errorf("the rewinding consumer read %d batches from offset 0 and the offset check skipped none of them", rewinder.Log.counts().batches)
	case rolledBack == 0:
		t.Errorf("no charge was rolled back: no kill landed inside a transaction")
	}
	// The unparseable records were committed (records_seen counts them above)
	// and charged nothing (checkCharges finds no unknown order); the logs may
	// miss a rejection whose process was killed before it wrote the line.
}

// victim returns the index in live of a consumer, other than the ones in
// spare, whose transaction has written charges (it holds a lock on the
// table: a kill then rolls charges back), watching for up to half a second;
// else one with a transaction open, watching as long; or else the one that
// logged a batch last.
func victim(t *testing.T, db *pgdeduptest.DB, live []*proc, spare ...*proc) int {
	t.Helper()
	candidate := func(p *proc) bool { return !slices.Contains(spare, p) }
	for _, query := range []string{`SELECT a.application_name FROM pg_stat_activity a
JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'relation' AND l.relation = 'charges'::regclass
WHERE a.application_name LIKE $1 AND a.xact_start IS NOT NULL`,
		`SELECT application_name FROM pg_stat_activity
WHERE application_name LIKE $1 AND xact_start IS NOT NULL AND state IN ('active', 'idle in transaction')`} {
		for range 100 {
			rows, err := db.Pool.Query(context.Background(), query, db.Schema+"-%")
			if err != nil {
				t.Fatal(err)
			}
			names, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range live {
				if candidate(p) && slices.Contains(names, db.Schema+"-"+p.Name) {
					return i
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	i := -1
	for j, p := range live {
		if candidate(p) && (i < 0 || p.Log.lastBatch().After(live[i].Log.lastBatch())) {
			i = j
		}
	}
	return i
}

// drained reports whether every partition's stored offset has reached the
// last record produced to it.
func drained(t *testing.T, db *pgdeduptest.DB, topic string, recs []*kgo.Record) bool {
	t.Helper()
	last := map[int32]int64{}
	for _, r := range recs {
		last[r.Partition] = max(last[r.Partition], r.Offset)
	}
	rows, err := db.Pool.Query(context.Background(), "SELECT partition, last_offset FROM processed_offsets WHERE consumer = 'billing' AND topic = $1", topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	done := 0
	for rows.Next() {
		var p int32
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			t.Fatal(err)
		}
		if o > last[p] {
			t.Fatalf("partition %d: stored offset %d past the last record produced, %d", p, o, last[p])
		}
		if o == last[p] {
			done++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return done == len(last)
}

// batchesLogged is how many batch lines procs logged in all.
func batchesLogged(procs []*proc) int {
	n := 0
	for _, p := range procs {
		n += p.Log.counts().batches
	}
	return n
}

func lastLines(procs []*proc) string {
	var s string
	for _, p := range procs {
		s += fmt.Sprintf("--- %s (running %t)\n%s\n", p.Name, p.Running(), p.Log.LastLines())
	}
	return s
}
