// Package libpq checks pgdedup through lib/pq, the other common database/sql
// driver: its errors carry the SQLSTATE through a SQLState method rather than
// as a *pgconn.PgError. It lives in the development module so that lib/pq
// stays out of the root go.mod.
package libpq_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// open returns a lib/pq *sql.DB on a migrated schema of t's own, and a Store
// for it.
func open(t *testing.T, cfg pgdedup.Config) (*sql.DB, *pgdedup.Store, context.Context) {
	t.Helper()
	db := pgtest.New(t)
	// default_query_exec_mode is pgx's (the PgBouncer pass sets it); lib/pq
	// would send it to the server as a setting.
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del("default_query_exec_mode")
	u.RawQuery = q.Encode()
	sqlDB, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sqlDB.Close() })
	if cfg.Consumer == "" {
		cfg.Consumer = "billing"
	}
	store, err := pgdedup.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return sqlDB, store, ctx
}

// A serialization failure and a deadlock raised by the server through lib/pq
// are transient; a unique violation is not.
func TestIsTransientThroughLibPQ(t *testing.T) {
	t.Parallel()
	sqlDB, _, ctx := open(t, pgdedup.Config{})
	for code, want := range map[string]bool{"40001": true, "40P01": true, "23505": false} {
		_, err := sqlDB.ExecContext(ctx, fmt.Sprintf(`DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '%s'; END $$`, code))
		var pqErr *pq.Error
		if !errors.As(err, &pqErr) || string(pqErr.Code) != code {
			t.Fatalf("%s: got %v (%T), want a *pq.Error with that code", code, err, err)
		}
		if got := pgdedup.IsTransient(err); got != want {
			t.Errorf("IsTransient(%s through lib/pq) = %v, want %v", code, got, want)
		}
		if got := pgdedup.IsTransient(fmt.Errorf("charge: %w", err)); got != want {
			t.Errorf("IsTransient(wrapped %s through lib/pq) = %v, want %v", code, got, want)
		}
	}
}

// ClaimSQL in a lib/pq transaction: a new ID is claimed once, and an ID held
// by another open transaction gives ErrInFlight (its lock timeout, 55P03,
// read through lib/pq's error) when Config.LockTimeout is set.
func TestClaimSQLThroughLibPQ(t *testing.T) {
	t.Parallel()
	sqlDB, store, ctx := open(t, pgdedup.Config{LockTimeout: 50 * time.Millisecond})
	holder, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback() //nolint:errcheck
	if claimed, err := store.ClaimSQL(ctx, holder, "busy"); err != nil || !claimed {
		t.Fatalf("holder: claimed=%v err=%v", claimed, err)
	}

	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if claimed, err := store.ClaimSQL(ctx, tx, "free"); err != nil || !claimed {
		t.Fatalf("free ID: claimed=%v err=%v", claimed, err)
	}
	// The session has no lock_timeout of its own: only LockTimeout can end
	// the wait for the holder, which stays open.
	_, err = store.ClaimSQL(ctx, tx, "busy")
	if !errors.Is(err, pgdedup.ErrInFlight) {
		t.Fatalf("claim of an ID held elsewhere: %v, want ErrInFlight", err)
	}
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "55P03" {
		t.Errorf("ErrInFlight does not wrap lib/pq's 55P03: %v", err)
	}
	_ = tx.Rollback()

	// The held ID once its holder committed: a duplicate.
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	tx2, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback() //nolint:errcheck
	if claimed, err := store.ClaimSQL(ctx, tx2, "busy"); err != nil || claimed {
		t.Fatalf("committed ID: claimed=%v err=%v, want a duplicate", claimed, err)
	}
}
