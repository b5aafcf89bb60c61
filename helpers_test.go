package pgdedup_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// bundle is what most tests need: a migrated schema, a Store on it and a
// business table, charges, with one row per charged order.
type bundle struct {
	db    *pgtest.DB
	pool  *pgxpool.Pool
	store *pgdedup.Store
	times *sentTimes // the IDs' times, if claims carry them (see opts)
}

func setup(t *testing.T, cfg pgdedup.Config) *bundle {
	t.Helper()
	db := pgtest.New(t)
	if cfg.Consumer == "" {
		cfg.Consumer = "billing"
	}
	store, err := pgdedup.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db.Pool, `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL, consumer text NOT NULL DEFAULT '')`)
	db.Distribute(t, "charges", "id", false)
	return &bundle{db: db, pool: db.Pool, store: store}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func mustExec(t testing.TB, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// charge is the business write of the tests.
func charge(orderID string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id) VALUES ($1)`, orderID)
		return err
	}
}

// chargesPerOrder returns how many charges each order has.
func chargesPerOrder(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	return pgtest.CountBy(t, pool, `SELECT order_id, count(*) FROM charges GROUP BY order_id`)
}

// recorded reports whether id is in processed_messages for consumer.
func recorded(t *testing.T, pool *pgxpool.Pool, consumer, id string) bool {
	t.Helper()
	var ok bool
	err := pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM processed_messages WHERE consumer = $1 AND message_id = $2)`, consumer, id).Scan(&ok)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// acquiredConns returns the pool's acquired connections once they have settled:
// a connection closed after a cancelled query is destroyed asynchronously and
// counts as acquired until then.
func acquiredConns(pool *pgxpool.Pool) int32 {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := pool.Stat().AcquiredConns()
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// batchIDs returns n distinct IDs starting at from.
func batchIDs(from, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("msg-%07d", from+i)
	}
	return ids
}

// uniqueInOrder removes repeats from ids, keeping first appearances.
func uniqueInOrder(ids []string) []string {
	seen := map[string]bool{}
	return slices.DeleteFunc(ids, func(id string) bool { dup := seen[id]; seen[id] = true; return dup })
}

// eventLog keeps the events reported to Config.OnEvent.
type eventLog struct {
	mu     sync.Mutex
	events []pgdedup.Event
}

func (l *eventLog) add(_ context.Context, e pgdedup.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// cleanups returns the EventCleanup events so far.
func (l *eventLog) cleanups() []pgdedup.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []pgdedup.Event
	for _, e := range l.events {
		if e.Kind == pgdedup.EventCleanup {
			out = append(out, e)
		}
	}
	return out
}

// countedStore returns a Store for consumer "billing" on a pool of one
// connection to b's schema that goes through a counting proxy, the pool, and
// measure, which runs f, fails t if f errs, and returns the round trips f made.
func countedStore(t *testing.T, b *bundle) (store *pgdedup.Store, pool *pgxpool.Pool, measure func(f func() error) int64) {
	t.Helper()
	proxy, proxied := pgtest.NewProxy(t, b.db.URL, wireproxy.Config{})
	pool = pgtest.Pool(t, proxied, 1)
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	return store, pool, func(f func() error) int64 {
		t.Helper()
		before := proxy.RoundTrips()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return proxy.RoundTrips() - before
	}
}

// rolePool returns a pool logged in as a new role, and its name, that may
// write charges and has on pgdedup's tables only what grants give it: each is
// a GRANT statement whose grantee is %s.
func rolePool(t *testing.T, b *bundle, grants ...string) (*pgxpool.Pool, string) {
	t.Helper()
	role, url := b.db.NewRole(t)
	grants = append(grants, `GRANT SELECT, INSERT ON charges TO %s`, `GRANT USAGE ON SEQUENCE charges_id_seq TO %s`)
	for _, g := range grants {
		mustExec(t, b.pool, fmt.Sprintf(g, role))
	}
	return pgtest.Pool(t, url, 4), role
}

// expire makes every row of consumer in b's table expired, as if its
// Retention had passed.
func expire(t *testing.T, b *bundle, consumer string) {
	t.Helper()
	mustExec(t, b.pool, `UPDATE processed_messages SET expires_at = now() - interval '1 second' WHERE consumer = $1`, consumer)
}
