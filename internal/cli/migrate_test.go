package cli_test

import (
	"context"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// up, status, down and up again on an empty schema, checking the table each
// time by using it. The migrations are read from pgdedup.Migrations, so adding
// one does not change this test.
func TestMigrateLifecycle(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	migrate := func(action string) result { return run(t, "migrate", action, "--database-url", db.URL) }
	files, err := fs.Glob(pgdedup.Migrations, "*.sql")
	if err != nil || len(files) < 2 || files[0] != "00001_processed_messages.sql" {
		t.Fatalf("migrations %v, %v; want 00001_processed_messages.sql first of several", files, err)
	}
	version := func(file string) int { v, _ := strconv.Atoi(file[:5]); return v }
	last := files[len(files)-1]

	r := migrate("status")
	if r.code != 0 || !regexp.MustCompile(`00001_processed_messages.sql +pending`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, fmt.Sprintf("%d pending: run `pgdedup migrate up`", len(files))) {
		t.Errorf("status before up: %s", r)
	}
	if exists(t, db.Pool, pgdedup.VersionTable) {
		t.Errorf("status created %s; it must change nothing", pgdedup.VersionTable)
	}

	r = migrate("up")
	for _, f := range files {
		if !strings.Contains(r.stdout, "applied "+f+" in ") {
			t.Errorf("up did not apply %s", f)
		}
	}
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("now at version %d", version(last))) {
		t.Errorf("up: %s", r)
	}
	usable(t, db.Pool)
	if r = migrate("up"); r.code != 0 || r.stdout != fmt.Sprintf("already up to date at version %d\n", version(last)) {
		t.Errorf("second up: %s", r)
	}
	r = migrate("status")
	if r.code != 0 || !regexp.MustCompile(`00001_processed_messages.sql +applied +20`).MatchString(r.stdout) || !strings.HasSuffix(r.stdout, "up to date\n") {
		t.Errorf("status after up: %s", r)
	}

	// down reverts one migration at a time, the newest first.
	for i := len(files) - 1; i >= 0; i-- {
		want := 0
		if i > 0 {
			want = version(files[i-1])
		}
		r = migrate("down")
		if r.code != 0 || !strings.Contains(r.stdout, "reverted "+files[i]+" in ") || !strings.Contains(r.stdout, fmt.Sprintf("now at version %d", want)) {
			t.Errorf("down from %s: %s", files[i], r)
		}
		if i > 0 {
			usable(t, db.Pool)
		}
	}
	if exists(t, db.Pool, "processed_messages") {
		t.Error("processed_messages still exists after down")
	}
	if r = migrate("down"); r.code != 0 || !strings.Contains(r.stdout, "nothing to revert") {
		t.Errorf("down with nothing applied: %s", r)
	}
	if r = migrate("up"); r.code != 0 {
		t.Errorf("up after down: %s", r)
	}
	usable(t, db.Pool)
}

// migrate sql prints SQL that creates a working table when run as is, and with
// --down SQL that removes it; it needs no database.
func TestMigrateSQL(t *testing.T) {
	t.Parallel()
	db := pgtest.NewUnmigrated(t)
	up, down := run(t, "migrate", "sql"), run(t, "migrate", "sql", "--down")
	for _, r := range []result{up, down} {
		if r.code != 0 || strings.Contains(r.stdout, "+goose") || !strings.Contains(r.stdout, "BEGIN;") || !strings.Contains(r.stdout, "COMMIT;") {
			t.Fatalf("migrate sql: %s", r)
		}
	}
	if strings.Contains(up.stdout, "DROP TABLE") || !strings.Contains(down.stdout, "DROP TABLE") {
		t.Fatalf("up and down mixed:\n%s\n---\n%s", up.stdout, down.stdout)
	}
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, up.stdout); err != nil {
		t.Fatalf("running migrate sql: %v\n%s", err, up.stdout)
	}
	usable(t, db.Pool)
	r := run(t, "migrate", "up", "--database-url", db.URL)
	if r.code != 1 || !strings.Contains(r.stderr, "created by `pgdedup migrate sql` or by hand?") {
		t.Errorf("migrate up over a table made by migrate sql: %s", r)
	}
	if _, err := db.Pool.Exec(ctx, down.stdout); err != nil {
		t.Fatalf("running migrate sql --down: %v\n%s", err, down.stdout)
	}
	if exists(t, db.Pool, "processed_messages") {
		t.Error("processed_messages still exists after the down SQL")
	}
}

func TestMigrateUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"migrate"},
		{"migrate", "sideways"},
		{"migrate", "up", "now"},
		{"migrate", "up", "--down"},
	} {
		if r := run(t, args...); r.code != 2 || !strings.Contains(r.stderr, "pgdedup migrate --help") {
			t.Errorf("%q: %s", args, r)
		}
	}
}

func exists(t *testing.T, pool *pgxpool.Pool, table string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// usable checks that processed_messages works: an ID processed once is a
// duplicate the second time.
func usable(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	id := fmt.Sprint("m-", time.Now().UnixNano()) // new each call: the table may hold earlier IDs
	for i, want := range []bool{true, false} {
		if ok, err := store.Process(context.Background(), id, noop); ok != want || err != nil {
			t.Fatalf("Process #%d = %v, %v; want %v", i+1, ok, err, want)
		}
	}
}
