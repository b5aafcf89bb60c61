package pgdedup

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

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

// lockTable and lockID identify the lock Migrate takes so that two processes
// migrating at once take turns. The lock is a row in a table, not a session
// advisory lock, so it works behind PgBouncer in transaction pooling mode.
const (
	lockTable = "pgdedup_db_lock"
	lockID    = 0x70676465647570 // "pgdedup"
)

// ErrMigratedByAnotherTool is returned, wrapped with what to do, by [Migrate]
// when processed_messages exists but [VersionTable] does not record it: the
// table was made by another migration tool, typically the host's own goose
// applying the files of `pgdedup migrate sql --goose-dir`, or by hand. One tool
// must own the table's migrations; [Migrate] changes nothing in this case.
var ErrMigratedByAnotherTool = errors.New("pgdedup: processed_messages was created by another migration tool")

// Migrate applies pgdedup's migrations that db has not seen yet, creating
// processed_messages (and pgdedup_db_version) in the connection's search_path.
// It is idempotent and safe to run from several processes at once. It does not
// close db. If your own goose applies pgdedup's migrations (see [Migrations]),
// do not call Migrate: it returns [ErrMigratedByAnotherTool].
func Migrate(ctx context.Context, db *sql.DB) error {
	if err := checkMigratedHere(ctx, db); err != nil {
		return err
	}
	p, err := NewMigrationProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P07" { // duplicate_table: made elsewhere, version table empty
			return migratedElsewhere()
		}
		return fmt.Errorf("pgdedup: migrate: %w", err)
	}
	return nil
}

// checkMigratedHere refuses to migrate a processed_messages that VersionTable
// does not record. Without the check, goose would create VersionTable, then
// fail on CREATE TABLE with "relation already exists".
func checkMigratedHere(ctx context.Context, db *sql.DB) error {
	var table, versions bool
	// In the schema the migrations create their tables in, not anywhere on
	// the search_path.
	err := db.QueryRowContext(ctx, `SELECT to_regclass(format('%I.%I', current_schema(), 'processed_messages')) IS NOT NULL,
		to_regclass(format('%I.%I', current_schema(), $1::text)) IS NOT NULL`, VersionTable).Scan(&table, &versions)
	if err != nil {
		return fmt.Errorf("pgdedup: migrate: look for %s: %w", VersionTable, err)
	}
	if table && !versions {
		return migratedElsewhere()
	}
	return nil
}

func migratedElsewhere() error {
	return fmt.Errorf("%w: it exists but %s does not record it. If your goose applies pgdedup's migrations "+
		"(files from `pgdedup migrate sql --goose-dir`), keep it that way: remove the call to pgdedup.Migrate "+
		"(or `pgdedup migrate up`), and after each pgdedup upgrade run `pgdedup migrate sql --goose-dir DIR` again "+
		"and apply the new files with goose", ErrMigratedByAnotherTool, VersionTable)
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
		lock.WithTableName(lockTable),
		lock.WithTableLockID(lockID),
		lock.WithTableLockTimeout(500*time.Millisecond, 1200), // wait up to 10 minutes for another migrator
	)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations,
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithLocker(locker),
	)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: migrations: %w", err)
	}
	return p, nil
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err)
	}
	return sub
}
