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
           own tool; needs no database. With --down, the reverting SQL. With
           --goose-dir, write goose files into your goose directory instead.

Choose the schema with the URL: ?options=-csearch_path%3Dname.

Flags:
{{flags}}
Examples:
  pgdedup migrate up --database-url 'postgres://app@db:5432/app?sslmode=require'
  DATABASE_URL='postgres://app@db/app?options=-csearch_path%3Dops' pgdedup migrate status
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
	p, err := pgdedup.NewMigrationProvider(db)
	if err != nil {
		return c.fail(err)
	}
	if action != "down" {
		if owner, err := c.otherOwner(ctx, db); err != nil || owner != "" {
			if err != nil {
				return c.fail(err)
			}
			if action == "status" {
				fmt.Fprintln(c.stdout, owner)
				return exitOK
			}
			return c.fail(fmt.Errorf("%w: %s", pgdedup.ErrMigratedByAnotherTool, owner))
		}
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

// otherOwner says which tool applies pgdedup's migrations on db when it is not
// pgdedup: processed_messages exists in the schema the migrations use, and
// pgdedup's version table does not.
func (c *command) otherOwner(ctx context.Context, db *sql.DB) (string, error) {
	var table, versions bool
	err := db.QueryRowContext(ctx, `SELECT to_regclass(format('%I.%I', current_schema(), 'processed_messages')) IS NOT NULL,
		to_regclass(format('%I.%I', current_schema(), $1::text)) IS NOT NULL`, pgdedup.VersionTable).Scan(&table, &versions)
	if err != nil || !table || versions {
		return "", err
	}
	return fmt.Sprintf("processed_messages exists but %s does not record it: another tool applies pgdedup's migrations here, "+
		"your goose if it applied the files of 'pgdedup migrate sql --goose-dir' (ask it: goose status). Keep using it, "+
		"and export new pgdedup migrations to it with 'pgdedup migrate sql --goose-dir DIR'", pgdedup.VersionTable), nil
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
			err = fmt.Errorf("%w\n(the table exists but %s does not record it: was it created by your goose "+
				"(files from `pgdedup migrate sql --goose-dir`), by `pgdedup migrate sql` or by hand? "+
				"Then keep applying pgdedup's migrations that way, and do not run 'pgdedup migrate up' on this database)", err, pgdedup.VersionTable)
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
