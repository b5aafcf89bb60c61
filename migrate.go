package pgdedup

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations holds pgdedup's goose SQL migrations (00001_processed_messages.sql, …)
// at its root. Teams that run goose themselves can copy these files into their
// own migrations directory or hand this FS to their own goose Provider.
var Migrations fs.FS = mustSub(migrationsFS, "migrations")

// VersionTable is the goose version table Migrate uses. It is pgdedup's own,
// so the host service's goose_db_version is never touched.
const VersionTable = "pgdedup_db_version"

// lockTable and lockID identify the lock Migrate takes so that two processes
// migrating at once take turns. The lock is a row in a table, not a session
// advisory lock, so it works behind PgBouncer in transaction pooling mode.
const (
	lockTable = "pgdedup_db_lock"
	lockID    = 0x70676465647570 // "pgdedup"
)

// Migrate applies pgdedup's migrations that db has not seen yet, creating
// processed_messages (and pgdedup_db_version) in the connection's search_path.
// It is idempotent and safe to run from several processes at once. It does not
// close db.
func Migrate(ctx context.Context, db *sql.DB) error {
	p, err := NewMigrationProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("pgdedup: migrate: %w", err)
	}
	return nil
}

// NewMigrationProvider returns a goose Provider for pgdedup's migrations on db,
// with pgdedup's own version table and lock, for callers who need more than
// Migrate: Down, Status, UpTo. Do not call the Provider's Close unless you mean
// to close db: goose closes the *sql.DB it was given.
func NewMigrationProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresTableLocker(
		lock.WithTableName(lockTable),
		lock.WithTableLockID(lockID),
		lock.WithTableLockTimeout(500*time.Millisecond, 1200), // wait up to 10 minutes for another migrator
	)
	if err != nil {
		return nil, fmt.Errorf("pgdedup: migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, Migrations,
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
