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

	"github.com/pgdedup/pgdedup/internal/shape/partitioned"
)

// Config configures a [Store]. Only Consumer is required.
type Config struct {
	// Consumer scopes message IDs. The same ID under two consumers is
	// processed once by each, so use one name per logical handler, such as
	// "billing". It must be valid UTF-8 without control characters, not
	// blank, and at most [MaxConsumerLen] bytes. Required.
	Consumer string

	// Table is the dedup table, optionally schema-qualified, such as
	// "ops.processed_messages". Each part is a plain identifier of at most 63
	// bytes, and it is quoted, so case is kept. Defaults to [DefaultTable],
	// found through the search_path.
	Table string

	// Retention is how long an ID is remembered before [Store.Cleanup] may
	// delete its row. Make it at least twice the longest time the broker can
	// redeliver a message. It must be at least [MinRetention], which catches a
	// bare number such as 48. Defaults to [DefaultRetention], 48 hours.
	Retention time.Duration

	// LockTimeout bounds how long a delivery waits for another transaction
	// that holds the same ID. Past it the call returns [ErrInFlight], and the
	// message should be requeued. It is rounded up to a millisecond, and zero
	// waits until the other transaction ends. Defaults to 0.
	LockTimeout time.Duration

	// MaxAttempts is how many times the Process calls try a message whose
	// attempt failed in a way that trying again can cure (see [IsTransient]).
	// Set it to 1 to turn retries off. Defaults to [DefaultMaxAttempts], 3.
	MaxAttempts int

	// MaxBatch is the most IDs one batch call accepts. A larger batch fails
	// with [ErrBatchTooLarge] before anything is sent, which bounds one
	// transaction's locks and WAL. Defaults to [DefaultMaxBatch], 10,000.
	MaxBatch int

	// TxOptions are the options of the transactions the Process calls begin.
	// Defaults to the zero value, read committed and read write.
	TxOptions pgx.TxOptions

	// Logger receives skipped duplicates at debug level, retries and failures
	// as warnings, and each cleanup run as info. Defaults to discarding.
	Logger *slog.Logger

	// OnEvent is called synchronously after each outcome, for metrics (see
	// [EventKind]). It must be fast and safe for concurrent use. Defaults to
	// nil.
	OnEvent func(ctx context.Context, e Event)

	// CleanupBatchSize is the most expired rows one [Store.Cleanup]
	// transaction deletes. Defaults to [DefaultCleanupBatchSize], 10,000.
	CleanupBatchSize int

	// CleanupTurnWait is how long a [Store.Cleanup] that finds the cleaners'
	// turn taken keeps trying. If nobody cleaned meanwhile it returns
	// [ErrCleanupStarved]. Defaults to 0, which returns at once and reports
	// only the third starved run in a row.
	CleanupTurnWait time.Duration

	// Layout is the shape of the table that [Store.Setup] creates. Claims,
	// Cleanup and Stats follow the table they find, whatever Layout says (see
	// docs/partitioning.md). Defaults to [LayoutPlain].
	Layout Layout

	// Partitions is how many partitions of the [LayoutPartitioned] table span
	// one Retention. More partitions mean smaller indexes and one more index
	// probe per claim, and each must span at least [MinPartitionSpan]. It is
	// fixed when Setup creates the table. Defaults to [DefaultPartitions], 12,
	// and must not exceed [MaxPartitions].
	Partitions int

	// MaxResultBytes is the longest result [Store.ProcessResult] stores. A
	// longer one fails the call with [ErrResultTooLarge] before COMMIT.
	// Defaults to [DefaultMaxResultBytes], 64 KiB.
	MaxResultBytes int

	// LateMargin is the safety margin of the late-message guard
	// ([WithSentAt]). It should cover the time from a claim to its COMMIT and
	// the skew between the sender's clock and the consumer's. Defaults to 0,
	// which means a tenth of the Retention in force.
	LateMargin time.Duration

	// Runway is how far ahead of the current partition [Store.Cleanup]
	// keeps partitions of the [LayoutPartitioned] table created: claims go
	// on that long after the last cleanup, and a stopped cleaner is an
	// outage only then (Stats.PartitionRunway shows what is left). Partitions
	// ahead cost a claim nothing. It is at least 3 partitions, and a run
	// creates at most 8, nearest first, so a long runway fills over a few
	// runs. Defaults to [DefaultRunway] (48 hours) or the Retention, if
	// shorter, and to at most [MaxAheadPartitions] partitions. A longer one
	// given here is refused.
	Runway time.Duration

	// SentAtMargin is how much earlier than the time given to [WithSentAt]
	// another delivery of the same ID may have been claimed. On the
	// [LayoutPartitioned] table a claim with a time looks only in the
	// partitions from that time less SentAtMargin on, which is what makes
	// it cheap (see docs/partitioning.md, "Bounded claims"). So it must
	// cover the skew between the sender's clock and the database's, and a
	// producer's retries: a message sent again after a timeout, or replayed
	// by a relay, is a new message with the same ID and a later time. A
	// time set once per ID (an outbox row's creation, an event's own time)
	// needs only the skew. A time more than SentAtMargin ahead of the
	// consumer's clock is refused with [ErrInvalidOption]. Defaults to
	// [DefaultSentAtMargin], an hour.
	SentAtMargin time.Duration

	// OffsetTable is the table of the offset calls, such as
	// [Store.ProcessOffsets], with the same rules as Table. Defaults to
	// "processed_offsets", in Table's schema if Table names one.
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
	DefaultSentAtMargin     = time.Hour            // Config.SentAtMargin
	DefaultRunway           = 48 * time.Hour       // Config.Runway, at most the Retention

	DefaultMaxResultBytes = 64 << 10 // Config.MaxResultBytes

	MinPartitionSpan = 100 * time.Millisecond // the shortest Retention ÷ Partitions accepted
	MaxPartitions    = 60                     // the most Config.Partitions accepted, since a claim without a time locks every partition of the Retention
	// MaxAheadPartitions is the most partitions ahead of the current one
	// that Config.Runway may ask for.
	MaxAheadPartitions = partitioned.MaxAhead

	MinRetention   = time.Second // the shortest Config.Retention accepted
	MaxConsumerLen = 255         // the longest Config.Consumer accepted, in bytes
)

// Validate returns a *[ConfigError] for the first field of cfg that [New]
// would reject, or nil. It needs no database. Zero fields are valid, since
// they take their defaults.
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
	cfg.SentAtMargin = cmp.Or(cfg.SentAtMargin, DefaultSentAtMargin)
	if cfg.Runway == 0 {
		cfg.Runway = min(DefaultRunway, cfg.Retention)
		if span := cfg.Retention / time.Duration(cfg.Partitions); span > 0 {
			cfg.Runway = min(cfg.Runway, MaxAheadPartitions*span)
		}
	}
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
	case cmp.Or(cfg.Partitions, DefaultPartitions) > MaxPartitions:
		return nil, nil, bad("Partitions", "%d is over %d: a claim without a time locks each partition of the Retention and its indexes (about %d locks with %d partitions) "+
			"in PostgreSQL's shared lock table (max_locks_per_transaction × max_connections); make fewer, longer partitions",
			cmp.Or(cfg.Partitions, DefaultPartitions), MaxPartitions, partitioned.ClaimLocks(partitioned.LockedPartitions(MaxPartitions)), MaxPartitions)
	case cfg.Layout == LayoutPartitioned && cmp.Or(cfg.Retention, DefaultRetention)/time.Duration(cmp.Or(cfg.Partitions, DefaultPartitions)) < MinPartitionSpan:
		return nil, nil, bad("Partitions", "%d would make partitions of %s, shorter than %s", cmp.Or(cfg.Partitions, DefaultPartitions),
			cmp.Or(cfg.Retention, DefaultRetention)/time.Duration(cmp.Or(cfg.Partitions, DefaultPartitions)), MinPartitionSpan)
	case cfg.MaxResultBytes < 0:
		return nil, nil, bad("MaxResultBytes", "must not be negative, got %d", cfg.MaxResultBytes)
	case cfg.Runway < 0:
		return nil, nil, bad("Runway", "must not be negative, got %s", cfg.Runway)
	case cfg.Runway > MaxAheadPartitions*(cmp.Or(cfg.Retention, DefaultRetention)/time.Duration(cmp.Or(cfg.Partitions, DefaultPartitions))):
		return nil, nil, bad("Runway", "%s would need more than %d partitions of %s ahead: give a shorter runway, or make longer partitions",
			cfg.Runway, MaxAheadPartitions, cmp.Or(cfg.Retention, DefaultRetention)/time.Duration(cmp.Or(cfg.Partitions, DefaultPartitions)))
	case cfg.SentAtMargin < 0:
		return nil, nil, bad("SentAtMargin", "must not be negative, got %s", cfg.SentAtMargin)
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

// Layout is the shape of the dedup table (see [Config.Layout]).
type Layout int

// The layouts of the dedup table.
const (
	// LayoutPlain is one table with one unique index on key, as [Migrate]
	// creates it. Cleanup deletes its expired rows.
	LayoutPlain Layout = iota
	// LayoutPartitioned is a table partitioned by claim time, one partition
	// per Retention ÷ [Config.Partitions]. A claim writes to the current
	// partition's small index, and Cleanup forgets old IDs by dropping whole
	// partitions. It works on plain PostgreSQL and on a table Citus
	// distributes. See [Store.Setup] and docs/partitioning.md.
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
