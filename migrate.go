package pgdedup

import (
	"context"
	"database/sql"
	"embed"
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

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations returns pgdedup's goose SQL migrations (00001_processed_messages.sql, …)
// at its root. Teams that run the goose CLI themselves write them into their
// own migrations directory with `pgdedup migrate sql --goose-dir DIR`, which
// numbers them after the directory's versions (copied as they are, versions 1,
// 2, … clash with the host's own). Either way, one tool owns them: a host whose
// goose applied them must not also call [Migrate].
//
// It is a function, not a variable, so that no caller can change what
// [Migrate] applies.
func Migrations() fs.FS { return migrations }

// migrations is what Migrate applies: the embedded files, at the root.
var migrations = mustSub(migrationsFS, "migrations")

// VersionTable is the goose version table [Migrate] uses. It is pgdedup's own,
// so the host service's goose_db_version is never touched.
const VersionTable = "pgdedup_db_version"

// LockTable is the table [Migrate] takes its turn in: while a process
// migrates, it holds a row of this table (locked_by names it, locked_at says
// since when), so that processes migrating at once take turns. It is a row in
// a table, not a session advisory lock, so that it works behind PgBouncer in
// transaction pooling mode. The role that runs [Migrate] creates it, and then
// needs INSERT and UPDATE on it.
const LockTable = "pgdedup_db_lock"

// lockID is the row of LockTable that Migrate holds.
const lockID = 0x70676465647570 // "pgdedup"

// ErrMigratedByAnotherTool is returned, wrapped with what to do, by [Migrate]
// when processed_messages exists but [VersionTable] does not record it: the
// table was made by another migration tool, typically the host's own goose
// applying the files of `pgdedup migrate sql --goose-dir`, or by hand. One tool
// must own the table's migrations; [Migrate] changes nothing in this case.
var ErrMigratedByAnotherTool = errors.New("pgdedup: processed_messages was created by another migration tool")

// Migrate applies pgdedup's migrations that db has not seen yet, creating
// processed_messages (and pgdedup_db_version) in the connection's search_path.
// It is idempotent and safe to run from several processes at once: they take
// turns (see [LockTable]), each waiting up to 10 minutes, or until ctx ends,
// for the others. It does not close db. If your own goose applies pgdedup's
// migrations (see [Migrations]), do not call Migrate: it returns
// [ErrMigratedByAnotherTool].
//
// Applying a migration takes the tables' owner (or a role with CREATE on the
// schema, for the first). A runtime role with no more than SELECT on
// [VersionTable] may still call Migrate at startup: when nothing is pending it
// only reads that table and returns nil; when something is, it fails at once,
// changing nothing, and the owner applies it (`pgdedup migrate up`).
func Migrate(ctx context.Context, db *sql.DB) error {
	if err := CheckMigrationOwner(ctx, db); err != nil {
		return err
	}
	p, err := NewMigrationProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P07" { // duplicate_table: made elsewhere, version table empty
			return migratedElsewhere(pgErr.SchemaName)
		}
		return fmt.Errorf("pgdedup: migrate: %w", err)
	}
	return nil
}

// CheckMigrationOwner returns nil when pgdedup's own migrations may run on db:
// processed_messages does not exist yet in the schema they use (the first
// schema of the search_path that exists), or [VersionTable] records a pgdedup
// migration applied. It returns an error wrapping [ErrMigratedByAnotherTool]
// when processed_messages exists there and [VersionTable] does not record it
// (another tool, typically the host's goose, applies the migrations), and an
// error saying so when no schema of the search_path exists.
//
// [Migrate] calls it first. Call it before using a Provider from
// [NewMigrationProvider]: the Provider's Down, UpTo and Status would otherwise
// create pgdedup's version and lock tables next to another tool's table. It
// only reads the catalogs and at most a few rows of [VersionTable]: it
// creates nothing and takes no lock.
func CheckMigrationOwner(ctx context.Context, db *sql.DB) error {
	var schema, searchPath sql.NullString
	var table, versions bool
	// In the schema the migrations create their tables in, not anywhere on
	// the search_path.
	err := db.QueryRowContext(ctx, `SELECT s, current_setting('search_path'),
	s IS NOT NULL AND to_regclass(format('%I.%I', s, 'processed_messages')) IS NOT NULL,
	s IS NOT NULL AND to_regclass(format('%I.%I', s, $1::text)) IS NOT NULL
FROM current_schema() s`, VersionTable).Scan(&schema, &searchPath, &table, &versions)
	if err != nil {
		return fmt.Errorf("pgdedup: migrate: look for %s: %w", VersionTable, err)
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
		err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{schema.String, VersionTable}.Sanitize()+
			` WHERE version_id > 0 AND is_applied)`).Scan(&versions)
		if err != nil {
			return fmt.Errorf("pgdedup: migrate: read %s: %w", VersionTable, err)
		}
	}
	if !versions {
		return migratedElsewhere(schema.String)
	}
	return nil
}

func migratedElsewhere(schema string) error {
	where := ""
	if schema != "" {
		where = " in schema " + schema
	}
	return fmt.Errorf("%w: it exists%s but %s does not record it. If your goose applies pgdedup's migrations "+
		"(files from `pgdedup migrate sql --goose-dir`; ask it: goose status), keep it that way: remove the call to pgdedup.Migrate "+
		"(or `pgdedup migrate up`), and after each pgdedup upgrade run `pgdedup migrate sql --goose-dir DIR` again "+
		"and apply the new files with goose", ErrMigratedByAnotherTool, where, VersionTable)
}

// NewMigrationProvider returns a goose Provider for pgdedup's migrations on db,
// with pgdedup's own [VersionTable] and lock, for callers who need more than
// [Migrate]: Down, DownTo, UpTo, Status, GetDBVersion.
//
// It returns goose's own type on purpose. goose v3's Provider is the engine
// [Migrate] runs and a stable API of its own; wrapping each of its operations
// would add API to pgdedup without adding anything, and the pgdedup CLI's
// migrate down and status are built on it. The price: pgdedup's API moves with
// goose's major version.
//
// Do not call the Provider's Close unless you mean to close db: goose closes
// the *sql.DB it was given.
func NewMigrationProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresTableLocker(
		lock.WithTableName(LockTable),
		lock.WithTableLockID(lockID),
		lock.WithTableLockTimeout(500*time.Millisecond, 1200), // wait up to 10 minutes for another migrator
		lock.WithTableRetryPolicy(lockRetryable),
	)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations,
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithLocker(holderNamingLocker{locker}),
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
type holderNamingLocker struct{ lock.Locker }

func (l holderNamingLocker) Lock(ctx context.Context, db *sql.DB) error {
	err := l.Locker.Lock(ctx, db)
	if err == nil {
		return nil
	}
	// ctx may be what ended the wait: look with a context of our own.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	holder, herr := MigrationLockHolder(lctx, db)
	if herr != nil || holder == "" {
		return fmt.Errorf("take the migration lock (%s): %w", LockTable, err)
	}
	return fmt.Errorf("take the migration lock (%s): held by %s: %w", LockTable, holder, err)
}

// MigrationLockHolder says who holds the migration lock of [LockTable] on db
// and since when, or returns "" when no process holds it (or the table does
// not exist yet). It only reads. [Migrate] and a Provider from
// [NewMigrationProvider] wait while someone holds the lock; its holder renews
// a lease on it every few seconds while it runs, so a holder that died
// releases it when the lease ends.
func MigrationLockHolder(ctx context.Context, db *sql.DB) (string, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1::text) IS NOT NULL`, LockTable).Scan(&exists); err != nil || !exists {
		return "", err
	}
	var by sql.NullString
	var since, lease sql.NullTime
	err := db.QueryRowContext(ctx, `SELECT locked_by, locked_at, lease_expires_at FROM `+LockTable+
		` WHERE lock_id = $1 AND locked`, int64(lockID)).Scan(&by, &since, &lease)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pgdedup: read %s: %w", LockTable, err)
	}
	// locked_by is text from a table: quoted, as Go would.
	return fmt.Sprintf("%s, since %s (lease until %s)", strconv.Quote(by.String),
		since.Time.UTC().Format(time.RFC3339), lease.Time.UTC().Format(time.RFC3339)), nil
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err)
	}
	return sub
}
