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
	expires    string // the expires_at expression
	claim      string // $1 consumer, $2 id, $3 key
	claimBatch string // $1 consumer, $2 ids, $3 their keys, sorted by key

	// With Config.LockTimeout set, the claim runs between lockTimeout.before
	// (save the caller's lock_timeout, set ours) and lockTimeout.after (restore
	// it), so the wait is bounded without changing lock_timeout for the rest
	// of the transaction. All are transaction-local. On a Citus table the
	// statements of the Store's layout are used instead.
	lockTimeout   around
	lockTimeoutMS int64
}

const (
	saveLockTimeout    = `SELECT set_config('pgdedup.lock_timeout', current_setting('lock_timeout'), true)`
	restoreLockTimeout = `SELECT set_config('lock_timeout', current_setting('pgdedup.lock_timeout'), true)`
)

func newStatements(table pgx.Identifier, retention, lockTimeout time.Duration) statements {
	t := table.Sanitize()
	expires := fmt.Sprintf("now() + interval '%d microseconds'", retention.Microseconds())
	st := statements{
		table:   t,
		expires: expires,
		claim: `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at) VALUES ($3::uuid, $1, $2, ` + expires + `)
ON CONFLICT DO NOTHING`,
		claimBatch: `INSERT INTO ` + t + ` (key, consumer, message_id, expires_at)
SELECT k, $1, id, ` + expires + ` FROM unnest($3::uuid[], $2::text[]) WITH ORDINALITY AS u(k, id, n) ORDER BY n
ON CONFLICT DO NOTHING
RETURNING message_id`,
	}
	if lockTimeout > 0 {
		st.lockTimeoutMS = int64((lockTimeout + time.Millisecond - 1) / time.Millisecond)
		st.lockTimeout = around{
			before: []string{saveLockTimeout, fmt.Sprintf(`SELECT set_config('lock_timeout', '%dms', true)`, st.lockTimeoutMS)},
			after:  []string{restoreLockTimeout},
		}
	}
	return st
}

// Claim records messageID for the [Store]'s consumer inside tx, the caller's
// transaction, and reports whether it is new. If tx commits, the ID is
// recorded; if tx rolls back, so does the claim. Run the business write in tx
// only when claimed is true.
//
// A duplicate returns (false, nil) and leaves tx usable: the insert uses
// ON CONFLICT DO NOTHING, so no unique violation aborts it. If another
// transaction holds the same ID, Claim waits for it to end (or, with
// [Config.LockTimeout], returns [ErrInFlight], after which tx is aborted and must be
// rolled back). Claim costs one round trip and does not retry: retrying is the
// business of whoever owns tx.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, messageID string) (claimed bool, err error) {
	if err := ValidateMessageID(messageID); err != nil {
		return false, err
	}
	if tx == nil {
		return false, errNilTx
	}
	a, err := s.singleAround(ctx, pgxQueryRow(tx))
	if err != nil {
		return false, err
	}
	b := &pgx.Batch{}
	queueAround(b, a, s.sql.claim, s.cfg.Consumer, messageID, Key(s.cfg.Consumer, messageID))
	return s.readClaim(tx.SendBatch(ctx, b), messageID, false, a)
}

// ClaimBatch records messageIDs inside tx, the caller's transaction, and returns
// the ones that are new, in the order they first appear in messageIDs (an ID
// repeated in the batch counts once). Like [Store.Claim], it leaves tx usable when some
// IDs are duplicates, and the claims commit or roll back with tx.
//
// Whatever the batch size it is one statement and one round trip. The IDs are
// inserted in the order of their keys (see [Key]), the primary key's order, so
// overlapping batches cannot deadlock. If any ID is invalid, the whole batch
// is rejected with [ErrInvalidMessageID], naming its
// index, before anything is sent.
func (s *Store) ClaimBatch(ctx context.Context, tx pgx.Tx, messageIDs []string) (fresh []string, err error) {
	sorted, err := prepareBatch(s.cfg.Consumer, messageIDs)
	if err != nil || len(sorted.ids) == 0 {
		return nil, err
	}
	if tx == nil {
		return nil, errNilTx
	}
	l, err := s.layout(ctx, pgxQueryRow(tx))
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	q := s.queueClaimBatch(b, l, sorted)
	return s.readClaimBatch(tx.SendBatch(ctx, b), messageIDs, false, q)
}

// singleAround returns the statements around a single claim: none without
// Config.LockTimeout (and no lookup of the layout), else those for the table.
func (s *Store) singleAround(ctx context.Context, query queryRowFunc) (around, error) {
	if s.sql.lockTimeoutMS == 0 {
		return around{}, nil
	}
	l, err := s.layout(ctx, query)
	if err != nil {
		return around{}, err
	}
	if l.citus {
		return l.single, nil
	}
	return s.sql.lockTimeout, nil
}

// queueAround queues sql between a's statements onto b, which may already
// hold a BEGIN.
func queueAround(b *pgx.Batch, a around, sql string, args ...any) {
	for _, q := range a.before {
		b.Queue(q)
	}
	b.Queue(sql, args...)
	for _, q := range a.after {
		b.Queue(q)
	}
}

// queuedBatch is what queueClaimBatch queued: the statements around, and how
// many claim statements (each returning the new IDs) sit between them.
type queuedBatch struct {
	around around
	claims int
}

// queueClaimBatch queues the claim of sorted onto b: one INSERT … SELECT FROM
// unnest on plain PostgreSQL, multi-row VALUES inserts on Citus.
func (s *Store) queueClaimBatch(b *pgx.Batch, l *layout, sorted sortedBatch) queuedBatch {
	if !l.citus {
		queueAround(b, s.sql.lockTimeout, s.sql.claimBatch, s.cfg.Consumer, sorted.ids, sorted.keys)
		return queuedBatch{around: s.sql.lockTimeout, claims: 1}
	}
	for _, q := range l.batch.before {
		b.Queue(q)
	}
	chunks := citusBatchChunks(sorted)
	for _, args := range chunks {
		b.Queue(s.citusBatchSQL(l, len(args)/2), append([]any{s.cfg.Consumer}, args...)...)
	}
	for _, q := range l.batch.after {
		b.Queue(q)
	}
	return queuedBatch{around: l.batch, claims: len(chunks)}
}

// skipLeading reads the results of the statements queued before the claim:
// BEGIN when begun, and the statements before it.
func skipLeading(br pgx.BatchResults, begun bool, a around) error {
	n := len(a.before)
	if begun {
		n++
	}
	for range n {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return nil
}

// readClaim reads a claim's results and closes br.
func (s *Store) readClaim(br pgx.BatchResults, id string, begun bool, a around) (bool, error) {
	err := skipLeading(br, begun, a)
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
func (s *Store) readClaimBatch(br pgx.BatchResults, ids []string, begun bool, q queuedBatch) ([]string, error) {
	fresh := make(map[string]struct{})
	err := skipLeading(br, begun, q.around)
	for i := 0; i < q.claims && err == nil; i++ {
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

// claimError turns a lock timeout on the claim into ErrInFlight, and keeps
// the server's DETAIL in the message.
func (s *Store) claimError(err error, id string) error {
	err = fromDatabase(withDetail(err))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" && s.sql.lockTimeoutMS > 0 {
		return fmt.Errorf("%w: %w", ErrInFlight, err)
	}
	if id != "" {
		return fmt.Errorf("pgdedup: claim %q: %w", id, err)
	}
	return fmt.Errorf("pgdedup: claim batch: %w", err)
}
