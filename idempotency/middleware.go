// Package idempotency is net/http middleware for the Idempotency-Key header:
// a request with a key runs its handler once, and a retry with the same key gets
// the first response replayed instead of being processed again, as Stripe does.
//
// The key is claimed with pgdedup in a transaction that the handler receives
// through its request context (see Tx). The handler writes its business rows in
// that transaction; the middleware buffers the response, stores its status,
// chosen headers and body in the key's row of processed_messages in the same
// transaction, commits, and only then sends it. So the business effects and the
// stored response commit together or not at all, and a client that lost the
// response can retry safely.
//
//	mw, err := idempotency.New(pool, idempotency.Config{Store: pgdedup.Config{Consumer: "payments"}})
//	...
//	mux.Handle("POST /charges", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx := idempotency.Tx(r.Context())
//		// ... tx.Exec(r.Context(), "INSERT INTO charges ...") ...
//	})))
//
// The header is read as draft-ietf-httpapi-idempotency-key-header defines it,
// an RFC 8941 String (Idempotency-Key: "8e03978e-…"); the bare form
// (Idempotency-Key: 8e03978e-…) is the same key. Malformed keys get 400, and
// every error about the key's use links to the page [Middleware.Docs] serves
// (Config.DocsURL).
//
// Keys live in processed_messages (migration 00002 adds the response columns:
// run pgdedup.Migrate), expire after the Store's Retention and are deleted by
// the same pgdedup Cleanup as message IDs.
package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

// DB is what the middleware needs from Postgres: what a pgdedup.Store needs,
// and BeginTx for requests without a key (see Config.Optional).
// *pgxpool.Pool satisfies it.
type DB interface {
	pgdedup.DB
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// ReplayedHeader is set to "true" on every replayed response, so clients and
// logs can tell a replay from a fresh answer.
const ReplayedHeader = "Idempotent-Replayed"

// BodyOmittedHeader is set to "true" on a replay whose body was larger than
// Config.MaxStoredBody: the status and headers are replayed, the body is empty.
const BodyOmittedHeader = "Idempotent-Body-Omitted"

// Config configures a Middleware. The zero value is usable.
type Config struct {
	// Store configures the pgdedup.Store that claims the keys: Consumer names
	// this middleware's keys (defaults to "http"), Table, Retention (how long a
	// key and its response are kept; defaults to pgdedup's 48h), MaxAttempts
	// (transient failures re-run the handler in a new transaction), TxOptions,
	// Logger and OnEvent. Its LockTimeout is ignored: see InFlightWait.
	Store pgdedup.Config

	// Header is the request header carrying the key. Defaults to "Idempotency-Key".
	Header string

	// Optional lets requests without a key through: the handler still runs in a
	// transaction from Tx, committed unless it answers 5xx, but nothing is
	// stored or replayed. Defaults to false: a missing key gets 400.
	Optional bool

	// Scope returns the namespace of the request's key, typically the
	// authenticated user or tenant, so that two clients choosing the same key
	// never see each other's responses. Defaults to one namespace for all.
	Scope func(r *http.Request) string

	// Fingerprint returns what identifies the request's intent; its SHA-256 is
	// stored with the key, and a later request with the same key and a
	// different fingerprint gets 422. body is the whole request body. Defaults
	// to the method, the request target (path and query) and the body.
	Fingerprint func(r *http.Request, body []byte) string

	// InFlightWait is how long a request waits while another request holds the
	// same key before it gets 409 Conflict (with Retry-After: 1). A request
	// that waits until the first one ends gets its replayed response (or is
	// processed, if the first one failed). Defaults to 0: 409 at once. The
	// request's context bounds any wait.
	InFlightWait time.Duration

	// MaxKeyLen is the longest key accepted, in bytes; keys must also be
	// visible ASCII (0x21-0x7E). Others get 400. Defaults to 255.
	MaxKeyLen int

	// MaxRequestBody is the largest request body read, in bytes (it is read
	// whole, to fingerprint it); larger ones get 413. Defaults to 1 MiB.
	MaxRequestBody int64

	// MaxStoredBody is the largest response body stored for replay, in bytes.
	// A larger response is still sent and its effects committed, but only its
	// status and headers are stored: a retry gets them with an empty body and
	// BodyOmittedHeader. Defaults to 1 MiB.
	MaxStoredBody int

	// DocsURL is the page documenting this API's idempotency keys: their
	// format, how long they are kept, and the error answers. The 400, 409, 413
	// and 422 answers point to it (draft-ietf-httpapi-idempotency-key-header
	// §2.7): their problem type is DocsURL with the fragment of their section
	// (#missing-key, #invalid-key, #key-in-flight, #body-too-large,
	// #key-reused) and they carry Link: <DocsURL>; rel="describedby". Serve the
	// page with [Middleware.Docs] at that path, or write your own. It must have
	// no fragment. Defaults to [DefaultDocsURL], a path on the same server,
	// which clients resolve against the request's URL.
	DocsURL string

	// ReplayHeaders are the response headers stored and replayed (the first
	// response carries all the handler's headers). Defaults to Content-Type,
	// Content-Encoding, Content-Language, Location, ETag, Last-Modified and
	// Cache-Control.
	ReplayHeaders []string
}

// Middleware makes handlers idempotent per key. It is safe for concurrent use.
type Middleware struct {
	db    DB
	store *pgdedup.Store
	cfg   Config
	log   *slog.Logger
	// Both name message_id besides the key, which costs nothing (the key
	// finds the row) and lets Citus route them to one shard whichever of the
	// two the table is distributed by (docs/citus.md).
	lookup string // $1 key (pgdedup.Key), $2 id
	// customFingerprint is whether Config.Fingerprint was set, for Docs.
	customFingerprint bool
	respond           string // $1 key, $2 fingerprint, $3 status, $4 headers, $5 body, $6 id
}

// DefaultDocsURL is Config.DocsURL's default: a path on the server itself, so
// the documentation needs no other host. Mount [Middleware.Docs] there.
const DefaultDocsURL = "/docs/idempotency-key"

const (
	defaultHeader         = "Idempotency-Key"
	defaultConsumer       = "http"
	defaultMaxKeyLen      = 255
	defaultMaxRequestBody = 1 << 20
	defaultMaxStoredBody  = 1 << 20
)

var defaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Content-Language",
	"Location", "ETag", "Last-Modified", "Cache-Control"}

// New returns a Middleware recording keys in db. It checks cfg and fills in
// defaults; it does not touch the database (run pgdedup.Migrate first).
func New(db DB, cfg Config) (*Middleware, error) {
	switch {
	case cfg.InFlightWait < 0:
		return nil, fmt.Errorf("idempotency: Config.InFlightWait must not be negative, got %s", cfg.InFlightWait)
	case cfg.MaxKeyLen < 0 || cfg.MaxKeyLen > pgdedup.MaxMessageIDLen:
		return nil, fmt.Errorf("idempotency: Config.MaxKeyLen must be between 0 and %d, got %d", pgdedup.MaxMessageIDLen, cfg.MaxKeyLen)
	case cfg.MaxRequestBody < 0 || cfg.MaxStoredBody < 0:
		return nil, errors.New("idempotency: Config.MaxRequestBody and MaxStoredBody must not be negative")
	}
	cfg.DocsURL = cmp.Or(cfg.DocsURL, DefaultDocsURL)
	if err := validateDocsURL(cfg.DocsURL); err != nil {
		return nil, fmt.Errorf("idempotency: Config.DocsURL %q: %w", cfg.DocsURL, err)
	}
	cfg.Header = http.CanonicalHeaderKey(cmp.Or(cfg.Header, defaultHeader))
	cfg.MaxKeyLen = cmp.Or(cfg.MaxKeyLen, defaultMaxKeyLen)
	cfg.MaxRequestBody = cmp.Or(cfg.MaxRequestBody, defaultMaxRequestBody)
	cfg.MaxStoredBody = cmp.Or(cfg.MaxStoredBody, defaultMaxStoredBody)
	if cfg.ReplayHeaders == nil {
		cfg.ReplayHeaders = defaultReplayHeaders
	}
	customFingerprint := cfg.Fingerprint != nil
	if !customFingerprint {
		cfg.Fingerprint = defaultFingerprint
	}
	cfg.Store.Consumer = cmp.Or(cfg.Store.Consumer, defaultConsumer)
	// lock_timeout 0 would wait forever; 1ms is the least Postgres honours.
	cfg.Store.LockTimeout = max(cfg.InFlightWait, time.Millisecond)
	store, err := pgdedup.New(db, cfg.Store)
	if err != nil {
		return nil, err
	}
	log := cfg.Store.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	t := store.Table()
	return &Middleware{
		db: db, store: store, cfg: cfg, log: log, customFingerprint: customFingerprint,
		lookup: `SELECT request_fingerprint, response_status, response_headers, response_body FROM ` + t +
			` WHERE key = $1::uuid AND message_id = $2`,
		respond: `UPDATE ` + t + ` SET request_fingerprint = $2, response_status = $3, response_headers = $4, response_body = $5` +
			` WHERE key = $1::uuid AND message_id = $6`,
	}, nil
}

// Store returns the pgdedup.Store that claims the keys, for Cleanup and
// RunCleaner (which delete expired keys of every consumer alike).
func (m *Middleware) Store() *pgdedup.Store { return m.store }

// txKey is the context key of the transaction handed to the handler.
type txKey struct{}

// Tx returns the transaction the middleware runs the handler in. Write the
// request's business rows in it: they commit together with the stored response
// when the handler answers below 500, and roll back otherwise. Do not commit
// or roll it back yourself; use tx.Begin for a savepoint. Outside the
// middleware, Tx returns nil.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

func withTx(r *http.Request, tx pgx.Tx) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), txKey{}, tx))
}
