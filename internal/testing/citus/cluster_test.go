package citus

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/citusdist"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// need returns the value of the environment variable name, or ends the test:
// skipped, or failed when CI is set (CI must never skip).
func need(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must run the Citus tests (.ci/citus.sh starts the cluster)", name)
		}
		t.Skipf("%s is not set (see .ci/citus.sh)", name)
	}
	return v
}

// schema is one test's schema on the coordinator, migrated, with
// processed_messages distributed by message_id and a business table, charges,
// co-located with it (one row per charged message, message_id its
// distribution column), so a claim and its charge are one single-shard
// transaction.
type schema struct {
	name  string
	url   string // connects to the schema (search_path)
	pool  *pgxpool.Pool
	admin *pgxpool.Pool // the coordinator's database, for cluster functions
}

// newSchema creates the test's schema with shards shards per table (0:
// Citus's default, 32).
func newSchema(t testing.TB, shards int) *schema {
	t.Helper()
	base := need(t, "TEST_CITUS_URL")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := &schema{name: fmt.Sprintf("pgdedup_citus_%d", time.Now().UnixNano()%1e12)}
	s.admin = pgtest.Pool(t, base, 4)
	if _, err := s.admin.Exec(ctx, "CREATE SCHEMA "+s.name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// After a worker's restart, a session's first statement that reaches
		// it may fail on the connection the coordinator had cached: retry.
		var err error
		for range 3 {
			if _, err = s.admin.Exec(ctx, "DROP SCHEMA "+s.name+" CASCADE"); err == nil {
				return
			}
			time.Sleep(time.Second)
		}
		t.Errorf("drop schema %s: %v", s.name, err)
	})
	var err error
	if s.url, err = pgtest.WithSearchPath(base, s.name); err != nil {
		t.Fatal(err)
	}
	s.pool = pgtest.Pool(t, s.url, 40)
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	if err := pgdedup.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	stmts, err := citusdist.Dedup(`"processed_messages"`, "message_id", shards, "")
	if err != nil {
		t.Fatal(err)
	}
	stmts = append(stmts,
		`CREATE TABLE charges (message_id text PRIMARY KEY, consumer text NOT NULL, amount bigint NOT NULL)`,
		citusdist.Colocate(`"processed_messages"`, citusdist.Colocated{Table: "charges", Column: "message_id"}))
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// store returns a Store on the schema for consumer.
func (s *schema) store(t testing.TB, cfg pgdedup.Config) *pgdedup.Store {
	t.Helper()
	if cfg.Consumer == "" {
		cfg.Consumer = "billing"
	}
	st, err := pgdedup.New(s.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// charge is the business write: one charges row for the message. A second
// row for the same message would violate the primary key, but pgdedup must
// never let it come to that; the tests count rows per message anyway.
func charge(id string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (message_id, consumer, amount) VALUES ($1, 'billing', 100)`, id)
		return err
	}
}

// chargesPerMessage returns how many charges rows each message has.
func (s *schema) chargesPerMessage(t testing.TB) map[string]int {
	t.Helper()
	return pgtest.CountBy(t, s.pool, `SELECT message_id, count(*) FROM charges GROUP BY message_id`)
}

// checkExactlyOnce fails t unless every one of ids has exactly one charge and
// one claim, and nothing else was charged.
func (s *schema) checkExactlyOnce(t testing.TB, ids []string) {
	t.Helper()
	got := s.chargesPerMessage(t)
	doubled, lost := 0, 0
	for _, id := range ids {
		switch n := got[id]; {
		case n == 0:
			lost++
		case n > 1:
			doubled++
		}
	}
	claims := pgtest.Count(t, s.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'billing'`)
	if doubled != 0 || lost != 0 || len(got) != len(ids) || claims != len(ids) {
		t.Fatalf("%d messages: %d doubled, %d lost, %d charged in all, %d claims; want 0, 0, %d, %d",
			len(ids), doubled, lost, len(got), claims, len(ids), len(ids))
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
