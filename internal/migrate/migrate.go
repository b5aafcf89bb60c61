// Package migrate runs pgdedup's goose migrations. It holds the plumbing
// behind the root package's migration API: the goose Provider, its version
// table and lock, and the check that pgdedup's own migrations own the table.
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// Migrator is what the migrations need to know. The root package fills it in.
type Migrator struct {
	// Migrations holds the goose SQL files at its root.
	Migrations fs.FS
	// VersionTable is goose's version table.
	VersionTable string
	// LockTable is the table whose row the migrator holds while it migrates.
	LockTable string
	// LockID is the row of LockTable the migrator holds.
	LockID int64
	// ErrOtherTool is wrapped when another tool made processed_messages.
	ErrOtherTool error
}

// ErrOneConnection is returned by Up, before it touches the database, when db
// allows only one open connection.
var ErrOneConnection = errors.New("pgdedup: migrations need two connections of the *sql.DB at once " +
	"(goose holds one for the run while its lock takes another), and this one allows one (SetMaxOpenConns(1)): " +
	"it would wait forever; allow two, or migrate with another *sql.DB")

// TwoConnections returns ErrOneConnection when db allows only one open
// connection: goose's run holds one, and its lock waits for another. (A
// *sql.DB over a pgxpool.Pool of one connection waits alike, but its limit
// cannot be seen from here.)
func TwoConnections(db *sql.DB) error {
	if db.Stats().MaxOpenConnections == 1 {
		return ErrOneConnection
	}
	return nil
}

// Up applies the migrations db has not seen yet.
// It first checks that pgdedup's own migrations own the table.
func (m Migrator) Up(ctx context.Context, db *sql.DB) error {
	if err := TwoConnections(db); err != nil {
		return err
	}
	if err := m.CheckOwner(ctx, db); err != nil {
		return err
	}
	p, err := m.Provider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P07" { // duplicate_table: made elsewhere, version table empty
			return m.migratedElsewhere(pgErr.SchemaName)
		}
		return fmt.Errorf("pgdedup: migrate: %w", err)
	}
	return nil
}

// CheckOwner returns nil when pgdedup's own migrations may run on db.
// It only reads the catalogs and at most a few rows of the version table.
func (m Migrator) CheckOwner(ctx context.Context, db *sql.DB) error {
	var schema, searchPath sql.NullString
	var table, versions bool
	// In the schema the migrations create their tables in, not anywhere on
	// the search_path.
	err := db.QueryRowContext(ctx, `SELECT s, current_setting('search_path'),
	s IS NOT NULL AND to_regclass(format('%I.%I', s, 'processed_messages')) IS NOT NULL,
	s IS NOT NULL AND to_regclass(format('%I.%I', s, $1::text)) IS NOT NULL
FROM current_schema() s`, m.VersionTable).Scan(&schema, &searchPath, &table, &versions)
	if err != nil {
		return fmt.Errorf("pgdedup: migrate: look for %s: %w", m.VersionTable, err)
	}
	if !schema.Valid {
		// current_schema() is NULL: the migrations' CREATE TABLE would fail
		// with "no schema has been selected to create in".
		return fmt.Errorf("pgdedup: migrate: no schema of the search_path (%s) exists, so there is none to create "+
			"pgdedup's tables in: create the schema, or choose an existing one in the URL (options=-csearch_path%%3Dname)",
			searchPath.String)
	}
	if !table {
		return nil
	}
	if versions {
		// goose records each version applied as a row; a row for version 0
		// alone is what goose writes when it creates the table, before
		// anything is applied.
		err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{schema.String, m.VersionTable}.Sanitize()+
			` WHERE version_id > 0 AND is_applied)`).Scan(&versions)
		if err != nil {
			return fmt.Errorf("pgdedup: migrate: read %s: %w", m.VersionTable, err)
		}
	}
	if !versions {
		return m.migratedElsewhere(schema.String)
	}
	return nil
}

func (m Migrator) migratedElsewhere(schema string) error {
	where := ""
	if schema != "" {
		where = " in schema " + schema
	}
	return fmt.Errorf("%w: it exists%s but %s does not record it. If your goose applies pgdedup's migrations "+
		"(files from `pgdedup migrate sql --goose-dir`; ask it: goose status), keep it that way: remove the call to pgdedup.Migrate "+
		"(or `pgdedup migrate up`), and after each pgdedup upgrade run `pgdedup migrate sql --goose-dir DIR` again "+
		"and apply the new files with goose", m.ErrOtherTool, where, m.VersionTable)
}

// Provider returns a goose Provider for the migrations on db, with the
// version table and the lock.
func (m Migrator) Provider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresTableLocker(
		lock.WithTableName(m.LockTable),
		lock.WithTableLockID(m.LockID),
		lock.WithTableLockTimeout(500*time.Millisecond, 1200), // wait up to 10 minutes for another migrator
		lock.WithTableRetryPolicy(lockRetryable),
	)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, m.Migrations,
		goose.WithTableName(m.VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithLocker(holderNamingLocker{locker, m}),
	)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: migrations: %w", err)
	}
	return p, nil
}

// lockRetryable says whether an error taking or keeping the migration lock
// may go away by itself: another process holding the lock, a lost
// connection, a deadlock do; a role without the privileges, a missing schema,
// a read-only transaction do not, and waiting 10 minutes for them would only
// hide the cause.
func lockRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true
	}
	switch pgErr.Code[:2] {
	case "42", // syntax error or access rule violation: insufficient_privilege, undefined_table…
		"3F", // invalid schema name
		"25", // invalid transaction state: read_only_sql_transaction…
		"28": // invalid authorization specification
		return false
	}
	return true
}

// holderNamingLocker is goose's table locker, whose error when it gives up
// ("acquire lock … after retries") says who holds the lock and since when:
// the lock's row records it.
type holderNamingLocker struct {
	lock.Locker
	m Migrator
}

func (l holderNamingLocker) Lock(ctx context.Context, db *sql.DB) error {
	err := l.Locker.Lock(ctx, db)
	if err == nil {
		return nil
	}
	// ctx may be what ended the wait: look with a context of our own.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	holder, herr := l.m.LockHolder(lctx, db)
	if herr != nil || holder == "" {
		return fmt.Errorf("take the migration lock (%s): %w", l.m.LockTable, err)
	}
	return fmt.Errorf("take the migration lock (%s): held by %s: %w", l.m.LockTable, holder, err)
}

// LockHolder says who holds the migration lock on db and since when.
// It returns "" when no process holds it or the lock table does not exist.
func (m Migrator) LockHolder(ctx context.Context, db *sql.DB) (string, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1::text) IS NOT NULL`, m.LockTable).Scan(&exists); err != nil || !exists {
		return "", err
	}
	var by sql.NullString
	var since, lease sql.NullTime
	err := db.QueryRowContext(ctx, `SELECT locked_by, locked_at, lease_expires_at FROM `+m.LockTable+
		` WHERE lock_id = $1 AND locked`, m.LockID).Scan(&by, &since, &lease)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pgdedup: read %s: %w", m.LockTable, err)
	}
	// locked_by is text from a table: quoted, as Go would.
	return fmt.Sprintf("%s, since %s (lease until %s)", strconv.Quote(by.String),
		since.Time.UTC().Format(time.RFC3339), lease.Time.UTC().Format(time.RFC3339)), nil
}
