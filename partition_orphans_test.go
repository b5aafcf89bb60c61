package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// A cleaner stopped between detaching a partition and dropping it (its
// context cancelled, or its connection cut) leaves a table that is no longer
// a partition; the next Cleanup, by any Store, drops it and reports it, and
// drops nothing else: not the tables a user made beside it, named like a
// partition or carrying pgdedup's mark for another table or under another
// name, nor a partition marked by a detach that was cut short.
func TestPartitionedOrphanDropped(t *testing.T) {
	t.Parallel()
	ways := []string{"cancel", "terminate"}
	if pgtest.PgBouncer() {
		// Behind PgBouncer the cleaner's server session is not its own: only
		// its context can be cut.
		ways = ways[:1]
	}
	for _, way := range ways {
		t.Run(way, func(t *testing.T) {
			t.Parallel()
			// 2-second partitions; Setup's past partition ends at the current one.
			b := setupPartitioned(t, pgdedup.Config{Retention: 2 * time.Minute, Partitions: 60})
			ctx := ctxT(t)
			bounds := func(partition string) (from, to time.Time) {
				t.Helper()
				if err := b.pool.QueryRow(ctx, `SELECT b.m[1]::timestamptz, b.m[2]::timestamptz FROM pg_class c,
regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS b(m) WHERE c.oid = $1::regclass`,
					partition).Scan(&from, &to); err != nil {
					t.Fatal(err)
				}
				return from, to
			}
			var past, ahead string
			if err := b.pool.QueryRow(ctx, `SELECT min(c.relname::text), max(c.relname::text) FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'processed_messages'::regclass`).Scan(&past, &ahead); err != nil {
				t.Fatal(err)
			}
			pastFrom, pastTo := bounds(past)
			mustExec(t, b.pool, `CREATE TABLE processed_messages_p19990101t000000 (LIKE processed_messages)`)
			mustExec(t, b.pool, `CREATE TABLE processed_messages_p20000101t000000 (LIKE processed_messages)`)
			mustExec(t, b.pool, `COMMENT ON TABLE processed_messages_p20000101t000000 IS
'pgdedup: detached from other to be dropped; it held 2000-01-01T00:00:00Z to 2000-01-01T00:00:02Z'`)
			mustExec(t, b.pool, `CREATE TABLE archive (LIKE processed_messages)`)
			mustExec(t, b.pool, `COMMENT ON TABLE archive IS
'pgdedup: detached from processed_messages to be dropped; it held 2000-01-01T00:00:00Z to 2000-01-01T00:00:02Z'`)
			// As a detach cut short leaves it: marked, still attached.
			from, to := bounds(ahead)
			mustExec(t, b.pool, fmt.Sprintf(`COMMENT ON TABLE %s IS 'pgdedup: detached from processed_messages to be dropped; it held %s to %s'`,
				ahead, from.UTC().Format(time.RFC3339Nano), to.UTC().Format(time.RFC3339Nano)))

			// The tables of the schema, by name, with their OIDs: a table
			// dropped and made again has another.
			tables := func() map[string]uint32 {
				rows, _ := b.pool.Query(ctx, `SELECT relname::text, oid FROM pg_class
WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')`)
				oids, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv struct {
					name string
					oid  uint32
				}, err error) {
					return kv, r.Scan(&kv.name, &kv.oid)
				})
				if err != nil {
					t.Fatal(err)
				}
				m := map[string]uint32{}
				for _, kv := range oids {
					m[kv.name] = kv.oid
				}
				return m
			}
			before := tables()

			// The cleaner: a Retention of a second, so that the past partition
			// may go after the next switch; on a pool of its own for "terminate".
			app := "pgdedup-orphan-" + b.db.Schema
			u, err := url.Parse(b.db.URL)
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("application_name", app)
			u.RawQuery = q.Encode()
			cleaner, err := pgdedup.New(pgtest.Pool(t, u.String(), 2), pgdedup.Config{Consumer: "cleaner", Retention: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			pgdedup.SetPartitionWaits(cleaner, 10*time.Millisecond, 10*time.Second)
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			var interrupted []string
			var once sync.Once
			pgdedup.SetAfterDetach(cleaner, func(partition string) {
				once.Do(func() {
					interrupted = append(interrupted, partition)
					if way == "cancel" {
						stop()
						return
					}
					if n := pgtest.Count(t, b.pool, `SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity WHERE application_name = $1`, app); n == 0 {
						t.Errorf("no session of the cleaner to terminate")
					}
				})
			})
			waitSwitch(t, b.pool)
			if _, err := cleaner.Cleanup(runCtx); err == nil {
				t.Fatal("Cleanup interrupted before its DROP TABLE returned nil")
			}
			if !slices.Equal(interrupted, []string{past}) {
				t.Fatalf("interrupted after detaching %v, want %s", interrupted, past)
			}
			if n := pgtest.Count(t, b.pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass($1) AND NOT relispartition`, past); n != 1 {
				t.Fatalf("%s: want it left behind, detached", past)
			}

			events := make(chan pgdedup.Event, 1)
			next, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "next", Retention: 2 * time.Minute,
				OnEvent: func(_ context.Context, e pgdedup.Event) { events <- e }})
			if err != nil {
				t.Fatal(err)
			}
			pgdedup.SetPartitionWaits(next, 10*time.Millisecond, 10*time.Second)
			// Sealing 2-second partitions with a 10 ms wait may fall a span
			// behind on a loaded machine (Citus): that is reported, and the
			// orphan is dropped all the same.
			if _, err := next.Cleanup(ctx); err != nil && !errors.Is(err, pgdedup.ErrCleanupStarved) {
				t.Fatal(err)
			}
			after := tables()
			for name, oid := range before {
				if gone := after[name] != oid; gone != (name == past) {
					t.Errorf("%s: gone=%v after the next Cleanup, want %v", name, gone, name == past)
				}
			}
			e := receive(t, events, "the next Cleanup's event")
			if want := (pgdedup.PartitionSpan{Name: past, From: pastFrom, To: pastTo}); len(e.Dropped) != 1 || e.Dropped[0].Name != want.Name ||
				!e.Dropped[0].From.Equal(want.From) || !e.Dropped[0].To.Equal(want.To) {
				t.Errorf("the next Cleanup reported dropped %+v, want %+v alone", e.Dropped, want)
			}
			if processed, err := b.store.Process(ctx, "m1", charge("m1")); err != nil || !processed {
				t.Errorf("a claim after: processed=%v err=%v", processed, err)
			}
		})
	}
}
