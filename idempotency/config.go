package idempotency

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
)

// Config configures a [Middleware]. Scope (or GlobalScope) and Secret are
// required. Every other field has a default.
type Config struct {
	// Store configures the pgdedup.Store that claims the keys. Consumer names
	// this middleware's keys and defaults to "http". Retention is how long a
	// key and its response are kept, 48h by default. MaxAttempts bounds how
	// often a transient failure re-runs the handler in a new transaction.
	// Table, TxOptions, Logger and OnEvent apply as they do to any Store.
	// LockTimeout is ignored, because InFlightWait sets it.
	Store pgdedup.Config

	// Header is the request header carrying the key. It must be an HTTP field
	// name (letters, digits and !#$%&'*+-.^_`|~). Defaults to
	// "Idempotency-Key".
	Header string

	// Optional lets requests without a key through. The handler still runs in
	// a transaction from Tx, and its writes commit as they would with a key
	// (see ClientErrors). Nothing is stored or replayed. Defaults to false, so
	// a missing key gets 400.
	Optional bool

	// SafeMethods are the request methods passed straight to the handler. No
	// key is read, no transaction is opened (Tx returns nil), and nothing is
	// stored. The draft is about non-idempotent requests, and with a router's
	// r.Use(mw.Wrap) this lets reads and the Docs page through. Defaults to
	// GET, HEAD, OPTIONS and TRACE, the safe methods of RFC 9110. An empty,
	// non-nil slice requires keys on every method.
	SafeMethods []string

	// Scope returns the namespace of the request's key. It is the verified
	// identity of who sent the request, such as the user, API client or
	// tenant that authentication middleware put in the request's context
	// before this one runs. Never derive it from a header the client can set
	// freely. Whoever sends another client's scope, key and request would get
	// that client's stored response. Two scopes never share a key. A request
	// whose Scope is "" fails closed with 500, and the handler is not called.
	// The scope is stored only as a keyed hash (see Secret), so it may be long
	// or secret, a token for example. Required unless GlobalScope is set.
	Scope func(r *http.Request) string

	// GlobalScope puts every client's keys in one namespace. It suits APIs
	// whose clients cannot see each other's data anyway, such as a single
	// trusted caller or keys the server hands out. With it, any client that
	// sends another's key and the same request receives that client's stored
	// response. Defaults to false. It cannot be combined with Scope.
	GlobalScope bool

	// Secret keys the HMAC-SHA256 of request fingerprints and scopes, so that
	// neither can be recovered from the table by guessing (a card number from
	// a fingerprint, a user from a scope). It must be at least 32 bytes.
	// Generate it at random (openssl rand -base64 32) and keep it like a
	// password. Changing it forgets every stored key. A retry with an earlier
	// key is then processed again, or gets 422. So change it only when no
	// retry of an earlier request can still arrive. Required.
	Secret []byte

	// Fingerprint returns what identifies the request's intent. Its HMAC
	// (keyed by Secret), mixed with the method and the path, is stored with
	// the key. A later request with the same key and a different fingerprint
	// gets 422. body is the whole request body. The method and the path are
	// always mixed in, so a key cannot replay one endpoint's response on
	// another. Return "" to compare only the method and the path. Defaults to
	// the query and the body.
	Fingerprint func(r *http.Request, body []byte) string

	// ClientErrors says what happens when the handler answers 4xx. It decides
	// whether the handler's writes commit and whether the answer is kept for
	// replay. Defaults to [ReplayClientErrors], which rolls the writes back
	// and keeps the answer.
	ClientErrors ClientErrorPolicy

	// NotKept are the 4xx statuses never kept, whatever ClientErrors says.
	// Their writes roll back and a retry runs the handler again. Each must be
	// between 400 and 499. Defaults to 401, 403 and 429. Those answers are
	// about the caller's credentials or rate, and a retry after signing in
	// again or waiting must not be stuck with them. Set an empty, non-nil
	// slice to keep them.
	NotKept []int

	// StoredBody, when set, transforms response bodies on their way into the
	// table and back, to omit, redact or encrypt them (see [BodyCodec]).
	// Defaults to nil, which stores bodies as sent.
	StoredBody BodyCodec

	// InFlightWait is how long a request waits while another request holds the
	// same key, before it gets 409 Conflict with Retry-After 1. A request that
	// waits until the first one ends gets its replayed response, or is
	// processed if the first one failed. Requests with the same key in one
	// process wait in memory, and only the first waits in the database.
	// Defaults to 0, which answers 409 at once. The request's context bounds
	// any wait.
	InFlightWait time.Duration

	// MaxWaitersPerKey is how many requests of one process may wait
	// (InFlightWait) for the same key at once. More get 409 at once.
	// Defaults to 8.
	MaxWaitersPerKey int

	// MaxInFlight is how many requests of this Middleware may hold a database
	// connection at once, keyed ones and keyless ones with Optional. Others
	// wait for a turn, up to AcquireTimeout, after reading their body. So a
	// client that sends its body slowly holds no turn. Keep it below the
	// pool's size, so that the rest of the service (health checks, reads)
	// still gets connections while handlers are slow. Defaults to half the
	// pool's MaxConns (at least 1) when db reports it, as a *pgxpool.Pool
	// does, and to 4 otherwise.
	MaxInFlight int

	// AcquireTimeout is how long a request waits for a turn (MaxInFlight)
	// before it gets 503 Service Unavailable with Retry-After 1. Nothing was
	// processed then. Defaults to [DefaultAcquireTimeout], 2s.
	AcquireTimeout time.Duration

	// MaxKeyLen is the longest key accepted, in bytes. Keys must also be
	// visible ASCII (0x21-0x7E). Others get 400. Defaults to 255.
	MaxKeyLen int

	// MaxRequestBody is the largest request body read, in bytes. Larger ones
	// get 413. The body is read whole, to fingerprint it, before the request
	// takes a turn on the database (MaxInFlight). So is a keyless request's
	// body with Optional, which the handler then reads from memory. Defaults
	// to 1 MiB.
	MaxRequestBody int64

	// RequestBodyTimeout is how long the middleware waits for the request's
	// body to arrive whole. A body still incomplete then gets 408 Request
	// Timeout, and nothing is processed. It is set as the connection's read
	// deadline (http.ResponseController.SetReadDeadline), never longer than
	// the server's ReadTimeout. It is cleared once the body is read, so it
	// never bounds the handler. The ResponseWriter must reach net/http's
	// through Unwrap, as chi's, echo's and gin's do. Otherwise the server's
	// own timeouts alone bound the read. Defaults to
	// [DefaultRequestBodyTimeout], 30s. A negative value sets no deadline.
	RequestBodyTimeout time.Duration

	// MaxStoredBody is the largest response body stored for replay, in bytes.
	// A larger response is still sent and its effects committed, but only its
	// status and headers are stored. A retry gets them with an empty body and
	// BodyOmittedHeader. Defaults to 1 MiB. It is the middleware's own limit,
	// whatever Store.MaxResultBytes says. A stored response may hold 64 KiB
	// more, for the status, ReplayHeaders and what StoredBody adds to the
	// body. A response beyond that fails with 500, and its writes roll back.
	MaxStoredBody int

	// DocsURL is the page documenting this API's idempotency keys, with their
	// format, how long they are kept, and the error answers. The 400, 409, 413
	// and 422 answers point to it (draft-ietf-httpapi-idempotency-key-header
	// §2.7). Their problem type is DocsURL with the fragment of their section
	// (#missing-key, #invalid-key, #key-in-flight, #body-too-large,
	// #key-reused), and they carry a Link to DocsURL with rel="describedby".
	// Serve the page with [Middleware.Docs] at that path, or write your own.
	// It must have no fragment. Defaults to [DefaultDocsURL], a path on the
	// same server, which clients resolve against the request's URL.
	DocsURL string

	// ReplayHeaders are the response headers stored and replayed. The first
	// response carries all the handler's headers. Set-Cookie is refused,
	// because it would hand a session to whoever replays the key. Defaults to
	// Content-Type, Content-Encoding, Content-Language, Location, ETag,
	// Last-Modified and Cache-Control.
	ReplayHeaders []string
}

// ClientErrorPolicy is what becomes of a request whose handler answers 4xx
// ([Config.ClientErrors]). Statuses in [Config.NotKept] are never kept.
type ClientErrorPolicy int

const (
	// ReplayClientErrors rolls the handler's writes back and keeps the answer.
	// A retry with the key gets it again, like a success (draft §2.6), and a
	// request that failed leaves no effect behind. A corrected request needs a
	// new key, since with the old one it gets 422. The default.
	ReplayClientErrors ClientErrorPolicy = iota

	// ForgetClientErrors rolls the handler's writes back and keeps nothing.
	// The key stays free, so a retry, or a corrected request with the same
	// key, runs the handler again.
	ForgetClientErrors

	// CommitClientErrors commits the handler's writes and keeps the answer,
	// like a success. It is for handlers that record a refusal on purpose,
	// such as a declined payment. A handler must then undo partial writes
	// itself, with a savepoint.
	CommitClientErrors
)

// String returns the policy's Go name, such as "ReplayClientErrors".
func (p ClientErrorPolicy) String() string {
	switch p {
	case ReplayClientErrors:
		return "ReplayClientErrors"
	case ForgetClientErrors:
		return "ForgetClientErrors"
	case CommitClientErrors:
		return "CommitClientErrors"
	}
	return fmt.Sprintf("ClientErrorPolicy(%d)", int(p))
}

// DefaultDocsURL is Config.DocsURL's default. It is a path on the server
// itself, so the documentation needs no other host. Mount [Middleware.Docs] there.
const DefaultDocsURL = "/docs/idempotency-key"

// DefaultAcquireTimeout is Config.AcquireTimeout's default.
const DefaultAcquireTimeout = 2 * time.Second

// DefaultRequestBodyTimeout is Config.RequestBodyTimeout's default. A 1 MiB
// body arrives well within it at 64 KiB/s.
const DefaultRequestBodyTimeout = 30 * time.Second

// MinSecretLen is the shortest Config.Secret accepted, in bytes.
const MinSecretLen = 32

const (
	defaultHeader           = "Idempotency-Key"
	defaultConsumer         = "http"
	defaultMaxKeyLen        = 255
	defaultMaxRequestBody   = 1 << 20
	defaultMaxStoredBody    = 1 << 20
	defaultMaxWaitersPerKey = 8
	defaultMaxInFlight      = 4
)

var (
	defaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Content-Language",
		"Location", "ETag", "Last-Modified", "Cache-Control"}
	defaultSafeMethods = []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace}
	defaultNotKept     = []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests}
)

// New returns a Middleware recording keys in db. It checks cfg and fills in
// defaults. It does not touch the database, so run pgdedup.Migrate first.
func New(db DB, cfg Config) (*Middleware, error) {
	if db == nil {
		return nil, errors.New("idempotency: db must not be nil")
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cfg.DocsURL = cmp.Or(cfg.DocsURL, DefaultDocsURL)
	cfg.Header = http.CanonicalHeaderKey(cmp.Or(cfg.Header, defaultHeader))
	cfg.MaxKeyLen = cmp.Or(cfg.MaxKeyLen, defaultMaxKeyLen)
	cfg.MaxRequestBody = cmp.Or(cfg.MaxRequestBody, defaultMaxRequestBody)
	cfg.MaxStoredBody = cmp.Or(cfg.MaxStoredBody, defaultMaxStoredBody)
	cfg.MaxWaitersPerKey = cmp.Or(cfg.MaxWaitersPerKey, defaultMaxWaitersPerKey)
	cfg.AcquireTimeout = cmp.Or(cfg.AcquireTimeout, DefaultAcquireTimeout)
	cfg.RequestBodyTimeout = cmp.Or(cfg.RequestBodyTimeout, DefaultRequestBodyTimeout)
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, defaultInFlight(db))
	if cfg.ReplayHeaders == nil {
		cfg.ReplayHeaders = defaultReplayHeaders
	}
	if cfg.SafeMethods == nil {
		cfg.SafeMethods = defaultSafeMethods
	}
	if cfg.NotKept == nil {
		cfg.NotKept = defaultNotKept
	}
	customFingerprint := cfg.Fingerprint != nil
	cfg.Store.Consumer = cmp.Or(cfg.Store.Consumer, defaultConsumer)
	// lock_timeout 0 would wait forever. 1ms is the least Postgres honours.
	cfg.Store.LockTimeout = max(cfg.InFlightWait, time.Millisecond)
	store, err := pgdedup.New(db, cfg.Store)
	if err != nil {
		return nil, err
	}
	log := cfg.Store.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	m := &Middleware{
		db: db, store: store, cfg: cfg, log: log,
		customFingerprint: customFingerprint,
		safe:              map[string]bool{},
		notKept:           map[int]bool{},
		slots:             make(chan struct{}, cfg.MaxInFlight),
		flights:           flights{calls: map[string]*flight{}},
	}
	m.scopeKey, m.fpKey = deriveKeys(cfg.Secret)
	for _, method := range cfg.SafeMethods {
		m.safe[method] = true
	}
	for _, status := range cfg.NotKept {
		m.notKept[status] = true
	}
	return m, nil
}

// check rejects what New cannot fill in or would misuse.
func (cfg *Config) check() error {
	bad := func(format string, args ...any) error { return fmt.Errorf("idempotency: Config."+format, args...) }
	switch {
	case cfg.Scope == nil && !cfg.GlobalScope:
		return bad("Scope is required: return the verified identity of the request's sender " +
			"(set by authentication middleware that runs before this one), " +
			"or set Config.GlobalScope to share one key namespace among all clients")
	case cfg.Scope != nil && cfg.GlobalScope:
		return bad("Scope and GlobalScope exclude each other")
	case len(cfg.Secret) < MinSecretLen:
		return bad("Secret must be at least %d bytes (generate it at random: openssl rand -base64 32), got %d", MinSecretLen, len(cfg.Secret))
	case cfg.InFlightWait < 0:
		return bad("InFlightWait must not be negative, got %s", cfg.InFlightWait)
	case cfg.AcquireTimeout < 0:
		return bad("AcquireTimeout must not be negative, got %s", cfg.AcquireTimeout)
	case cfg.MaxInFlight < 0:
		return bad("MaxInFlight must not be negative, got %d", cfg.MaxInFlight)
	case cfg.MaxWaitersPerKey < 0:
		return bad("MaxWaitersPerKey must not be negative, got %d", cfg.MaxWaitersPerKey)
	case cfg.MaxKeyLen < 0 || cfg.MaxKeyLen > maxKeyLen:
		return bad("MaxKeyLen must be between 0 and %d, got %d", maxKeyLen, cfg.MaxKeyLen)
	case cfg.MaxRequestBody < 0:
		return bad("MaxRequestBody must not be negative, got %d", cfg.MaxRequestBody)
	case cfg.MaxStoredBody < 0:
		return bad("MaxStoredBody must not be negative, got %d", cfg.MaxStoredBody)
	case cfg.ClientErrors < ReplayClientErrors || cfg.ClientErrors > CommitClientErrors:
		return bad("ClientErrors is not one of ReplayClientErrors, ForgetClientErrors, CommitClientErrors: %d", int(cfg.ClientErrors))
	case cfg.Header != "" && !isToken(cfg.Header):
		return bad("Header %q is not an HTTP field name (letters, digits and !#$%%&'*+-.^_`|~, no spaces)", cfg.Header)
	}
	for _, s := range cfg.NotKept {
		if s < 400 || s > 499 {
			return bad("NotKept holds %d: only 4xx statuses can be left unkept (5xx never are, others always are)", s)
		}
	}
	for _, h := range cfg.ReplayHeaders {
		switch {
		case !isToken(h):
			return bad("ReplayHeaders holds %q, which is not an HTTP field name", h)
		case strings.EqualFold(h, "Set-Cookie"):
			return bad("ReplayHeaders must not hold Set-Cookie: whoever replays the key would get the session")
		}
	}
	for _, method := range cfg.SafeMethods {
		if !isToken(method) {
			return bad("SafeMethods holds %q, which is not an HTTP method", method)
		}
	}
	if err := validateDocsURL(cmp.Or(cfg.DocsURL, DefaultDocsURL)); err != nil {
		return bad("DocsURL %q: %w", cfg.DocsURL, err)
	}
	return nil
}

// maxKeyLen is the longest MaxKeyLen. A scoped ID (scope hash, space, key)
// must stay a valid message ID.
const maxKeyLen = pgdedup.MaxMessageIDLen - scopeHashLen - 1

// defaultInFlight is MaxInFlight's default for db.
func defaultInFlight(db DB) int {
	if p, ok := db.(interface{ Stat() *pgxpool.Stat }); ok {
		if n := int(p.Stat().MaxConns()); n > 0 {
			return max(1, n/2)
		}
	}
	return defaultMaxInFlight
}

// isToken reports whether s is an RFC 9110 token, as field names and methods are.
func isToken(s string) bool {
	return s != "" && !slices.ContainsFunc([]byte(s), func(c byte) bool { return !isTChar(c) })
}
