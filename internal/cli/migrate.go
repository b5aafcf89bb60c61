package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"path"
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
  down     revert the last applied migration. Reverting the first one DROPS
           processed_messages: every remembered ID is forgotten, and messages
           redelivered afterwards are processed again.
  status   list the migrations, applied or pending; changes nothing
  sql      print the migration SQL, for teams that apply migrations with their
           own tool; needs no database. With --down, the reverting SQL.

Flags:
  --database-url URL   the database (default: $DATABASE_URL); choose the schema
                       with ?options=-csearch_path%3Dname
  --down               with sql: print the down migrations, newest first

Examples:
  pgdedup migrate up --database-url 'postgres://app@db:5432/app?sslmode=require'
  DATABASE_URL='postgres://app@db/app?options=-csearch_path%3Dops' pgdedup migrate status
  pgdedup migrate sql | psql "$DATABASE_URL"
`

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("migrate", migrateHelp, stdout, stderr)
	fs := c.flags(false)
	down := fs.Bool("down", false, "")
	rest, code, ok := c.parse(fs, args)
	switch {
	case !ok:
		return code
	case len(rest) == 0:
		return c.usageError("missing action: up, down, status or sql")
	case len(rest) > 1:
		return c.usageError("unexpected argument %q", rest[1])
	}
	action := rest[0]
	switch action {
	case "sql":
		return c.migrationSQL(*down)
	case "up", "down", "status":
	default:
		return c.usageError("unknown action %q: want up, down, status or sql", action)
	}
	if *down {
		return c.usageError("--down only goes with sql; to revert, run 'pgdedup migrate down'")
	}

	db, code := c.openDB(ctx)
	if db == nil {
		return code
	}
	defer db.Close()
	p, err := pgdedup.NewMigrationProvider(db)
	if err != nil {
		return c.fail(err)
	}
	switch action {
	case "up":
		return c.up(ctx, p)
	case "down":
		return c.down(ctx, p)
	default:
		return c.status(ctx, db, p)
	}
}

func (c *command) up(ctx context.Context, p *goose.Provider) int {
	results, err := p.Up(ctx)
	for _, r := range results {
		if r.Error == nil {
			fmt.Fprintf(c.stdout, "applied %s in %s\n", path.Base(r.Source.Path), r.Duration.Round(time.Millisecond))
		}
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P07" { // duplicate_table
			err = fmt.Errorf("%w\n(the table exists but %s does not record it: was it created by `pgdedup migrate sql` or by hand? "+
				"Then keep applying migrations that way, or drop the table)", err, pgdedup.VersionTable)
		}
		return c.fail(fmt.Errorf("migrate up: %w", err))
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return c.fail(fmt.Errorf("read version: %w", err))
	}
	if len(results) == 0 {
		fmt.Fprintf(c.stdout, "already up to date at version %d\n", v)
	} else {
		fmt.Fprintf(c.stdout, "now at version %d\n", v)
	}
	return exitOK
}

func (c *command) down(ctx context.Context, p *goose.Provider) int {
	r, err := p.Down(ctx)
	if errors.Is(err, goose.ErrNoNextVersion) {
		fmt.Fprintln(c.stdout, "nothing to revert: no pgdedup migration is applied")
		return exitOK
	}
	if err != nil {
		return c.fail(fmt.Errorf("migrate down: %w", err))
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return c.fail(fmt.Errorf("read version: %w", err))
	}
	fmt.Fprintf(c.stdout, "reverted %s in %s; now at version %d\n", path.Base(r.Source.Path), r.Duration.Round(time.Millisecond), v)
	return exitOK
}

// status lists the migrations. Unlike goose's Status, it creates nothing:
// without a version table every migration is simply pending.
func (c *command) status(ctx context.Context, db *sql.DB, p *goose.Provider) int {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1::text) IS NOT NULL`, pgdedup.VersionTable).Scan(&exists); err != nil {
		return c.fail(fmt.Errorf("look up %s: %w", pgdedup.VersionTable, err))
	}
	var statuses []*goose.MigrationStatus
	if exists {
		var err error
		if statuses, err = p.Status(ctx); err != nil {
			return c.fail(fmt.Errorf("migrate status: %w", err))
		}
	} else {
		for _, s := range p.ListSources() {
			statuses = append(statuses, &goose.MigrationStatus{Source: s, State: goose.StatePending})
		}
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tMIGRATION\tSTATE\tAPPLIED AT")
	pending := 0
	for _, s := range statuses {
		applied := "-"
		if s.State == goose.StateApplied {
			applied = s.AppliedAt.UTC().Format(time.RFC3339)
		} else {
			pending++
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Source.Version, path.Base(s.Source.Path), s.State, applied)
	}
	tw.Flush()
	if pending > 0 {
		fmt.Fprintf(c.stdout, "%d pending: run `pgdedup migrate up`\n", pending)
	} else {
		fmt.Fprintln(c.stdout, "up to date")
	}
	return exitOK
}
