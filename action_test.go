package pgdedup_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

func TestActionString(t *testing.T) {
	t.Parallel()
	for a, want := range map[pgdedup.Action]string{
		pgdedup.ActionAck:        "ack",
		pgdedup.ActionRequeue:    "requeue",
		pgdedup.ActionStop:       "stop",
		pgdedup.ActionDeadLetter: "dead-letter",
		pgdedup.Action(9):        "Action(9)",
	} {
		if got := a.String(); got != want {
			t.Errorf("Action(%d).String() = %q, want %q", int(a), got, want)
		}
	}
}

// A consumer settles each message as ActionFor says.
func ExampleActionFor() {
	for _, err := range []error{
		nil, // processed, or a duplicate
		fmt.Errorf("consume: %w", pgdedup.ErrInFlight),
		context.Canceled, // SIGTERM
		pgdedup.ErrInvalidMessageID,
	} {
		fmt.Println(pgdedup.ActionFor(err))
	}
	// Output:
	// ack
	// requeue
	// stop
	// dead-letter
}

// errorTableRow is a row of the table in docs/errors.md.
type errorTableRow struct {
	error  string   // the first column, as written
	names  []string // the first column's code spans
	action pgdedup.Action
}

// errorTable returns the rows of the table in docs/errors.md.
func errorTable(t *testing.T) []errorTableRow {
	t.Helper()
	b, err := os.ReadFile("docs/errors.md")
	if err != nil {
		t.Fatal(err)
	}
	actions := map[string]pgdedup.Action{}
	for _, a := range []pgdedup.Action{pgdedup.ActionAck, pgdedup.ActionRequeue, pgdedup.ActionStop, pgdedup.ActionDeadLetter} {
		actions["`"+actionName(a)+"`"] = a
	}
	var rows []errorTableRow
	for line := range strings.SplitSeq(string(b), "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| ") || len(cells) != 5 || strings.TrimSpace(cells[1]) == "error" {
			continue
		}
		row := errorTableRow{error: strings.TrimSpace(cells[1])}
		a, ok := actions[strings.TrimSpace(cells[2])]
		if !ok {
			t.Errorf("docs/errors.md: %q has action %q, not one of %v", row.error, strings.TrimSpace(cells[2]), actions)
		}
		row.action = a
		spans := strings.Split(row.error, "`")
		for i := 1; i < len(spans); i += 2 {
			row.names = append(row.names, spans[i])
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		t.Fatal("docs/errors.md has no error table")
	}
	return rows
}

// actionName is the Go name of a.
func actionName(a pgdedup.Action) string {
	return map[pgdedup.Action]string{
		pgdedup.ActionAck:        "ActionAck",
		pgdedup.ActionRequeue:    "ActionRequeue",
		pgdedup.ActionStop:       "ActionStop",
		pgdedup.ActionDeadLetter: "ActionDeadLetter",
	}[a]
}

// exportedErrors returns the exported errors of the root package, read from
// its source: every exported variable named Err…, and every exported type
// with an Error method (as *T for a pointer receiver).
func exportedErrors(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.GenDecl:
				if d.Tok != token.VAR {
					continue
				}
				for _, spec := range d.Specs {
					for _, n := range spec.(*ast.ValueSpec).Names {
						if n.IsExported() && strings.HasPrefix(n.Name, "Err") {
							names = append(names, n.Name)
						}
					}
				}
			case *ast.FuncDecl:
				if d.Recv == nil || d.Name.Name != "Error" || d.Type.Params.NumFields() != 0 {
					continue
				}
				recv := d.Recv.List[0].Type
				star := ""
				if s, ok := recv.(*ast.StarExpr); ok {
					recv, star = s.X, "*"
				}
				if id, ok := recv.(*ast.Ident); ok && id.IsExported() {
					names = append(names, star+id.Name)
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

// TestDocsErrorTable checks that the table of docs/errors.md lists every
// error the package exports, once.
func TestDocsErrorTable(t *testing.T) {
	t.Parallel()
	listed := map[string]int{}
	for _, row := range errorTable(t) {
		for _, n := range row.names {
			listed[n]++
		}
	}
	exported := exportedErrors(t)
	if len(exported) < 10 || !slices.Contains(exported, "*ConfigError") || !slices.Contains(exported, "ErrInFlight") {
		t.Fatalf("found only these exported errors in the source: %v", exported)
	}
	for _, name := range exported {
		switch listed[name] {
		case 1:
		case 0:
			t.Errorf("docs/errors.md does not list %s", name)
		default:
			t.Errorf("docs/errors.md lists %s %d times", name, listed[name])
		}
	}
}

// TestActionForEveryDocumentedError produces each error of the table in
// docs/errors.md the way a consumer meets it, against the database where it
// comes from the database, and checks that ActionFor answers what the table
// says, for the error as returned and wrapped.
func TestActionForEveryDocumentedError(t *testing.T) {
	t.Parallel()
	produce := actionCases()
	rows := errorTable(t)
	for _, row := range rows {
		if produce[row.error] == nil {
			t.Errorf("docs/errors.md lists %q, which this test does not produce", row.error)
		}
	}
	for name := range produce {
		if !slices.ContainsFunc(rows, func(r errorTableRow) bool { return r.error == name }) {
			t.Errorf("this test produces %q, which docs/errors.md does not list", name)
		}
	}
	for _, row := range rows {
		f := produce[row.error]
		if f == nil {
			continue
		}
		t.Run(row.error, func(t *testing.T) {
			t.Parallel()
			err := f(t)
			t.Logf("error: %v", err)
			if got := pgdedup.ActionFor(err); got != row.action {
				t.Errorf("ActionFor(%v) = %v, want %v", err, got, row.action)
			}
			if err == nil {
				return
			}
			for _, wrapped := range []error{
				fmt.Errorf("consume order 7: %w", err),
				fmt.Errorf("handler: %w", fmt.Errorf("consume: %w", err)),
			} {
				if got := pgdedup.ActionFor(wrapped); got != row.action {
					t.Errorf("ActionFor(%v) = %v, want %v", wrapped, got, row.action)
				}
			}
		})
	}
}

// actionCases returns, by the first column of the table in docs/errors.md,
// a function that produces the error of that row.
func actionCases() map[string]func(t *testing.T) error {
	processWith := func(t *testing.T, cfg pgdedup.Config, fn func(ctx context.Context, tx pgx.Tx) error, opts ...pgdedup.Option) error {
		t.Helper()
		b := setup(t, cfg)
		_, err := b.store.Process(ctxT(t), "m1", fn, opts...)
		return err
	}
	// inFn is a Process whose fn runs sql after charging the order.
	inFn := func(t *testing.T, cfg pgdedup.Config, sql string) error {
		t.Helper()
		return processWith(t, cfg, func(ctx context.Context, tx pgx.Tx) error {
			if err := charge("o1")(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		})
	}
	return map[string]func(t *testing.T) error{
		"`nil` (processed, or a duplicate)": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			for range 2 {
				if _, err := b.store.Process(ctxT(t), "m1", charge("o1")); err != nil {
					return err
				}
			}
			if n := chargesPerOrder(t, b.pool)["o1"]; n != 1 {
				t.Errorf("o1 charged %d times, want once", n)
			}
			return nil
		},
		// Deprecated and no longer returned: an expired row not yet deleted
		// is a duplicate with its answer (checked here), and the sentinel
		// itself still answers ack for callers that kept their own check.
		"`ErrResultExpired`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			answer := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("ok"), nil }
			if _, _, err := b.store.ProcessResult(ctxT(t), "m1", answer); err != nil {
				t.Fatal(err)
			}
			expire(t, b, "billing")
			got, processed, err := b.store.ProcessResult(ctxT(t), "m1", answer)
			if err != nil || processed || string(got) != "ok" {
				t.Errorf("ProcessResult of an expired ID = %q, %v, %v; want the stored answer as a duplicate", got, processed, err)
			}
			return pgdedup.ErrResultExpired
		},
		// A shutdown: the context is canceled while fn's statement runs.
		"`context.Canceled` mid-call": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			ctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			app := fmt.Sprintf("action-cancel-%d", time.Now().UnixNano())
			poll := ctxT(t)
			go func() {
				defer cancel()
				for ctx.Err() == nil {
					var n int
					if err := b.pool.QueryRow(poll, `SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE $1`, "%"+app+"%").Scan(&n); err != nil || n > 0 {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
			_, err := b.store.Process(ctx, "m1", func(ctx context.Context, tx pgx.Tx) error {
				if err := charge("o1")(ctx, tx); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `SELECT pg_sleep(60) /* `+app+` */`)
				return err
			})
			if recorded(t, b.pool, "billing", "m1") || chargesPerOrder(t, b.pool)["o1"] != 0 {
				t.Error("a canceled Process recorded its ID or charged the order")
			}
			return err
		},
		"`ErrFenced`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			ctx := ctxT(t)
			noop := func(context.Context, pgx.Tx, []int64) error { return nil }
			if _, err := b.store.ProcessOffsets(ctx, pgdedup.TopicPartition{Topic: "orders", Generation: 2}, []int64{1}, noop); err != nil {
				t.Fatal(err)
			}
			_, err := b.store.ProcessOffsets(ctx, pgdedup.TopicPartition{Topic: "orders", Generation: 1}, []int64{2}, noop)
			return err
		},
		"`context.DeadlineExceeded`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			ctx, cancel := context.WithTimeout(ctxT(t), 200*time.Millisecond)
			defer cancel()
			_, err := b.store.Process(ctx, "m1", func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT pg_sleep(60)`)
				return err
			})
			return err
		},
		"`ErrInFlight`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{LockTimeout: 100 * time.Millisecond})
			ctx := ctxT(t)
			holder, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(ctx)
			if _, err := b.store.Claim(ctx, holder, "m1"); err != nil {
				t.Fatal(err)
			}
			_, err = b.store.Process(ctx, "m1", charge("o1"))
			return err
		},
		"`ErrCleanupStarved`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{CleanupTurnWait: 200 * time.Millisecond})
			ctx := ctxT(t)
			pgtest.Seed(t, b.pool, "billing", "old-", 10, -time.Hour)
			holder, err := connect(t, b.db.URL).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(ctx)
			mustExec(t, holder, `SELECT pg_advisory_xact_lock(1885824100, 'processed_messages'::regclass::oid::int4)`)
			_, err = b.store.Cleanup(ctx)
			return err
		},
		// The server ends fn's connection: pgdedup retries up to MaxAttempts,
		// then returns the error.
		"`57P01` admin shutdown, a lost connection": func(t *testing.T) error {
			return inFn(t, pgdedup.Config{MaxAttempts: 1}, `SELECT pg_terminate_backend(pg_backend_pid())`)
		},
		// A serialization failure of fn's own transaction: another one
		// changes the row after its snapshot (a table of the coordinator's
		// own on Citus, whose workers take snapshots of their own).
		"`40001` serialization failure, `40P01` deadlock": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{MaxAttempts: 1, TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}})
			ctx := ctxT(t)
			mustExec(t, b.pool, `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)`)
			mustExec(t, b.pool, `INSERT INTO accounts VALUES (1, 0)`)
			_, err := b.store.Process(ctx, "m1", func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SELECT balance FROM accounts WHERE id = 1`); err != nil {
					return err
				}
				mustExec(t, b.pool, `UPDATE accounts SET balance = balance + 1 WHERE id = 1`)
				_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 10 WHERE id = 1`)
				return err
			})
			return err
		},
		// A role with no connection left: the connection cannot be opened.
		"`53300` too many connections (class `53`)": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			role, url := b.db.NewRole(t)
			mustExec(t, b.pool, `ALTER ROLE `+role+` CONNECTION LIMIT 0`)
			pool, err := pgxpool.New(ctxT(t), url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", MaxAttempts: 1})
			if err != nil {
				t.Fatal(err)
			}
			_, err = store.Process(ctxT(t), "m1", charge("o1"))
			return err
		},
		"`57014` statement timeout": func(t *testing.T) error {
			return inFn(t, pgdedup.Config{}, `SET LOCAL statement_timeout = '100ms'; SELECT pg_sleep(60)`)
		},
		// fn waits for a lock another transaction holds.
		"`55P03` lock timeout in `fn`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			ctx := ctxT(t)
			mustExec(t, b.pool, `INSERT INTO charges (id, order_id) VALUES (1, 'o1')`)
			holder, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(ctx)
			mustExec(t, holder, `SELECT FROM charges WHERE id = 1 FOR UPDATE`)
			_, err = b.store.Process(ctx, "m1", func(ctx context.Context, tx pgx.Tx) error {
				// On Citus the worker that holds the row waits, and only a
				// propagated SET LOCAL bounds it there (plain PostgreSQL
				// takes citus.propagate_set_commands as a placeholder).
				_, err := tx.Exec(ctx, `SET LOCAL citus.propagate_set_commands = 'local'; SET LOCAL lock_timeout = '100ms';
UPDATE charges SET order_id = 'o2' WHERE id = 1`)
				return err
			})
			return err
		},
		// A partitioned table whose partitions the clock has passed, as when
		// no cleaner ran for the partitions ahead: here they are dropped.
		"`23514` no partition for a claim": func(t *testing.T) error {
			b := setupPartitioned(t, pgdedup.Config{Retention: time.Hour})
			ctx := ctxT(t)
			rows, err := b.pool.Query(ctx, `SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'processed_messages'::regclass`)
			if err != nil {
				t.Fatal(err)
			}
			partitions, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || len(partitions) == 0 {
				t.Fatalf("partitions %v: %v", partitions, err)
			}
			for _, p := range partitions {
				mustExec(t, b.pool, `DROP TABLE `+p)
			}
			_, err = b.store.Process(ctx, "m1", charge("o1"))
			if chargesPerOrder(t, b.pool)["o1"] != 0 {
				t.Error("a claim that found no partition charged the order")
			}
			return err
		},
		"`ErrInvalidMessageID`": func(t *testing.T) error {
			_, err := setup(t, pgdedup.Config{}).store.Process(ctxT(t), "", charge("o1"))
			return err
		},
		"`ErrBatchTooLarge`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{MaxBatch: 2})
			_, err := b.store.ProcessBatch(ctxT(t), []string{"m1", "m2", "m3"}, func(context.Context, pgx.Tx, []string) error { return nil })
			return err
		},
		"`ErrInvalidOffset`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			_, err := b.store.ProcessOffsets(ctxT(t), pgdedup.TopicPartition{Topic: "orders", Partition: -1}, []int64{1}, func(context.Context, pgx.Tx, []int64) error { return nil })
			return err
		},
		"`ErrInvalidOption`": func(t *testing.T) error {
			return processWith(t, pgdedup.Config{}, charge("o1"), pgdedup.WithRetention(time.Millisecond))
		},
		"`ErrPayloadMismatch`, `*PayloadMismatchError`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			if _, err := b.store.Process(ctxT(t), "m1", charge("o1"), pgdedup.WithFingerprint([]byte("order 1, 10 EUR"))); err != nil {
				t.Fatal(err)
			}
			_, err := b.store.Process(ctxT(t), "m1", charge("o1"), pgdedup.WithFingerprint([]byte("order 1, 99 EUR")))
			var mismatch *pgdedup.PayloadMismatchError
			if !errors.As(err, &mismatch) {
				t.Errorf("a reused ID: %v, want a *PayloadMismatchError", err)
			}
			return err
		},
		"`ErrResultTooLarge`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			_, _, err := b.store.ProcessResult(ctxT(t), "m1", func(context.Context, pgx.Tx) ([]byte, error) {
				return []byte("a long answer"), nil
			}, pgdedup.WithMaxResultBytes(4))
			return err
		},
		"`ErrTooLate`": func(t *testing.T) error {
			return processWith(t, pgdedup.Config{}, charge("o1"), pgdedup.WithSentAt(time.Now().Add(-30*24*time.Hour)))
		},
		"`*ConfigError`": func(t *testing.T) error {
			_, err := pgdedup.New(pgtest.New(t).Pool, pgdedup.Config{Consumer: "billing", Retention: -time.Hour})
			return err
		},
		"`ErrMigratedByAnotherTool`": func(t *testing.T) error {
			db := pgtest.NewUnmigrated(t)
			sqlDB := stdlib.OpenDBFromPool(db.Pool)
			defer sqlDB.Close()
			host, err := goose.NewProvider(goose.DialectPostgres, sqlDB, pgdedup.Migrations())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := host.Up(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			return pgdedup.Migrate(ctxT(t), sqlDB)
		},
		"`23514` CHECK violation in `fn`": func(t *testing.T) error {
			b := setup(t, pgdedup.Config{})
			mustExec(t, b.pool, `ALTER TABLE charges ADD CONSTRAINT charges_order_id_check CHECK (order_id <> 'o-bad')`)
			_, err := b.store.Process(ctxT(t), "m1", charge("o-bad"))
			return err
		},
		"`42P01` and other database errors in `fn`": func(t *testing.T) error {
			return inFn(t, pgdedup.Config{}, `INSERT INTO refunds (order_id) VALUES ('o1')`)
		},
		"`fn`'s own error (a declined card, an HTTP `io.EOF`)": func(t *testing.T) error {
			for _, want := range []error{errors.New("card declined"), io.EOF} {
				err := processWith(t, pgdedup.Config{}, func(context.Context, pgx.Tx) error { return want })
				if !errors.Is(err, want) || pgdedup.ActionFor(err) != pgdedup.ActionDeadLetter {
					t.Errorf("fn returned %v: Process returned %v, ActionFor %v", want, err, pgdedup.ActionFor(err))
				}
			}
			return fmt.Errorf("charge o1: %w", errors.New("card declined"))
		},
	}
}
