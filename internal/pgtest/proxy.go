package pgtest

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// NewProxy starts a [wireproxy.Proxy] in front of the server of dbURL (a
// postgres:// URL), configured by cfg apart from its Target, and returns it
// with dbURL rewritten to connect through it. The proxy stops when t ends.
func NewProxy(t testing.TB, dbURL string, cfg wireproxy.Config) (*wireproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil || u.Host == "" {
		t.Fatalf("pgtest: a proxy needs a postgres:// URL with a host, got %q", dbURL)
	}
	cfg.Target = u.Host
	if u.Port() == "" {
		cfg.Target += ":5432"
	}
	p, err := wireproxy.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	proxied, err := p.URL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return p, proxied
}

// Pool opens a pool of at most maxConns connections on dbURL, closed when t
// ends. The pool does not ping a connection before handing it out, so a test
// that counts round trips sees only its own.
func Pool(t testing.TB, dbURL string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.MaxConns = maxConns
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
