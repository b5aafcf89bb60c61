// Package pgdeduptest gives each test its own freshly migrated schema in a real
// PostgreSQL database. It gets the pool, the schema's name and a connection
// string for it, all dropped when the test ends. It is what pgdedup's own
// tests, its contrib modules and its examples use, and what a service that uses
// pgdedup can use in its tests.
//
// For a service's handler, [DeliverSequentially], [DeliverConcurrently] and
// [DeliverCutBeforeCommit] deliver one message the ways a broker can (again,
// at once, after a crash before COMMIT), and [AssertOnce] checks with the
// test's own query that its effect happened once.
//
// Its API is not covered by pgdedup's compatibility promise. It may change in
// any release, as the project's tests need.
//
// The database is the first of these that works. TEST_DATABASE_URL comes
// first, and when it is set nothing else is tried. Next is a container from
// testcontainers' postgres module when a Docker engine answers, then a server
// on localhost (port 5432, user postgres, database postgres). Last is a
// throwaway cluster started from the local PostgreSQL server binaries, stopped
// when the test binary exits. When none works, the test fails naming them all
// and what to do. It never skips.
//
// With TEST_PGBOUNCER set, TEST_DATABASE_URL is taken to point at PgBouncer in
// transaction pooling mode, which refuses search_path as a startup parameter.
// Each test then also gets a login role of its own whose default search_path
// is its schema (see [PgBouncer]). With TEST_CITUS_DISTRIBUTE set, it is taken
// to be a Citus coordinator (see [CitusColumn]).
package pgdeduptest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgserver"
)

// localURL is the server tried after Docker, the docker-compose service.
const localURL = "postgres://postgres@localhost:5432/postgres?sslmode=disable"

var (
	once   sync.Once
	dbURL  string
	urlErr error
)

// URL returns the URL of the test database, resolving it once per test binary.
func URL(t testing.TB) string {
	t.Helper()
	once.Do(func() { dbURL, urlErr = resolve() })
	if urlErr != nil {
		t.Fatal(urlErr)
	}
	return dbURL
}

// candidates are the servers tests try, in order (see the package doc).
var candidates = []pgserver.Candidate{
	pgserver.Env("TEST_DATABASE_URL"),
	{Name: "Docker through testcontainers", Open: startContainer},
	pgserver.Server(localURL),
	pgserver.Throwaway(),
}

// noServerHint ends the error when no candidate works.
const noServerHint = "Start one with `docker compose up -d` in the repository, set TEST_DATABASE_URL " +
	"to a server's URL, or install PostgreSQL's server binaries (Debian: apt-get install postgresql)."

// resolve chooses the server. A throwaway cluster is stopped by its watchdog
// when the test binary exits, because no test hook runs at exit.
func resolve() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u, _, _, err := pgserver.Choose(ctx, noServerHint, candidates...)
	if err != nil {
		return "", fmt.Errorf("pgdeduptest: %w", err)
	}
	return u, nil
}

func dockerAnswers(ctx context.Context) (ok bool) {
	defer func() {
		if recover() != nil { // older testcontainers releases panic without Docker
			ok = false
		}
	}()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return p.Health(hctx) == nil
}

// startContainer starts the image postgres:17-alpine when a Docker engine
// answers. Ryuk, testcontainers' reaper, removes it when the test binary
// exits.
func startContainer(ctx context.Context) (string, func(), error) {
	if !dockerAnswers(ctx) {
		return "", nil, errors.New("no Docker engine answers")
	}
	c, err := tcpostgres.Run(ctx, "postgres:17-alpine",
		tcpostgres.WithDatabase("pgdedup"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return "", nil, fmt.Errorf("testcontainers: %w", err)
	}
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	return u, nil, err
}

// DB is a test's database. Its pool's connections use the test's own schema
// as search_path, migrated with pgdedup.Migrate.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string // unquoted, and safe to use unquoted in SQL (letters, digits, _)

	// URL connects to the test's schema. It sets search_path to Schema or,
	// behind PgBouncer, logs in as the test's role, whose default search_path
	// is Schema.
	URL string

	base string // the database URL, logging in as its superuser
}

// New creates a schema for t, migrates it and returns a pool on it. The schema
// is dropped and the pool closed when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	db := NewUnmigrated(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	// This is a hang guard, not a bound on speed. Migration 00003's CREATE
	// INDEX CONCURRENTLY waits for every older transaction in the database,
	// the other tests' migrations among them, which on a busy machine take
	// long.
	ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
	defer cancel()
	if err := pgdedup.Migrate(ctx, sqlDB); err != nil {
		t.Fatalf("pgdeduptest: migrate %s: %v", db.Schema, err)
	}
	if col := CitusColumn(); col != "" {
		db.Distribute(t, "processed_messages", col, false)
	}
	return db
}

// migrateTimeout bounds New's migration. A comment in New says why it is long.
const migrateTimeout = 10 * time.Minute

// NewUnmigrated is New without the migrations, so the schema is empty.
func NewUnmigrated(t testing.TB) *DB {
	t.Helper()
	base := URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := "pgdedup_test_" + randomHex(6)

	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgdeduptest: connect: %v", err)
	}
	defer admin.Close(ctx)
	if err := createSchema(ctx, admin, schema); err != nil {
		t.Fatalf("pgdeduptest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("pgdeduptest: drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if err := dropSchema(ctx, conn, schema); err != nil {
			t.Errorf("pgdeduptest: drop schema %s: %v", schema, err)
		}
	})

	url, err := schemaURL(base, schema)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgdeduptest: %v", err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgdeduptest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return &DB{Pool: pool, Schema: schema, URL: url, base: base}
}

// WithSearchPath returns the connection string u (URL or key=value form)
// with its search_path set to schema.
func WithSearchPath(u, schema string) (string, error) {
	if !strings.HasPrefix(u, "postgres://") && !strings.HasPrefix(u, "postgresql://") {
		return u + " search_path=" + schema, nil
	}
	parsed, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("pgdeduptest: parse database URL: %w", err)
	}
	q := parsed.Query()
	q.Set("search_path", schema)
	parsed.RawQuery = q.Encode()
	return parsed.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ForExample gives an Example function a migrated schema of its own, like New.
// It panics when no database answers. Call the returned func when done.
func ForExample() (*pgxpool.Pool, func()) {
	once.Do(func() { dbURL, urlErr = resolve() })
	if urlErr != nil {
		panic(urlErr)
	}
	t := &exampleTB{}
	db := New(t)
	return db.Pool, t.cleanup
}

// exampleTB is the part of testing.TB that New uses, for Example functions.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper()                   {}
func (e *exampleTB) Cleanup(f func())          { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (e *exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (e *exampleTB) Errorf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

func (e *exampleTB) cleanup() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
