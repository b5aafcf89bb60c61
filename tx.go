package pgdedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// statements are a Store's SQL, built once in New. The table name is quoted;
// the retention and lock timeout are integers formatted by us; the consumer and
// the IDs are always bound parameters.
type statements struct {
	table      string
	claim      string // $1 consumer, $2 id
	claimBatch string // $1 consumer, $2 sorted ids

	// With Config.LockTimeout set, the claim runs between saveLockTimeout and
	// restoreLockTimeout, so the wait is bounded without changing lock_timeout
	// for the rest of the transaction. All three are transaction-local.
	setLockTimeout string
}

const (
	saveLockTimeout    = `SELECT set_config('pgdedup.lock_timeout', current_setting('lock_timeout'), true)`
	restoreLockTimeout = `SELECT set_config('lock_timeout', current_setting('pgdedup.lock_timeout'), true)`
)

func newStatements(table pgx.Identifier, retention, lockTimeout time.Duration) statements {
	t := table.Sanitize()
	expires := fmt.Sprintf("now() + interval '%d microseconds'", retention.Microseconds())
	st := statements{
		table: t,
		claim: `INSERT INTO ` + t + ` (consumer, message_id, expires_at) VALUES ($1, $2, ` + expires + `)
ON CONFLICT DO NOTHING`,
		claimBatch: `INSERT INTO ` + t + ` (consumer, message_id, expires_at)
SELECT $1, id, ` + expires + ` FROM unnest($2::text[]) WITH ORDINALITY AS u(id, n) ORDER BY n
ON CONFLICT DO NOTHING
RETURNING message_id`,
	}
	if lockTimeout > 0 {
		ms := (lockTimeout + time.Millisecond - 1) / time.Millisecond
		st.setLockTimeout = fmt.Sprintf(`SELECT set_config('lock_timeout', '%dms', true)`, ms)
	}
	return st
}

// Claim records messageID for the Store's consumer inside tx, the caller's
// transaction, and reports whether it is new. If tx commits, the ID is
// recorded; if tx rolls back, so does the claim. Run the business write in tx
// only when claimed is true.
//
// A duplicate returns (false, nil) and leaves tx usable: the insert uses
// ON CONFLICT DO NOTHING, so no unique violation aborts it. If another
// transaction holds the same ID, Claim waits for it to end (or, with
// Config.LockTimeout, returns ErrInFlight, after which tx is aborted and must be
// rolled back). Claim costs one round trip and does not retry: retrying is the
// business of whoever owns tx.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, messageID string) (claimed bool, err error) {
	if err := ValidateMessageID(messageID); err != nil {
		return false, err
	}
	if tx == nil {
		return false, errNilTx
	}
	b := &pgx.Batch{}
	s.queueClaim(b, messageID)
	return s.readClaim(tx.SendBatch(ctx, b), messageID, false)
}

// ClaimBatch records messageIDs inside tx, the caller's transaction, and returns
// the ones that are new, in the order they first appear in messageIDs (an ID
// repeated in the batch counts once). Like Claim, it leaves tx usable when some
// IDs are duplicates, and the claims commit or roll back with tx.
//
// Whatever the batch size it is one statement and one round trip. The IDs are
// inserted in sorted order, so overlapping batches cannot deadlock. If any ID is
// invalid, the whole batch is rejected with ErrInvalidMessageID, naming its
// index, before anything is sent.
func (s *Store) ClaimBatch(ctx context.Context, tx pgx.Tx, messageIDs []string) (fresh []string, err error) {
	sorted, err := prepareBatch(messageIDs)
	if err != nil || len(sorted) == 0 {
		return nil, err
	}
	if tx == nil {
		return nil, errNilTx
	}
	b := &pgx.Batch{}
	s.queueClaimBatch(b, sorted)
	return s.readClaimBatch(tx.SendBatch(ctx, b), messageIDs, false)
}

// queueClaim queues the claim of id (bracketed by the lock timeout statements
// when configured) onto b, which may already hold a BEGIN.
func (s *Store) queueClaim(b *pgx.Batch, id string) {
	s.queueLocked(b, s.sql.claim, s.cfg.Consumer, id)
}

func (s *Store) queueClaimBatch(b *pgx.Batch, sorted []string) {
	s.queueLocked(b, s.sql.claimBatch, s.cfg.Consumer, sorted)
}

func (s *Store) queueLocked(b *pgx.Batch, sql string, args ...any) {
	if s.sql.setLockTimeout == "" {
		b.Queue(sql, args...)
		return
	}
	b.Queue(saveLockTimeout)
	b.Queue(s.sql.setLockTimeout)
	b.Queue(sql, args...)
	b.Queue(restoreLockTimeout)
}

// skipLeading reads the results of the statements queued before the claim:
// BEGIN when begun, and the lock timeout statements when configured.
func (s *Store) skipLeading(br pgx.BatchResults, begun bool) error {
	n := 0
	if begun {
		n++
	}
	if s.sql.setLockTimeout != "" {
		n += 2
	}
	for range n {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return nil
}

// readClaim reads a claim's results and closes br.
func (s *Store) readClaim(br pgx.BatchResults, id string, begun bool) (bool, error) {
	err := s.skipLeading(br, begun)
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, s.claimError(err, id)
	}
	return tag.RowsAffected() == 1, nil
}

// readClaimBatch reads a batch claim's results and closes br.
func (s *Store) readClaimBatch(br pgx.BatchResults, ids []string, begun bool) ([]string, error) {
	fresh := make(map[string]struct{})
	err := s.skipLeading(br, begun)
	if err == nil {
		var rows pgx.Rows
		rows, err = br.Query()
		if err == nil {
			var id string
			_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
				fresh[id] = struct{}{}
				return nil
			})
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, s.claimError(err, "")
	}
	return inInputOrder(ids, fresh), nil
}

// claimError turns a lock timeout on the claim into ErrInFlight.
func (s *Store) claimError(err error, id string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" && s.sql.setLockTimeout != "" {
		return fmt.Errorf("%w: %w", ErrInFlight, err)
	}
	if id != "" {
		return fmt.Errorf("pgdedup: claim %q: %w", id, err)
	}
	return fmt.Errorf("pgdedup: claim batch: %w", err)
}
