package cli

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/pgdedup/pgdedup"
)

// loss is what reverting a migration destroys in one table: the whole table,
// or some of its columns.
type loss struct {
	table   string   // as the migration writes it, resolved on the search_path
	columns []string // nil: the table itself is dropped
	rows    int64    // rows of the table, or rows with a value in one of the columns
	absent  bool     // the table (or each column) is not there: nothing to lose
}

func (l loss) String() string {
	switch {
	case l.columns == nil && l.absent:
		return fmt.Sprintf("table %s: not there", l.table)
	case l.columns == nil:
		return fmt.Sprintf("table %s: %d rows", l.table, l.rows)
	case l.absent:
		return fmt.Sprintf("columns %s of %s: not there", strings.Join(l.columns, ", "), l.table)
	}
	return fmt.Sprintf("columns %s of %s: %d rows hold a value in them", strings.Join(l.columns, ", "), l.table, l.rows)
}

// down reverts the newest applied migration, once it has said what that
// drops and how much data is there, and only with confirm; when the data is
// not empty, only with discard too. Everything before the revert only reads.
func (c *command) down(ctx context.Context, db *sql.DB, p *goose.Provider, confirm, discard bool) int {
	versions, err := applied(ctx, db)
	if err != nil {
		return c.fail(err)
	}
	// goose reverts the migration applied last, which is the newest version
	// unless they were applied out of order.
	var current int64
	if len(versions) > 0 {
		err := db.QueryRowContext(ctx, `SELECT version_id FROM `+pgdedup.VersionTable+` ORDER BY id DESC LIMIT 1`).Scan(&current)
		if err != nil {
			return c.fail(fmt.Errorf("read %s: %w", pgdedup.VersionTable, err))
		}
	}
	if current == 0 {
		fmt.Fprintln(c.stdout, "nothing to revert: no pgdedup migration is applied")
		return exitOK
	}
	var source *goose.Source
	for _, s := range p.ListSources() {
		if s.Version == current {
			source = s
		}
	}
	if source == nil {
		return c.fail(fmt.Errorf("version %d is applied, and this pgdedup does not know it: "+
			"revert it with the pgdedup release that applied it", current))
	}
	name := path.Base(source.Path)
	src, err := fs.ReadFile(pgdedup.Migrations(), name)
	if err != nil {
		return c.fail(err)
	}
	drops, err := downLosses(string(src))
	if err != nil {
		return c.fail(fmt.Errorf("%s: %w", name, err))
	}
	data := false
	for i := range drops {
		if err := count(ctx, db, &drops[i]); err != nil {
			return c.fail(err)
		}
		data = data || drops[i].rows > 0
	}
	delete(versions, current)
	prev := newest(versions)
	fmt.Fprintf(c.stdout, "migrate down reverts %s (version %d; afterwards at version %d).\n", name, current, prev)
	if len(drops) == 0 {
		fmt.Fprintln(c.stdout, "It drops no table and no column.")
	} else {
		fmt.Fprintln(c.stdout, "It drops:")
		for _, l := range drops {
			fmt.Fprintf(c.stdout, "  %s\n", l)
		}
	}
	switch {
	case !confirm:
		return c.fail(fmt.Errorf("nothing was changed: run it again with --confirm to revert %s", name))
	case data && !discard:
		return c.fail(fmt.Errorf("refused: the data above would be lost, and nothing was changed. Export it first if you " +
			"need it; to revert anyway, run it again with --confirm --discard-data"))
	}

	// The counts were read just before: a consumer writing meanwhile adds
	// rows that the revert drops too. Stop consumers before reverting.
	c.waitNotice(ctx, db)
	r, err := p.Down(ctx)
	if err != nil {
		return c.fail(fmt.Errorf("migrate down: %w", err))
	}
	if r.Source.Version != current {
		return c.fail(fmt.Errorf("reverted %s, not %s: another process migrated meanwhile; check with 'pgdedup migrate status'",
			path.Base(r.Source.Path), name))
	}
	after, err := applied(ctx, db)
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(c.stdout, "reverted %s in %s; now at version %d\n", name, r.Duration.Round(time.Millisecond), newest(after))
	return exitOK
}

// count fills in how much data l holds, reading on the search_path as the
// migration would resolve its names.
func count(ctx context.Context, db *sql.DB, l *loss) error {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1::text) IS NOT NULL`, l.table).Scan(&exists); err != nil {
		return fmt.Errorf("look up %s: %w", l.table, err)
	}
	if !exists {
		l.absent = true
		return nil
	}
	table := pgx.Identifier(strings.Split(l.table, ".")).Sanitize()
	if l.columns == nil {
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&l.rows); err != nil {
			return fmt.Errorf("count the rows of %s: %w", l.table, err)
		}
		return nil
	}
	rows, err := db.QueryContext(ctx, `SELECT attname FROM pg_catalog.pg_attribute
WHERE attrelid = to_regclass($1::text) AND attnum > 0 AND NOT attisdropped AND attname = ANY($2::text[])`, l.table, l.columns)
	if err != nil {
		return fmt.Errorf("look up the columns of %s: %w", l.table, err)
	}
	var present []string
	for rows.Next() {
		var col string
		if err := rows.Scan(&col); err != nil {
			rows.Close()
			return fmt.Errorf("look up the columns of %s: %w", l.table, err)
		}
		present = append(present, pgx.Identifier{col}.Sanitize()+" IS NOT NULL")
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("look up the columns of %s: %w", l.table, err)
	}
	if len(present) == 0 {
		l.absent = true
		return nil
	}
	err = db.QueryRowContext(ctx, `SELECT count(*) FROM `+table+` WHERE `+strings.Join(present, " OR ")).Scan(&l.rows)
	if err != nil {
		return fmt.Errorf("count the values in %s: %w", l.table, err)
	}
	return nil
}

var (
	ident       = `[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)?`
	dropTable   = regexp.MustCompile(`(?i)^DROP TABLE (?:IF EXISTS )?(` + ident + `(?:, ?` + ident + `)*)(?: CASCADE| RESTRICT)?;$`)
	alterTable  = regexp.MustCompile(`(?i)^ALTER TABLE (?:IF EXISTS )?(?:ONLY )?(` + ident + `) (.*);$`)
	dropColumn  = regexp.MustCompile(`(?i)^DROP (?:COLUMN )?(?:IF EXISTS )?([A-Za-z_][A-Za-z0-9_$]*)(?: CASCADE| RESTRICT)?$`)
	destroysAny = regexp.MustCompile(`(?i)\b(DROP\s+TABLE|DROP\s+COLUMN|DROP\s+SCHEMA|TRUNCATE|DELETE\s+FROM)\b`)
)

// downLosses reads the Down section of a goose migration and returns the
// tables and columns its statements drop. It reads the statements goose runs
// one by one; a StatementBegin block (a DO block, a function body) is taken
// as dropping no data, which a test checks for each of pgdedup's migrations.
// A statement it cannot read that looks destructive is an error, so that a
// new migration cannot slip past the guard.
func downLosses(src string) ([]loss, error) {
	var losses []loss
	part, inBlock := "", false
	var stmt strings.Builder
	for line := range strings.Lines(src) {
		if annotation, ok := gooseAnnotation(line, &part); ok {
			switch annotation {
			case "STATEMENTBEGIN":
				inBlock = true
			case "STATEMENTEND":
				inBlock = false
			}
			continue
		}
		trimmed := strings.TrimSpace(line)
		if part != "down" || inBlock || strings.HasPrefix(trimmed, "--") || trimmed == "" {
			continue
		}
		if i := strings.Index(trimmed, " --"); i >= 0 {
			trimmed = strings.TrimSpace(trimmed[:i])
		}
		stmt.WriteString(trimmed + " ")
		if !strings.HasSuffix(trimmed, ";") {
			continue
		}
		s := strings.Join(strings.Fields(stmt.String()), " ")
		stmt.Reset()
		if m := dropTable.FindStringSubmatch(s); m != nil {
			for _, t := range strings.Split(m[1], ",") {
				losses = append(losses, loss{table: strings.TrimSpace(t)})
			}
			continue
		}
		if m := alterTable.FindStringSubmatch(s); m != nil {
			var cols []string
			for _, action := range strings.Split(m[2], ",") {
				action = strings.TrimSpace(action)
				if c := dropColumn.FindStringSubmatch(action); c != nil && !strings.HasPrefix(strings.ToUpper(action), "DROP CONSTRAINT") {
					cols = append(cols, c[1])
				} else if destroysAny.MatchString(action) {
					return nil, fmt.Errorf("cannot tell what %q drops", s)
				}
			}
			if cols != nil {
				losses = append(losses, loss{table: m[1], columns: cols})
			}
			continue
		}
		if destroysAny.MatchString(s) {
			return nil, fmt.Errorf("cannot tell what %q drops", s)
		}
	}
	return losses, nil
}
