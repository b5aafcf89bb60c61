package pgdedup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DB is what a [Store] calls on Postgres, and nothing more. A
// *pgxpool.Pool satisfies it and is what services should pass; a *pgx.Conn
// does too, but then the [Store] must not be used from several goroutines at
// once, like the Conn itself.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Config configures a [Store]. Only Consumer is required.
type Config struct {
	// Consumer scopes message IDs: the same ID under two consumers is processed
	// once by each. Use one name per logical handler ("billing", "emails").
	// Required.
	Consumer string

	// Table is the dedup table, optionally schema-qualified ("ops.processed_messages").
	// Each part must be a plain identifier (letters, digits, _ and $, not starting
	// with a digit, at most 63 bytes); it is quoted, so case is kept.
	// Defaults to [DefaultTable], "processed_messages", resolved through the
	// search_path.
	Table string

	// Retention is how long an ID is remembered: expires_at = now() + Retention
	// at claim time, and [Store.Cleanup] deletes the row after that. It must exceed the
	// longest time the broker can redeliver a message (take at least twice that).
	// Defaults to [DefaultRetention], 48h.
	Retention time.Duration

	// LockTimeout bounds how long a delivery waits for another transaction that
	// holds the same ID (a duplicate delivered while the first is in flight).
	// Zero waits until the first finishes, then skips (it committed) or proceeds
	// (it rolled back). Above zero, the wait gives up after LockTimeout (rounded
	// up to a millisecond) with [ErrInFlight]: nack or requeue the message.
	// Defaults to 0.
	LockTimeout time.Duration

	// MaxAttempts is how many times [Store.Process] and [Store.ProcessBatch]
	// try a message when an attempt fails transiently (serialization failure
	// 40001, deadlock 40P01, a lost connection, including during COMMIT).
	// Defaults to [DefaultMaxAttempts], 3; 1 disables retries.
	MaxAttempts int

	// TxOptions are the options of the transactions [Store.Process] and [Store.ProcessBatch]
	// begin. Defaults to the zero value: read committed, read write.
	TxOptions pgx.TxOptions

	// Logger receives a debug record for each skipped duplicate, a warning for
	// each retried attempt and cleanup failure, and an info record per cleanup
	// run. Defaults to discarding.
	Logger *slog.Logger

	// OnEvent, when set, is called synchronously after each outcome, for metrics:
	// messages processed, duplicates skipped, retries, in-flight give-ups and
	// cleanup runs (see [EventKind]). It must be fast and safe for concurrent use.
	// Defaults to nil.
	OnEvent func(ctx context.Context, e Event)

	// CleanupBatchSize is how many expired rows one [Store.Cleanup] transaction deletes
	// at most. Defaults to [DefaultCleanupBatchSize], 10,000.
	CleanupBatchSize int

	// OffsetTable is the table of last processed offsets used by
	// [Store.ProcessOffsets] and the other offset calls, optionally
	// schema-qualified, with the same rules as Table. Defaults to
	// "processed_offsets", in Table's schema when Table is schema-qualified.
	OffsetTable string
}

// Store records processed message IDs for one consumer. It is safe for
// concurrent use when its [DB] is (a *pgxpool.Pool is).
type Store struct {
	db  DB
	cfg Config
	log *slog.Logger
	sql statements
	lay layoutPtr // looked up on first use: see layout
	off offsetStatements
}

// The defaults of the [Config] fields left zero.
const (
	DefaultTable            = "processed_messages" // Config.Table
	DefaultRetention        = 48 * time.Hour       // Config.Retention
	DefaultMaxAttempts      = 3                    // Config.MaxAttempts
	DefaultCleanupBatchSize = 10_000               // Config.CleanupBatchSize
)

var (
	// ErrInvalidMessageID is returned, wrapped with the reason, for an ID that is
	// empty, not valid UTF-8, contains a NUL byte or is longer than [MaxMessageIDLen]
	// bytes. Nothing is sent to the database.
	ErrInvalidMessageID = errors.New("pgdedup: invalid message ID")

	// ErrInFlight is returned when [Config.LockTimeout] is set and another
	// transaction still holds the same message ID after that long. The message
	// was not processed by this call: nack or requeue it so it is retried.
	ErrInFlight = errors.New("pgdedup: message is being processed by another transaction")

	errNilFunc = errors.New("pgdedup: fn must not be nil")
)

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// New returns a [Store] that records IDs for cfg.Consumer in db. It checks cfg
// as [Config.Validate] does and fills in the defaults; it does not touch the
// database (run [Migrate] first).
func New(db DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgdedup: db must not be nil")
	}
	ident, offIdent, err := cfg.identifiers()
	if err != nil {
		return nil, err
	}
	cfg.Table = cmp.Or(cfg.Table, DefaultTable)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.CleanupBatchSize = cmp.Or(cfg.CleanupBatchSize, DefaultCleanupBatchSize)
	cfg.OffsetTable = cmp.Or(cfg.OffsetTable, defaultOffsetTable(ident))
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Store{db: db, cfg: cfg, log: logger,
		sql: newStatements(ident, cfg.Retention, cfg.LockTimeout),
		off: newOffsetStatements(offIdent),
	}, nil
}

// ConfigError is the error [New] and [Config.Validate] return for an invalid
// [Config] field.
type ConfigError struct {
	Field  string // the field's name: "Table", "Retention", …
	Reason string // what is wrong, worded to follow the name: "must not be negative, got -1s"
}

// Error returns "pgdedup: Config.Field Reason".
func (e *ConfigError) Error() string { return "pgdedup: Config." + e.Field + " " + e.Reason }

// Validate returns a *[ConfigError] for the first field of cfg that [New]
// would reject, or nil. It needs no database. Zero fields are valid: they take
// their defaults.
func (cfg Config) Validate() error {
	_, _, err := cfg.identifiers()
	return err
}

// identifiers validates cfg and returns its Table and OffsetTable, defaults
// filled in, as identifiers.
func (cfg Config) identifiers() (table, offsets pgx.Identifier, err error) {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case cfg.Consumer == "":
		return nil, nil, bad("Consumer", "is required")
	case validateText(cfg.Consumer) != nil:
		return nil, nil, bad("Consumer", "is %s", validateText(cfg.Consumer))
	case cfg.Retention < 0:
		return nil, nil, bad("Retention", "must not be negative, got %s", cfg.Retention)
	case cfg.LockTimeout < 0:
		return nil, nil, bad("LockTimeout", "must not be negative, got %s", cfg.LockTimeout)
	case cfg.MaxAttempts < 0:
		return nil, nil, bad("MaxAttempts", "must not be negative, got %d", cfg.MaxAttempts)
	case cfg.TxOptions.AccessMode == pgx.ReadOnly:
		return nil, nil, bad("TxOptions", "must not be read only: the claim is an INSERT")
	case cfg.CleanupBatchSize < 0:
		return nil, nil, bad("CleanupBatchSize", "must not be negative, got %d", cfg.CleanupBatchSize)
	}
	if table, err = parseTable("Table", cmp.Or(cfg.Table, DefaultTable)); err != nil {
		return nil, nil, err
	}
	offsets, err = parseTable("OffsetTable", cmp.Or(cfg.OffsetTable, defaultOffsetTable(table)))
	return table, offsets, err
}

// parseTable splits "schema.table" or "table", the value of Config.field, into
// an identifier, which the SQL quotes.
func parseTable(field, name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, &ConfigError{Field: field, Reason: fmt.Sprintf("%q is not table or schema.table", name)}
	}
	for _, p := range parts {
		if !identRe.MatchString(p) {
			return nil, &ConfigError{Field: field, Reason: fmt.Sprintf("%q: %q is not a plain identifier "+
				"(letters, digits, _ or $, not starting with a digit, at most 63 bytes)", name, p)}
		}
	}
	return pgx.Identifier(parts), nil
}

// Consumer returns the consumer name the [Store] records IDs under.
func (s *Store) Consumer() string { return s.cfg.Consumer }

// Table returns the quoted, possibly schema-qualified name of the dedup table.
func (s *Store) Table() string { return s.sql.table }

// Retention returns how long the store remembers an ID: Config.Retention, or
// its default.
func (s *Store) Retention() time.Duration { return s.cfg.Retention }
