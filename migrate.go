package pgdedup

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"io/fs"

	"github.com/pressly/goose/v3"

	"github.com/pgdedup/pgdedup/internal/migrate"
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

// migrator runs the migrations with the names above.
var migrator = migrate.Migrator{
	Migrations:   migrations,
	VersionTable: VersionTable,
	LockTable:    LockTable,
	LockID:       0x70676465647570, // "pgdedup"
	ErrOtherTool: ErrMigratedByAnotherTool,
}

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
//
// It uses two of db's connections at once: goose holds one for the run, and
// its lock takes another. A db limited to one (SetMaxOpenConns(1)) gets an
// error before anything runs; over a pgxpool.Pool, give the pool two.
func Migrate(ctx context.Context, db *sql.DB) error { return migrator.Up(ctx, db) }

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
	return migrator.CheckOwner(ctx, db)
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
// the *sql.DB it was given. Like [Migrate], it refuses a db of one connection.
func NewMigrationProvider(db *sql.DB) (*goose.Provider, error) {
	if err := migrate.TwoConnections(db); err != nil {
		return nil, err
	}
	return migrator.Provider(db)
}

// MigrationLockHolder says who holds the migration lock of [LockTable] on db
// and since when, or returns "" when no process holds it (or the table does
// not exist yet). It only reads. [Migrate] and a Provider from
// [NewMigrationProvider] wait while someone holds the lock; its holder renews
// a lease on it every few seconds while it runs, so a holder that died
// releases it when the lease ends.
func MigrationLockHolder(ctx context.Context, db *sql.DB) (string, error) {
	return migrator.LockHolder(ctx, db)
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err)
	}
	return sub
}
