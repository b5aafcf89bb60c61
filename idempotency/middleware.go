// Package idempotency is net/http middleware for the Idempotency-Key header.
// A request with a key runs its handler once, and a retry with the same key gets
// the first response replayed instead of being processed again, as Stripe does.
//
// The key is claimed with pgdedup in a transaction that the handler receives
// through its request context (see [Tx]). The handler writes its business rows in
// that transaction. The middleware buffers the response and stores its status,
// chosen headers and body in the key's row of processed_messages, in the same
// transaction. It commits, and only then sends the response. So the business
// effects and the stored response commit together or not at all, and a client
// that lost the response can retry safely.
//
//	mw, err := idempotency.New(pool, idempotency.Config{
//		Store:  pgdedup.Config{Consumer: "payments"},
//		Scope:  func(r *http.Request) string { return userFrom(r.Context()) }, // set by your authentication
//		Secret: secret,                                                      // 32+ random bytes, kept like a password
//	})
//	...
//	mux.Handle("POST /charges", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx := idempotency.Tx(r.Context())
//		// ... tx.Exec(r.Context(), "INSERT INTO charges ...") ...
//	})))
//
// Keys are kept apart per client. [Config.Scope] returns the verified
// identity of the request's sender, so authentication must run before this
// middleware. The header is read as draft-ietf-httpapi-idempotency-key-header
// defines it, an RFC 8941 String such as "8e03978e-…" with its quotes. The
// bare form, without quotes, is the same key. Malformed keys get 400, and
// every error about the key's use links to the page [Middleware.Docs] serves
// ([Config.DocsURL]).
//
// The middleware is one user of pgdedup's stored results
// (pgdedup.Store.ProcessResult). A response is the key's result, and the
// request's fingerprint is its pgdedup.WithFingerprint. Both live in
// processed_messages from migration 00006 on, so run pgdedup.Migrate. Keys
// expire after the Store's Retention and are deleted by the same pgdedup
// Cleanup as message IDs.
package idempotency

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// DB is what the middleware needs from Postgres. It is what a pgdedup.Store
// needs, and BeginTx for requests without a key (see [Config.Optional]).
// *pgxpool.Pool satisfies it.
type DB interface {
	pgdedup.DB
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// ReplayedHeader is set to "true" on every replayed response, so clients and
// logs can tell a replay from a fresh answer.
const ReplayedHeader = "Idempotent-Replayed"

// BodyOmittedHeader is set to "true" on a replay whose body was not stored.
// The body was larger than [Config.MaxStoredBody], or [Config.StoredBody]
// left it out. The status and headers are replayed, and the body is empty.
const BodyOmittedHeader = "Idempotent-Body-Omitted"

// Middleware makes handlers idempotent per key. It is safe for concurrent use.
type Middleware struct {
	db    DB
	store *pgdedup.Store
	cfg   Config
	log   *slog.Logger

	// customFingerprint is whether Config.Fingerprint was set, for Docs.
	customFingerprint bool
	safe              map[string]bool // Config.SafeMethods
	notKept           map[int]bool    // Config.NotKept
	scopeKey, fpKey   []byte          // derived from Config.Secret
	slots             chan struct{}   // one per keyed request holding the database
	queued            atomic.Int64    // requests waiting for a slot
	flights           flights         // keyed requests in progress in this process
}

// Store returns the pgdedup.Store that claims the keys, for Cleanup and
// RunCleaner (which delete expired keys of every consumer alike).
func (m *Middleware) Store() *pgdedup.Store { return m.store }

// txKey is the context key of the transaction handed to the handler.
type txKey struct{}

// Tx returns the transaction the middleware runs the handler in. Write the
// request's business rows in it. They commit together with the stored response
// when the handler answers below 400 (for 4xx, see [Config.ClientErrors]), and
// roll back otherwise. Do not commit or roll it back yourself. Its Commit and
// Rollback return [ErrTxManaged], and the request fails. Use tx.Begin for a
// savepoint, for example around a statement that may fail. Outside the
// middleware, and for the safe methods it passes through, Tx returns nil.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

func withTx(r *http.Request, tx pgx.Tx) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), txKey{}, tx))
}
