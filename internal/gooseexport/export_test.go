package gooseexport_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/gooseexport"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

var now = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// sources are pgdedup's migrations, whatever they are today.
func sources(t *testing.T) []string {
	t.Helper()
	names, err := fs.Glob(pgdedup.Migrations(), "*.sql")
	if err != nil || len(names) < 2 {
		t.Fatalf("pgdedup.Migrations(): %v, %v", names, err)
	}
	return names
}

// hostDir returns a migrations directory holding the host's own files, each
// creating a table named after the file.
func hostDir(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		table := "host_" + strings.TrimSuffix(n[strings.IndexByte(n, '_')+1:], ".sql")
		sql := fmt.Sprintf("-- +goose Up\nCREATE TABLE %s (id int);\n\n-- +goose Down\nDROP TABLE %[1]s;\n", table)
		if err := os.WriteFile(filepath.Join(dir, n), []byte(sql), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func export(t *testing.T, src fs.FS, dir string, after int64) *gooseexport.Plan {
	t.Helper()
	plan, err := gooseexport.NewPlan(src, dir, after, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.Apply(src, dir); err != nil {
		t.Fatal(err)
	}
	return plan
}

func names(files []gooseexport.File) []string {
	var out []string
	for _, f := range files {
		out = append(out, f.Name)
	}
	return out
}

func TestPlanNumbersAfterTheDirectory(t *testing.T) {
	t.Parallel()
	src := sources(t)
	want := func(first int, format string) []string {
		var out []string
		for i, s := range src {
			out = append(out, fmt.Sprintf(format, first+i)+"_pgdedup_"+s)
		}
		return out
	}
	wantTimes := func(first time.Time) []string {
		var out []string
		for i, s := range src {
			out = append(out, first.Add(time.Duration(i)*time.Second).Format("20060102150405")+"_pgdedup_"+s)
		}
		return out
	}
	for name, c := range map[string]struct {
		files []string
		after int64
		want  []string
	}{
		"empty":               {nil, 0, want(1, "%05d")},
		"sequential":          {[]string{"00001_users.sql", "00002_orders.sql", "notes.txt"}, 0, want(3, "%05d")},
		"sequential, after":   {[]string{"00001_users.sql"}, 40, want(41, "%05d")},
		"timestamps":          {[]string{"20240101120000_users.sql"}, 0, wantTimes(now)},
		"timestamps, future":  {[]string{"20991231235959_users.sql"}, 0, wantTimes(time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC))},
		"timestamps, after":   {[]string{"20240101120000_users.sql"}, 20250101000000, wantTimes(time.Date(2025, 1, 1, 0, 0, 1, 0, time.UTC))},
		"hybrid, before fix":  {[]string{"00001_users.sql", "20240101120000_orders.sql"}, 0, wantTimes(now)},
		"after goose fix":     {[]string{"00001_users.sql", "00002_orders.sql", "00003_x.sql"}, 0, want(4, "%05d")},
		"go migrations count": {[]string{"00001_users.sql", "00007_backfill.go"}, 0, want(8, "%05d")},
	} {
		dir := t.TempDir()
		for _, f := range c.files {
			if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		plan, err := gooseexport.NewPlan(pgdedup.Migrations(), dir, c.after, now)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got := names(plan.Write); !slices.Equal(got, c.want) || len(plan.Present) != 0 {
			t.Errorf("%s: writes %q, present %v; want %q", name, got, plan.Present, c.want)
		}
	}
}

// A second export, after the first was applied (and after goose fix renamed
// its files), writes nothing. Copies made by hand count as there.
func TestPlanSkipsMigrationsAlreadyThere(t *testing.T) {
	t.Parallel()
	dir := hostDir(t, "20240101120000_users.sql")
	first := export(t, pgdedup.Migrations(), dir, 0)
	if len(first.Write) != len(sources(t)) {
		t.Fatalf("first export wrote %q", names(first.Write))
	}
	for i, f := range first.Write { // as goose fix would rename them
		v := f.Name[:strings.IndexByte(f.Name, '_')]
		fixed := strings.Replace(f.Name, v, fmt.Sprintf("%05d", 10+i), 1)
		if err := os.Rename(filepath.Join(dir, f.Name), filepath.Join(dir, fixed)); err != nil {
			t.Fatal(err)
		}
	}
	again, err := gooseexport.NewPlan(pgdedup.Migrations(), dir, 0, now)
	if err != nil || len(again.Write) != 0 || len(again.Present) != len(sources(t)) {
		t.Fatalf("second export: writes %q, present %d, %v", names(again.Write), len(again.Present), err)
	}

	verbatim := t.TempDir()
	for _, s := range sources(t)[:1] {
		body, _ := fs.ReadFile(pgdedup.Migrations(), s)
		if err := os.WriteFile(filepath.Join(verbatim, s), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	plan, err := gooseexport.NewPlan(pgdedup.Migrations(), verbatim, 0, now)
	if err != nil || len(plan.Present) != 1 || plan.Present[0].Name != sources(t)[0] || len(plan.Write) != len(sources(t))-1 {
		t.Fatalf("directory with a verbatim copy: %+v, %v", plan, err)
	}
}

func TestPlanRefusals(t *testing.T) {
	t.Parallel()
	src := sources(t)
	clash := hostDir(t, "00001_users.sql")
	body, _ := fs.ReadFile(pgdedup.Migrations(), src[0])
	if err := os.WriteFile(filepath.Join(clash, src[0]), body, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		dir   string
		after int64
		want  string
	}{
		"verbatim copy with a taken version": {clash, 0, "goose refuses duplicate versions"},
		"after below the newest":             {hostDir(t, "00005_users.sql"), 3, "below the directory's newest, 5 (00005_users.sql)"},
		"negative after":                     {t.TempDir(), -1, "negative"},
		"after too close to the largest":     {t.TempDir(), math.MaxInt64 - 1, "migrations after version 9223372036854775806, --after: goose versions are 64-bit integers, at most 9223372036854775807"},
		"newest too close to the largest":    {hostDir(t, "9223372036854775805_users.sql"), 0, "migrations after version 9223372036854775805, the directory's newest version (9223372036854775805_users.sql)"},
		"no directory":                       {filepath.Join(t.TempDir(), "nope"), 0, "no such file or directory"},
	} {
		if _, err := gooseexport.NewPlan(pgdedup.Migrations(), c.dir, c.after, now); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

// schemaDigest describes what pgdedup's migrations built in schema, the
// columns, indexes and constraints of every table but the host's and the
// version tables.
func schemaDigest(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var d string
	err := db.Pool.QueryRow(context.Background(), `
		SELECT coalesce(string_agg(replace(x, $1::text, 'S'), E'\n' ORDER BY x), '') FROM (
			SELECT format('%s.%s %s %s %s', table_name, column_name, data_type, is_nullable, column_default)
			FROM information_schema.columns WHERE table_schema = $1::text
			  AND table_name NOT LIKE 'host\_%' AND table_name NOT IN ('goose_db_version', 'pgdedup_db_version', 'pgdedup_db_lock')
			UNION ALL
			SELECT indexdef FROM pg_indexes WHERE schemaname = $1::text
			  AND tablename NOT LIKE 'host\_%' AND tablename NOT IN ('goose_db_version', 'pgdedup_db_version', 'pgdedup_db_lock')
		) s(x)`, db.Schema).Scan(&d)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// builtLikeMigrate checks that db, migrated by the host's goose, has exactly
// the tables pgdedup.Migrate builds, and that they work.
func builtLikeMigrate(t *testing.T, db *pgtest.DB) {
	t.Helper()
	want, got := schemaDigest(t, pgtest.New(t)), schemaDigest(t, db)
	if got != want || got == "" {
		t.Fatalf("goose built:\n%s\n\npgdedup.Migrate builds:\n%s", got, want)
	}
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	for i, want := range []bool{true, false} {
		if ok, err := store.Process(context.Background(), "m-1", noop); ok != want || err != nil {
			t.Fatalf("Process #%d = %v, %v; want %v", i+1, ok, err, want)
		}
	}
}

// migrate runs pgdedup.Migrate on db, as a host that also calls it would.
func migrate(t *testing.T, db *pgtest.DB) error {
	t.Helper()
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	return pgdedup.Migrate(context.Background(), sqlDB)
}

// A host numbers its migrations sequentially, 00001 first. pgdedup's files
// copied as they are make its goose panic. Exported, they apply, and the host
// keeps numbering after them with goose create -s.
func TestGooseCLISequentialHost(t *testing.T) {
	t.Parallel()
	goose := pgtest.NewGoose(t)
	db := pgtest.NewUnmigrated(t)
	dir := hostDir(t, "00001_users.sql")
	goose.Up(dir, db)

	copied := t.TempDir()
	for _, n := range append(sources(t), "00001_users.sql") {
		from := pgdedup.Migrations()
		if n == "00001_users.sql" {
			from = os.DirFS(dir)
		}
		body, _ := fs.ReadFile(from, n)
		if err := os.WriteFile(filepath.Join(copied, n), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, code := goose.Run(copied, "postgres", db.URL, "up"); code == 0 || !strings.Contains(out, "duplicate version 1") {
		t.Fatalf("goose up with the files copied as they are: exit %d:\n%s", code, out)
	}

	plan := export(t, pgdedup.Migrations(), dir, 0)
	if first := plan.Write[0].Name; !strings.HasPrefix(first, "00002_pgdedup_00001_") {
		t.Fatalf("first export file %s, want 00002_pgdedup_00001_…", first)
	}
	goose.Up(dir, db)
	builtLikeMigrate(t, db)

	if out, code := goose.Run(dir, "-s", "create", "refunds", "sql"); code != 0 {
		t.Fatalf("goose -s create: exit %d:\n%s", code, out)
	}
	next := fmt.Sprintf("%05d_refunds.sql", len(sources(t))+2)
	if _, err := os.Stat(filepath.Join(dir, next)); err != nil {
		t.Fatalf("goose -s create did not number after the exported files: %v", err)
	}
	goose.Up(dir, db) // the new, empty migration
	out, code := goose.Run(dir, "postgres", db.URL, "status")
	if code != 0 || strings.Contains(out, "Pending") || strings.Count(out, "_pgdedup_") != len(sources(t)) {
		t.Fatalf("goose status: exit %d:\n%s", code, out)
	}

	// The host now also calls pgdedup.Migrate. It is told why not, and
	// changes nothing.
	if err := migrate(t, db); !errors.Is(err, pgdedup.ErrMigratedByAnotherTool) || !strings.Contains(err.Error(), "--goose-dir") {
		t.Fatalf("pgdedup.Migrate after goose applied the exported files: %v", err)
	}
	var versionTable bool
	if err := db.Pool.QueryRow(context.Background(), `SELECT to_regclass('pgdedup_db_version') IS NOT NULL`).Scan(&versionTable); err != nil || versionTable {
		t.Fatalf("Migrate created %s (%v)", pgdedup.VersionTable, err)
	}
}

// A host has timestamp versions, and its migrations are applied. The copies
// as they are would be "missing" migrations to its goose. Exported, they
// apply.
// goose fix later renames everything to sequential, which the next export
// understands, and the renamed files still build the schema.
func TestGooseCLITimestampHostWithAppliedMigrations(t *testing.T) {
	t.Parallel()
	goose := pgtest.NewGoose(t)
	db := pgtest.NewUnmigrated(t)
	dir := hostDir(t, "20240101120000_users.sql", "20240301090000_orders.sql")
	goose.Up(dir, db)

	copied := hostDir(t, "20240101120000_users.sql", "20240301090000_orders.sql")
	for _, s := range sources(t) {
		body, _ := fs.ReadFile(pgdedup.Migrations(), s)
		if err := os.WriteFile(filepath.Join(copied, s), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, code := goose.Run(copied, "postgres", db.URL, "up"); code == 0 || !strings.Contains(out, "missing migrations") {
		t.Fatalf("goose up with the files copied as they are: exit %d:\n%s", code, out)
	}

	plan := export(t, pgdedup.Migrations(), dir, 0)
	stamp := regexp.MustCompile(`^20[0-9]{12}_pgdedup_`)
	for _, f := range plan.Write {
		if !stamp.MatchString(f.Name) {
			t.Fatalf("exported %s into a timestamp directory", f.Name)
		}
	}
	goose.Up(dir, db)
	builtLikeMigrate(t, db)
	if err := migrate(t, db); !errors.Is(err, pgdedup.ErrMigratedByAnotherTool) {
		t.Fatalf("pgdedup.Migrate after goose: %v", err)
	}

	if out, code := goose.Run(dir, "fix"); code != 0 {
		t.Fatalf("goose fix: exit %d:\n%s", code, out)
	}
	again, err := gooseexport.NewPlan(pgdedup.Migrations(), dir, 0, now)
	if err != nil || len(again.Write) != 0 {
		t.Fatalf("export after goose fix: %+v, %v", again, err)
	}
	fresh := pgtest.NewUnmigrated(t)
	goose.Up(dir, fresh)
	builtLikeMigrate(t, fresh)
}

// After a pgdedup upgrade, exporting again adds only the new migrations, in
// order, whatever they hold. Here the new one is one that goose must run
// outside a transaction (CREATE INDEX CONCURRENTLY fails inside one).
func TestGooseCLIUpgradeAddsOnlyNewMigrations(t *testing.T) {
	t.Parallel()
	goose := pgtest.NewGoose(t)
	db := pgtest.NewUnmigrated(t)
	dir := hostDir(t, "00001_users.sql")

	older, newer := fstest.MapFS{}, fstest.MapFS{}
	for i, s := range sources(t) {
		body, _ := fs.ReadFile(pgdedup.Migrations(), s)
		if i == 0 {
			older[s] = &fstest.MapFile{Data: body}
		}
		newer[s] = &fstest.MapFile{Data: body}
	}
	newer["09999_processed_at_index.sql"] = &fstest.MapFile{Data: []byte(`-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY processed_messages_processed_at_idx ON processed_messages (processed_at);

-- +goose Down
DROP INDEX CONCURRENTLY processed_messages_processed_at_idx;
`)}

	if plan := export(t, older, dir, 0); len(plan.Write) != 1 {
		t.Fatalf("first export: %q", names(plan.Write))
	}
	goose.Up(dir, db)
	plan := export(t, newer, dir, 0)
	if len(plan.Present) != 1 || len(plan.Write) != len(newer)-1 ||
		plan.Write[len(plan.Write)-1].Name != fmt.Sprintf("%05d_pgdedup_09999_processed_at_index.sql", len(newer)+1) {
		t.Fatalf("export after the upgrade: writes %q, present %q", names(plan.Write), names(plan.Present))
	}
	goose.Up(dir, db)
	var n int
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'processed_messages_processed_at_idx'`, db.Schema).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the NO TRANSACTION migration's index: %d, %v", n, err)
	}
	if out, code := goose.Run(dir, "postgres", db.URL, "down-to", "1"); code != 0 {
		t.Fatalf("goose down-to 1: exit %d:\n%s", code, out)
	}
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'processed_messages'`, db.Schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("processed_messages after goose down-to 1: %d, %v", n, err)
	}
}
