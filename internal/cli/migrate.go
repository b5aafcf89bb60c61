package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"

	"github.com/pgdedup/pgdedup"
)

const migrateHelp = `Usage: pgdedup migrate up|down|status|sql [flags]

Runs pgdedup's embedded migrations, which create processed_messages in the
first schema of the connection's search_path. Applied versions are recorded in
pgdedup's own table, ` + pgdedup.VersionTable + `, never in your goose_db_version.

  up       apply every pending migration; safe from several processes at once
           (they take turns: one waits for another's lock, and says whose)
  down     revert the last applied migration. It first says what reverting
           drops (tables and columns) and how many rows hold data there, and
           changes nothing unless you pass --confirm; when the data is not
           empty it also needs --discard-data. Reverting 00001 DROPS
           processed_messages: every remembered ID is forgotten, and messages
           redelivered afterwards are processed again; reverting 00004 drops
           processed_offsets, the record of Kafka progress.
  status   list the migrations, applied or pending; reads only, and never
           waits for a migration in progress
  sql      print the migration SQL, for teams that apply migrations with their
           own tool; needs no database. With --down, the reverting SQL. With
           --goose-dir, write goose files into your goose directory instead.

Choose the schema with the URL: ?options=-csearch_path%3Dname. Pass the URL in
DATABASE_URL rather than --database-url: a command line is visible to every
user of the machine (ps).

Flags:
{{flags}}
Examples:
  DATABASE_URL='postgres://app@db:5432/app?sslmode=verify-full' pgdedup migrate up
  DATABASE_URL='postgres://app@db/app?options=-csearch_path%3Dops' pgdedup migrate status
  pgdedup migrate down                  # says what it would revert and drop; changes nothing
  pgdedup migrate down --confirm
  pgdedup migrate sql | psql "$DATABASE_URL"
  pgdedup migrate sql --goose-dir db/migrations && goose -dir db/migrations postgres "$DATABASE_URL" up
`

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("migrate", migrateHelp, stdout, stderr)
	fs := c.flags(false)
	down := fs.Bool("down", false, "with sql: print the down migrations, newest first")
	gooseDir := fs.String("goose-dir", "", "with sql: write the pgdedup migrations `DIR` lacks into it as goose files, "+
		"numbered after DIR's newest version in its style (00007_… or a timestamp), for your own goose CLI to apply. "+
		"Run it again after upgrading pgdedup: it adds only the new ones. Then do not call pgdedup.Migrate "+
		"or 'pgdedup migrate up' on that database")
	after := fs.Int64("after", 0, "with --goose-dir: number after `VERSION` instead")
	confirm := fs.Bool("confirm", false, "with down: revert the migration (without it, down only says what it would do)")
	discard := fs.Bool("discard-data", false, "with down --confirm: revert even though a table or column it drops holds data, "+
		"which is lost")
	rest, code, ok := c.parseArgs(fs, args, 1, "missing action: up, down, status or sql")
	if !ok {
		return code
	}
	action := rest[0]
	if action != "down" && (*confirm || *discard) {
		return c.usageError("--confirm and --discard-data only go with down")
	}
	switch action {
	case "sql":
		switch {
		case *gooseDir != "" && *down:
			return c.usageError("--down does not go with --goose-dir: the goose files hold their Down sections")
		case *gooseDir != "":
			return c.exportGoose(*gooseDir, *after)
		case *after != 0:
			return c.usageError("--after goes with --goose-dir")
		}
		return c.migrationSQL(*down)
	case "up", "down", "status":
	default:
		return c.usageError("unknown action %q: want up, down, status or sql", action)
	}
	switch {
	case *down:
		return c.usageError("--down only goes with sql; to revert, run 'pgdedup migrate down'")
	case *gooseDir != "" || *after != 0:
		return c.usageError("--goose-dir and --after only go with sql")
	}

	db, code := c.openDB(ctx)
	if db == nil {
		return code
	}
	defer db.Close()
	// Who owns the migrations is checked first, by reading only, so that
	// none of the actions creates pgdedup's tables next to another tool's.
	if err := pgdedup.CheckMigrationOwner(ctx, db); err != nil {
		if action == "status" && errors.Is(err, pgdedup.ErrMigratedByAnotherTool) {
			fmt.Fprintln(c.stdout, strings.TrimPrefix(err.Error(), "pgdedup: "))
			return exitOK
		}
		return c.fail(err)
	}
	if action == "status" {
		return c.status(ctx, db)
	}
	p, err := pgdedup.NewMigrationProvider(db)
	if err != nil {
		return c.fail(err)
	}
	if action == "up" {
		return c.up(ctx, db, p)
	}
	return c.down(ctx, db, p, *confirm, *discard)
}

// applied reads which migrations VersionTable records, and when each was
// applied, as goose's Provider does (a row per version applied, which
// reverting deletes). It takes no lock, because it reads one table and writes
// nothing.
// A missing table records nothing.
func applied(ctx context.Context, db *sql.DB) (map[int64]time.Time, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1::text) IS NOT NULL`, pgdedup.VersionTable).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up %s: %w", pgdedup.VersionTable, err)
	}
	versions := map[int64]time.Time{}
	if !exists {
		return versions, nil
	}
	rows, err := db.QueryContext(ctx, `SELECT version_id, max(tstamp) FROM `+pgdedup.VersionTable+
		` WHERE version_id > 0 GROUP BY version_id`)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", pgdedup.VersionTable, err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		var at time.Time
		if err := rows.Scan(&v, &at); err != nil {
			return nil, fmt.Errorf("read %s: %w", pgdedup.VersionTable, err)
		}
		versions[v] = at
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", pgdedup.VersionTable, err)
	}
	return versions, nil
}

// newest is the highest version in versions, 0 for none.
func newest(versions map[int64]time.Time) int64 {
	var v int64
	for version := range versions {
		v = max(v, version)
	}
	return v
}

// waitNotice says, when another process holds the migration lock, that the
// action about to start waits for it and whose it is.
func (c *command) waitNotice(ctx context.Context, db *sql.DB) {
	if holder, err := pgdedup.MigrationLockHolder(ctx, db); err == nil && holder != "" {
		fmt.Fprintf(c.stderr, "pgdedup %s: waiting for the migration lock (up to 10 minutes; Ctrl-C to stop): held by %s\n",
			c.name, c.redact(holder))
	}
}

func (c *command) up(ctx context.Context, db *sql.DB, p *goose.Provider) int {
	before, err := applied(ctx, db)
	if err != nil {
		return c.fail(err)
	}
	if len(before) < len(p.ListSources()) {
		c.waitNotice(ctx, db)
	}
	results, err := p.Up(ctx)
	for _, r := range results {
		if r.Error == nil {
			fmt.Fprintf(c.stdout, "applied %s in %s\n", path.Base(r.Source.Path), r.Duration.Round(time.Millisecond))
		}
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P07" { // duplicate_table
			err = fmt.Errorf("%w\n(the table exists but %s does not record it: was it created by your goose "+
				"(files from `pgdedup migrate sql --goose-dir`), by `pgdedup migrate sql` or by hand? "+
				"Then keep applying pgdedup's migrations that way, and do not run 'pgdedup migrate up' on this database)", err, pgdedup.VersionTable)
		}
		return c.fail(fmt.Errorf("migrate up: %w", err))
	}
	after, err := applied(ctx, db)
	if err != nil {
		return c.fail(err)
	}
	if len(results) == 0 {
		fmt.Fprintf(c.stdout, "already up to date at version %d\n", newest(after))
	} else {
		fmt.Fprintf(c.stdout, "now at version %d\n", newest(after))
	}
	return exitOK
}

// status lists the migrations. Unlike goose's Status, it creates nothing and
// takes no lock. It reads the version table as it is, so it answers at once
// even while a long migration holds the lock.
func (c *command) status(ctx context.Context, db *sql.DB) int {
	versions, err := applied(ctx, db)
	if err != nil {
		return c.fail(err)
	}
	p, err := pgdedup.NewMigrationProvider(db) // for the list of migrations only
	if err != nil {
		return c.fail(err)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tMIGRATION\tSTATE\tAPPLIED AT")
	pending := 0
	for _, s := range p.ListSources() {
		state, at := goose.StatePending, "-"
		if t, ok := versions[s.Version]; ok {
			state, at = goose.StateApplied, t.UTC().Format(time.RFC3339)
		} else {
			pending++
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Version, path.Base(s.Path), state, at)
	}
	tw.Flush()
	if holder, err := pgdedup.MigrationLockHolder(ctx, db); err == nil && holder != "" {
		fmt.Fprintf(c.stdout, "migrating now: the migration lock is held by %s\n", c.redact(holder))
	}
	if pending > 0 {
		fmt.Fprintf(c.stdout, "%d pending: run `pgdedup migrate up`\n", pending)
	} else {
		fmt.Fprintln(c.stdout, "up to date")
	}
	return exitOK
}
