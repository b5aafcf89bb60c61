package pgdedup

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
)

// Config configures a [Store]. Only Consumer is required.
type Config struct {
	// Consumer scopes message IDs: the same ID under two consumers is processed
	// once by each. Use one name per logical handler ("billing", "emails"): at
	// most [MaxConsumerLen] bytes of valid UTF-8, without control characters,
	// not blank. Required.
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
	// At least [MinRetention], so that a bare number (48, meaning 48ns) is
	// caught. Defaults to [DefaultRetention], 48h.
	Retention time.Duration

	// LockTimeout bounds how long a delivery waits for another transaction that
	// holds the same ID (a duplicate delivered while the first is in flight).
	// Zero waits until the first finishes, then skips (it committed) or proceeds
	// (it rolled back). Above zero, the wait gives up after LockTimeout (rounded
	// up to a millisecond) with [ErrInFlight]: nack or requeue the message.
	// Defaults to 0.
	LockTimeout time.Duration

	// MaxAttempts is how many times [Store.Process] and the other Process calls
	// try a message when an attempt fails in the database in a way that trying
	// again can cure (see [IsTransient]). Defaults to [DefaultMaxAttempts], 3;
	// 1 disables retries.
	MaxAttempts int

	// MaxBatch is the most IDs one [Store.ProcessBatch] or
	// [Store.ClaimBatch] (or ClaimBatchSQL) accepts; a larger batch is rejected
	// with [ErrBatchTooLarge] before anything is sent. It bounds the size of one
	// statement and of one transaction's locks and WAL. Defaults to
	// [DefaultMaxBatch], 10,000.
	MaxBatch int

	// TxOptions are the options of the transactions the Process calls begin.
	// Defaults to the zero value: read committed, read write.
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

	// CleanupTurnWait is how long a [Store.Cleanup] that finds the cleaners'
	// turn taken keeps trying to take it; if nobody cleaned meanwhile, it then
	// returns [ErrCleanupStarved]. Defaults to 0: it returns nil at once, and
	// only the third such run in a row that saw nobody cleaning returns
	// ErrCleanupStarved. A cron job (`pgdedup cleanup`) should wait.
	CleanupTurnWait time.Duration

	// Layout is the shape of the dedup table that [Store.Setup] creates:
	// [LayoutPlain] (the default) or [LayoutPartitioned]. Claims, Cleanup and Stats
	// follow the table as they find it, whatever Layout says: a LayoutPartitioned
	// Store rolled out before Setup claims on the plain table, and follows
	// the table once Setup has moved it (within a minute). Layout only
	// decides what Setup makes. See docs/partitioning.md.
	Layout Layout

	// Partitions is how many partitions of the [LayoutPartitioned] layout span one
	// Retention: each covers Retention ÷ Partitions of claim time (at least
	// [MinPartitionSpan]). More, smaller partitions keep the index a claim
	// writes to smaller (less WAL), at the price of one more index probe per
	// claim for each. Defaults to [DefaultPartitions], 12, and must not
	// exceed [MaxPartitions]: every claim locks each attached partition. Fixed
	// when Setup creates the table: later Stores follow the table's span.
	Partitions int

	// MaxResultBytes is the longest result [Store.ProcessResult] stores; a
	// longer one fails the call with [ErrResultTooLarge] before COMMIT. It
	// bounds the row every duplicate reads back. Defaults to
	// [DefaultMaxResultBytes], 64 KiB.
	MaxResultBytes int

	// LateMargin is the safety margin of the late-message guard
	// ([WithSentAt]): a delivery sent more than the Retention in force minus
	// LateMargin ago returns [ErrTooLate]. It should cover the time between a
	// claim and its COMMIT, and the skew between the sender's clock and the
	// consumer's. Defaults to 0, which means a tenth of the Retention in force.
	LateMargin time.Duration

	// OffsetTable is the table of last processed offsets used by
	// [Store.ProcessOffsets] and the other offset calls, optionally
	// schema-qualified, with the same rules as Table. Defaults to
	// "processed_offsets", in Table's schema when Table is schema-qualified.
	OffsetTable string
}

// The defaults of the [Config] fields left zero, and the limits it is checked
// against.
const (
	DefaultTable            = "processed_messages" // Config.Table
	DefaultRetention        = 48 * time.Hour       // Config.Retention
	DefaultMaxAttempts      = 3                    // Config.MaxAttempts
	DefaultMaxBatch         = 10_000               // Config.MaxBatch
	DefaultCleanupBatchSize = 10_000               // Config.CleanupBatchSize
	DefaultPartitions       = 12                   // Config.Partitions

	DefaultMaxResultBytes = 64 << 10 // Config.MaxResultBytes

	MinPartitionSpan = 100 * time.Millisecond // the shortest Retention ÷ Partitions accepted
	MaxPartitions    = 60                     // the most Config.Partitions accepted: claims lock every partition

	MinRetention   = time.Second // the shortest Config.Retention accepted
	MaxConsumerLen = 255         // the longest Config.Consumer accepted, in bytes
)

// Validate returns a *[ConfigError] for the first field of cfg that [New]
// would reject, or nil. It needs no database. Zero fields are valid: they take
// their defaults.
func (cfg Config) Validate() error {
	_, _, err := cfg.tables()
	return err
}

// withDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) withDefaults(table pgx.Identifier) Config {
	cfg.Table = cmp.Or(cfg.Table, DefaultTable)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.MaxBatch = cmp.Or(cfg.MaxBatch, DefaultMaxBatch)
	cfg.CleanupBatchSize = cmp.Or(cfg.CleanupBatchSize, DefaultCleanupBatchSize)
	cfg.Partitions = cmp.Or(cfg.Partitions, DefaultPartitions)
	cfg.MaxResultBytes = cmp.Or(cfg.MaxResultBytes, DefaultMaxResultBytes)
	cfg.OffsetTable = cmp.Or(cfg.OffsetTable, defaultOffsetTable(table))
	return cfg
}

// tables validates cfg and returns its Table and OffsetTable, defaults
// filled in, as identifiers.
func (cfg Config) tables() (table, offsets pgx.Identifier, err error) {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case cfg.Consumer == "":
		return nil, nil, bad("Consumer", "is required")
	case len(cfg.Consumer) > MaxConsumerLen:
		return nil, nil, bad("Consumer", "is %d bytes, longer than %d", len(cfg.Consumer), MaxConsumerLen)
	case validateText(cfg.Consumer) != nil:
		return nil, nil, bad("Consumer", "is invalid: %s", validateText(cfg.Consumer))
	case strings.TrimFunc(cfg.Consumer, unicode.IsSpace) == "":
		return nil, nil, bad("Consumer", "is blank (%q)", cfg.Consumer)
	case strings.IndexFunc(cfg.Consumer, unicode.IsControl) >= 0:
		return nil, nil, bad("Consumer", "%q holds a control character", cfg.Consumer)
	case cfg.Retention < 0:
		return nil, nil, bad("Retention", "must not be negative, got %s", cfg.Retention)
	case cfg.Retention > 0 && cfg.Retention < MinRetention:
		return nil, nil, bad("Retention", "must be at least %s, got %s: a Duration counts nanoseconds (write 48*time.Hour, not 48)", MinRetention, cfg.Retention)
	case cfg.LockTimeout < 0:
		return nil, nil, bad("LockTimeout", "must not be negative, got %s", cfg.LockTimeout)
	case cfg.MaxAttempts < 0:
		return nil, nil, bad("MaxAttempts", "must not be negative, got %d", cfg.MaxAttempts)
	case cfg.MaxBatch < 0:
		return nil, nil, bad("MaxBatch", "must not be negative, got %d", cfg.MaxBatch)
	case cfg.TxOptions.AccessMode == pgx.ReadOnly:
		return nil, nil, bad("TxOptions", "must not be read only: the claim is an INSERT")
	case cfg.CleanupBatchSize < 0:
		return nil, nil, bad("CleanupBatchSize", "must not be negative, got %d", cfg.CleanupBatchSize)
	case cfg.CleanupTurnWait < 0:
		return nil, nil, bad("CleanupTurnWait", "must not be negative, got %s", cfg.CleanupTurnWait)
	case cfg.Layout != LayoutPlain && cfg.Layout != LayoutPartitioned:
		return nil, nil, bad("Layout", "is %d, neither LayoutPlain nor LayoutPartitioned", int(cfg.Layout))
	case cfg.Partitions < 0:
		return nil, nil, bad("Partitions", "must not be negative, got %d", cfg.Partitions)
	case attachedPartitions(cmp.Or(cfg.Partitions, DefaultPartitions)) > maxAttachedPartitions:
		return nil, nil, bad("Partitions", "%d is over %d: every claim locks each attached partition and its indexes (about %d locks with %d attached) "+
			"in PostgreSQL's shared lock table (max_locks_per_transaction × max_connections); make fewer, longer partitions",
			cmp.Or(cfg.Partitions, DefaultPartitions), MaxPartitions, claimLocks(maxAttachedPartitions), maxAttachedPartitions)
	case cfg.Layout == LayoutPartitioned && cmp.Or(cfg.Retention, DefaultRetention)/time.Duration(cmp.Or(cfg.Partitions, DefaultPartitions)) < MinPartitionSpan:
		return nil, nil, bad("Partitions", "%d would make partitions of %s, shorter than %s", cmp.Or(cfg.Partitions, DefaultPartitions),
			cmp.Or(cfg.Retention, DefaultRetention)/time.Duration(cmp.Or(cfg.Partitions, DefaultPartitions)), MinPartitionSpan)
	case cfg.MaxResultBytes < 0:
		return nil, nil, bad("MaxResultBytes", "must not be negative, got %d", cfg.MaxResultBytes)
	case cfg.LateMargin < 0:
		return nil, nil, bad("LateMargin", "must not be negative, got %s", cfg.LateMargin)
	case cfg.LateMargin > 0 && cfg.LateMargin >= cmp.Or(cfg.Retention, DefaultRetention):
		return nil, nil, bad("LateMargin", "(%s) must be less than Retention (%s)", cfg.LateMargin, cmp.Or(cfg.Retention, DefaultRetention))
	}
	if table, err = parseTable("Table", cmp.Or(cfg.Table, DefaultTable)); err != nil {
		return nil, nil, err
	}
	offsets, err = parseTable("OffsetTable", cmp.Or(cfg.OffsetTable, defaultOffsetTable(table)))
	return table, offsets, err
}

// Layout is the shape of the dedup table: see [Config.Layout].
type Layout int

// The layouts of the dedup table.
const (
	// LayoutPlain is one table with one unique index on key, as [Migrate] creates
	// it; Cleanup deletes expired rows.
	LayoutPlain Layout = iota
	// LayoutPartitioned is a table partitioned by claim time, one partition per
	// Retention ÷ [Config.Partitions]: a claim writes to the current
	// partition's small index, and Cleanup forgets old IDs by dropping whole
	// partitions, on plain PostgreSQL or a table Citus distributes. See
	// [Store.Setup] and docs/partitioning.md.
	LayoutPartitioned
)

// String returns "plain" or "partitioned".
func (l Layout) String() string {
	switch l {
	case LayoutPlain:
		return "plain"
	case LayoutPartitioned:
		return "partitioned"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

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

// defaultOffsetTable is processed_offsets in the schema of table, if any.
func defaultOffsetTable(table pgx.Identifier) string {
	if len(table) == 2 {
		return table[0] + ".processed_offsets"
	}
	return "processed_offsets"
}
