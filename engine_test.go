package pgdedup_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// claimKind is one way of claiming, run on one item: a message ID, or for
// offsets the topic "t-"+item at offset 1 ("poison" is the topic poison).
type claimKind struct {
	name string
	inTx bool // a claim in the caller's transaction, as opposed to a Process call
	run  func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error)
	// process, for the Process calls, runs fn in place of charging item.
	process func(ctx context.Context, s *pgdedup.Store, item string, fn func(context.Context, pgx.Tx) error) (bool, error)
	nilArg  func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error // with a nil tx or fn
}

type engineBundle struct {
	*bundle
	sqlDB *sql.DB
}

func offsetsOf(item string) pgdedup.TopicPartition {
	if item == "poison" {
		return pgdedup.TopicPartition{Topic: "poison"}
	}
	return pgdedup.TopicPartition{Topic: "t-" + item}
}

// inPgxTx and inSQLTx run claim in a transaction of their own, committed when
// claim succeeds.
func inPgxTx(ctx context.Context, e *engineBundle, claim func(pgx.Tx) (bool, error)) (bool, error) {
	var ok bool
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) (err error) { ok, err = claim(tx); return err })
	return ok, err
}

func inSQLTx(ctx context.Context, e *engineBundle, claim func(*sql.Tx) (bool, error)) (bool, error) {
	tx, err := e.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	ok, err := claim(tx)
	if err != nil {
		_ = tx.Rollback()
		return false, err
	}
	return ok, tx.Commit()
}

var claimKinds = []claimKind{
	{name: "Process",
		run: func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error) {
			return s.Process(ctx, item, charge(item))
		},
		process: func(ctx context.Context, s *pgdedup.Store, item string, fn func(context.Context, pgx.Tx) error) (bool, error) {
			return s.Process(ctx, item, fn)
		},
		nilArg: func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error {
			_, err := s.Process(ctx, "x", nil)
			return err
		}},
	{name: "ProcessBatch",
		run: func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error) {
			fresh, err := s.ProcessBatch(ctx, []string{item}, func(ctx context.Context, tx pgx.Tx, _ []string) error { return charge(item)(ctx, tx) })
			return len(fresh) == 1, err
		},
		process: func(ctx context.Context, s *pgdedup.Store, item string, fn func(context.Context, pgx.Tx) error) (bool, error) {
			fresh, err := s.ProcessBatch(ctx, []string{item}, func(ctx context.Context, tx pgx.Tx, _ []string) error { return fn(ctx, tx) })
			return len(fresh) == 1, err
		},
		nilArg: func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error {
			_, err := s.ProcessBatch(ctx, []string{"x"}, nil)
			return err
		}},
	{name: "ProcessOffsets",
		run: func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error) {
			fresh, err := s.ProcessOffsets(ctx, offsetsOf(item), []int64{1}, func(ctx context.Context, tx pgx.Tx, _ []int64) error { return charge(item)(ctx, tx) })
			return len(fresh) == 1, err
		},
		process: func(ctx context.Context, s *pgdedup.Store, item string, fn func(context.Context, pgx.Tx) error) (bool, error) {
			fresh, err := s.ProcessOffsets(ctx, offsetsOf(item), []int64{1}, func(ctx context.Context, tx pgx.Tx, _ []int64) error { return fn(ctx, tx) })
			return len(fresh) == 1, err
		},
		nilArg: func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error {
			_, err := s.ProcessOffsets(ctx, offsetsOf("x"), []int64{1}, nil)
			return err
		}},
	{name: "Claim", inTx: true,
		run: func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error) {
			return inPgxTx(ctx, e, func(tx pgx.Tx) (bool, error) { return s.Claim(ctx, tx, item) })
		},
		nilArg: func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error {
			_, err := s.Claim(ctx, nil, "x")
			return err
		}},
	{name: "ClaimBatch", inTx: true,
		run: func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error) {
			return inPgxTx(ctx, e, func(tx pgx.Tx) (bool, error) {
				fresh, err := s.ClaimBatch(ctx, tx, []string{item})
				return len(fresh) == 1, err
			})
		},
		nilArg: func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error {
			_, err := s.ClaimBatch(ctx, nil, []string{"x"})
			return err
		}},
	{name: "ClaimOffsets", inTx: true,
		run: func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error) {
			return inPgxTx(ctx, e, func(tx pgx.Tx) (bool, error) {
				fresh, err := s.ClaimOffsets(ctx, tx, offsetsOf(item), []int64{1})
				return len(fresh) == 1, err
			})
		},
		nilArg: func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error {
			_, err := s.ClaimOffsets(ctx, nil, offsetsOf("x"), []int64{1})
			return err
		}},
	{name: "ClaimSQL", inTx: true,
		run: func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error) {
			return inSQLTx(ctx, e, func(tx *sql.Tx) (bool, error) { return s.ClaimSQL(ctx, tx, item) })
		},
		nilArg: func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error {
			_, err := s.ClaimSQL(ctx, nil, "x")
			return err
		}},
	{name: "ClaimBatchSQL", inTx: true,
		run: func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error) {
			return inSQLTx(ctx, e, func(tx *sql.Tx) (bool, error) {
				fresh, err := s.ClaimBatchSQL(ctx, tx, []string{item})
				return len(fresh) == 1, err
			})
		},
		nilArg: func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error {
			_, err := s.ClaimBatchSQL(ctx, nil, []string{"x"})
			return err
		}},
	{name: "ClaimOffsetsSQL", inTx: true,
		run: func(ctx context.Context, e *engineBundle, s *pgdedup.Store, item string) (bool, error) {
			return inSQLTx(ctx, e, func(tx *sql.Tx) (bool, error) {
				fresh, err := s.ClaimOffsetsSQL(ctx, tx, offsetsOf(item), []int64{1})
				return len(fresh) == 1, err
			})
		},
		nilArg: func(ctx context.Context, e *engineBundle, s *pgdedup.Store) error {
			_, err := s.ClaimOffsetsSQL(ctx, nil, offsetsOf("x"), []int64{1})
			return err
		}},
}

// Every kind of claim (one ID, a batch, a partition's offsets; through a
// Process call, in a pgx transaction, in a database/sql transaction; on plain
// PostgreSQL and, in the Citus pass, on distributed tables) goes through one
// engine, so each gets the same answers: a duplicate is skipped and reported
// as an EventDuplicate; a nil tx or fn is an error, not a panic; a statement
// the server refuses comes back naming what was claimed, with the server's
// DETAIL; a claim held elsewhere past LockTimeout is ErrInFlight and an
// EventInFlight; a missing table says to run Migrate.
func TestEveryClaimKindAnswersAlike(t *testing.T) {
	t.Parallel()
	for _, k := range claimKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			events := map[pgdedup.EventKind]int64{}
			onEvent := func(_ context.Context, ev pgdedup.Event) {
				mu.Lock()
				defer mu.Unlock()
				events[ev.Kind] += ev.Count
			}
			countOf := func(kind pgdedup.EventKind) int64 {
				mu.Lock()
				defer mu.Unlock()
				return events[kind]
			}
			b := setup(t, pgdedup.Config{OnEvent: onEvent, LockTimeout: 100 * time.Millisecond})
			b.db.Distribute(t, "processed_offsets", "topic", false)
			mustExec(t, b.pool, `ALTER TABLE processed_messages ADD CONSTRAINT no_poison CHECK (message_id <> 'poison')`)
			mustExec(t, b.pool, `ALTER TABLE processed_offsets ADD CONSTRAINT no_poison CHECK (topic <> 'poison')`)
			mustExec(t, b.pool, `CREATE TABLE settlements (order_id text, UNIQUE (order_id) DEFERRABLE INITIALLY DEFERRED)`)
			b.db.Distribute(t, "settlements", "order_id", false)
			e := &engineBundle{bundle: b, sqlDB: stdlib.OpenDBFromPool(b.pool)}
			defer e.sqlDB.Close()
			ctx := ctxT(t)

			// New, then a duplicate.
			for i, want := range []bool{true, false} {
				if ok, err := k.run(ctx, e, b.store, "a"); err != nil || ok != want {
					t.Fatalf("claim #%d of a: new=%v err=%v, want %v, nil", i+1, ok, err, want)
				}
			}
			if n := countOf(pgdedup.EventDuplicate); n != 1 {
				t.Errorf("%d duplicates reported, want 1", n)
			}
			if n, want := countOf(pgdedup.EventProcessed), map[bool]int64{false: 1, true: 0}[k.inTx]; n != want {
				t.Errorf("%d processed reported, want %d", n, want)
			}

			// A nil transaction or fn.
			if err := k.nilArg(ctx, e, b.store); err == nil || !strings.Contains(err.Error(), "must not be nil") {
				t.Errorf("with a nil argument: err=%v, want one saying it must not be nil", err)
			}

			// A statement the server refuses.
			_, err := k.run(ctx, e, b.store, "poison")
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" || !strings.Contains(err.Error(), "pgdedup: claim ") ||
				!strings.Contains(err.Error(), "poison") || !strings.Contains(err.Error(), "DETAIL: Failing row contains") {
				t.Errorf("a refused claim: err=%v, want check_violation 23514 naming the claim, with the server's DETAIL", err)
			}

			// A COMMIT the server refuses (a deferred unique constraint).
			if k.process != nil {
				_, err := k.process(ctx, b.store, "settle", func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO settlements (order_id) VALUES ('o1'), ('o1')`)
					return err
				})
				// On Citus, a COMMIT of rows on one worker that the worker
				// refuses comes back as Citus's own XX000, without the
				// worker's DETAIL (a two-phase commit's PREPARE passes the
				// worker's error on): which one depends on where the
				// shards of "settle" and "o1" are placed.
				citusOnePhase := pgtest.CitusColumn() != "" && errors.As(err, &pgErr) && pgErr.Code == "XX000" &&
					strings.Contains(err.Error(), "could not commit transaction for shard")
				refused := errors.As(err, &pgErr) && pgErr.Code == "23505" && strings.Contains(err.Error(), "settle") &&
					strings.Contains(err.Error(), "DETAIL: Key (order_id)=(o1) already exists")
				if !(refused || citusOnePhase) || !strings.Contains(err.Error(), "pgdedup: commit ") {
					t.Errorf("a refused COMMIT: err=%v, want unique_violation 23505 naming the claim, with the server's DETAIL", err)
				}
			}

			// Held by another transaction past LockTimeout.
			holder, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(ctx) //nolint:errcheck
			if _, err := b.store.Claim(ctx, holder, "held"); err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.ClaimOffsets(ctx, holder, offsetsOf("held"), []int64{1}); err != nil {
				t.Fatal(err)
			}
			if _, err := k.run(ctx, e, b.store, "held"); !errors.Is(err, pgdedup.ErrInFlight) || pgdedup.IsTransient(err) {
				t.Errorf("a claim held elsewhere: err=%v, want ErrInFlight, not transient", err)
			}
			if n := countOf(pgdedup.EventInFlight); n != 1 {
				t.Errorf("%d in-flight give-ups reported, want 1", n)
			}
			_ = holder.Rollback(ctx)

			// No table.
			missing, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", Table: "nowhere", OffsetTable: "nowhere_offsets"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := k.run(ctx, e, missing, "m"); err == nil || !strings.Contains(err.Error(), "run pgdedup.Migrate") {
				t.Errorf("without the table: err=%v, want one saying to run Migrate", err)
			}
		})
	}
}
