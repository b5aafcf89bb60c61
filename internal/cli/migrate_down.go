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

// loss is what reverting a migration destroys in one table, either the whole
// table or some of its columns.
type loss struct {
	table   string   // as the migration writes it, resolved on the search_path
	columns []string // nil when the table itself is dropped
	rows    int64    // rows of the table, or rows with a value in one of the columns
	absent  bool     // the table (or each column) is not there, so nothing is lost
	derived string   // how the columns' values are computed from others, so nothing is lost
}

func (l loss) String() string {
	switch {
	case l.columns == nil && l.absent:
		return fmt.Sprintf("table %s: not there", l.table)
	case l.columns == nil:
		return fmt.Sprintf("table %s: %d rows", l.table, l.rows)
	case l.absent:
		return fmt.Sprintf("columns %s of %s: not there", strings.Join(l.columns, ", "), l.table)
	case l.derived != "":
		return fmt.Sprintf("columns %s of %s: %s, nothing is lost", strings.Join(l.columns, ", "), l.table, l.derived)
	}
	return fmt.Sprintf("columns %s of %s: %d rows hold a value in them", strings.Join(l.columns, ", "), l.table, l.rows)
}

// down reverts the newest applied migration, once it has said what that
// drops and how much data is there, and only with confirm. When the data is
// not empty, it also needs discard. Everything before the revert only reads.
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
	drops, others, err := downDrops(string(src))
	if err != nil {
		return c.fail(fmt.Errorf("%s: %w", name, err))
	}
	data := false
	for i := range drops {
		if err := count(ctx, db, &drops[i]); err != nil {
			return c.fail(err)
		}
		data = data || (drops[i].rows > 0 && drops[i].derived == "")
	}
	delete(versions, current)
	prev := newest(versions)
	fmt.Fprintf(c.stdout, "migrate down reverts %s (version %d; afterwards at version %d).\n", name, current, prev)
	if len(drops)+len(others) == 0 {
		fmt.Fprintln(c.stdout, "It drops nothing.")
	} else {
		fmt.Fprintln(c.stdout, "It drops:")
		for _, l := range drops {
			fmt.Fprintf(c.stdout, "  %s\n", l)
		}
		for _, d := range others {
			fmt.Fprintf(c.stdout, "  %s\n", d)
		}
	}
	if what, ok := neededBy[current]; ok {
		fmt.Fprintf(c.stdout, "Afterwards this pgdedup fails where it needs version %d: %s. "+
			"Deploy a release for version %d first, or migrate up again.\n", current, what, prev)
	}
	switch {
	case !confirm:
		return c.fail(fmt.Errorf("nothing was changed: run it again with --confirm to revert %s", name))
	case data && !discard:
		return c.fail(fmt.Errorf("refused: the data above would be lost, and nothing was changed. Export it first if you " +
			"need it; to revert anyway, run it again with --confirm --discard-data"))
	}

	// The counts were read just before, so a consumer writing meanwhile adds
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

// dropped is an object a Down section drops that holds no data of its own,
// such as an index, a function, a trigger or a constraint.
type dropped struct {
	kind     string // "index", "function", "trigger", "constraint"
	name     string // a function's with its argument types
	table    string // a trigger's or constraint's table
	replaced bool   // a constraint added again by the same statement
}

func (d dropped) String() string {
	switch {
	case d.replaced:
		return fmt.Sprintf("%s %s of %s, added again (redefined)", d.kind, d.name, d.table)
	case d.table != "":
		return fmt.Sprintf("%s %s of %s", d.kind, d.name, d.table)
	}
	return d.kind + " " + d.name
}

// derivedColumns are the columns whose values pgdedup computes from others.
// Dropping them loses nothing, so they do not need --discard-data.
var derivedColumns = map[string]string{
	"processed_messages.key": "computed from consumer and message_id",
}

// neededBy says what this pgdedup cannot do once a migration is reverted.
var neededBy = map[int64]string{
	3: "every claim, Lookup and Forget (`pgdedup lookup`, `pgdedup forget`) use key",
	4: "offset claims use processed_offsets",
	6: "fingerprints and stored results (ProcessResult, the HTTP middleware) use its columns",
}

var (
	ident      = `[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)?`
	identList  = ident + `(?:, ?` + ident + `)*`
	dropTable  = regexp.MustCompile(`(?i)\bDROP TABLE (?:IF EXISTS )?(` + identList + `)(?: CASCADE| RESTRICT)?\s*$`)
	dropIndex  = regexp.MustCompile(`(?i)\bDROP INDEX (?:CONCURRENTLY )?(?:IF EXISTS )?(` + identList + `)(?: CASCADE| RESTRICT)?\s*$`)
	dropFunc   = regexp.MustCompile(`(?i)\bDROP FUNCTION (?:IF EXISTS )?(` + ident + `) ?\(([^()]*)\)(?: CASCADE| RESTRICT)?\s*$`)
	dropTrig   = regexp.MustCompile(`(?i)\bDROP TRIGGER (?:IF EXISTS )?(` + ident + `) ON (` + ident + `)(?: CASCADE| RESTRICT)?\s*$`)
	createIdx  = regexp.MustCompile(`(?i)\bCREATE (?:UNIQUE )?INDEX (?:CONCURRENTLY )?(?:IF NOT EXISTS )?(` + ident + `) ON\b`)
	alterTable = regexp.MustCompile(`(?i)\bALTER TABLE (?:IF EXISTS )?(?:ONLY )?(` + ident + `) (.*)$`)
	dropColumn = regexp.MustCompile(`(?i)^DROP (?:COLUMN )?(?:IF EXISTS )?([A-Za-z_][A-Za-z0-9_$]*)(?: CASCADE| RESTRICT)?$`)
	dropConstr = regexp.MustCompile(`(?i)^DROP CONSTRAINT (?:IF EXISTS )?([A-Za-z_][A-Za-z0-9_$]*)(?: CASCADE| RESTRICT)?$`)
	addConstr  = regexp.MustCompile(`(?i)^ADD CONSTRAINT ([A-Za-z_][A-Za-z0-9_$]*) `)
	destroys   = regexp.MustCompile(`(?i)\b(DROP|TRUNCATE|DELETE\s+FROM)\b`)
)

// downDrops reads the Down section of a goose migration and returns what its
// statements drop. Those are the tables and columns (losses, whose data the
// guard counts), and the indexes, functions, triggers and constraints. It
// reads every statement of the section, those in a StatementBegin block (a DO
// block) too, whether a condition guards them or not, because the summary
// says what the revert may drop. An index the section creates itself and
// drops again is left out. A statement it cannot read that drops or deletes
// anything is an error, so that a new migration cannot slip past the summary.
// A test runs each of pgdedup's Down sections on a database and compares the
// schema before and after with what this returns.
func downDrops(src string) (losses []loss, others []dropped, err error) {
	part := ""
	var body strings.Builder
	for line := range strings.Lines(src) {
		if _, ok := gooseAnnotation(line, &part); ok || part != "down" {
			continue
		}
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		body.WriteString(line + " ")
	}
	created := map[string]bool{}
	for _, m := range createIdx.FindAllStringSubmatch(body.String(), -1) {
		created[m[1]] = true
	}
	// Every statement, those inside a DO block too, ends with a semicolon.
	// What precedes one inside a block (IF … THEN) is ignored by the
	// patterns, which match up to the semicolon.
	for _, st := range strings.Split(body.String(), ";") {
		s := strings.Join(strings.Fields(st), " ")
		rest := s
		switch {
		case dropTable.MatchString(s):
			for _, t := range strings.Split(dropTable.FindStringSubmatch(s)[1], ",") {
				losses = append(losses, loss{table: strings.TrimSpace(t)})
			}
			rest = dropTable.ReplaceAllString(s, "")
		case dropIndex.MatchString(s):
			for _, i := range strings.Split(dropIndex.FindStringSubmatch(s)[1], ",") {
				if i = strings.TrimSpace(i); !created[i] {
					others = append(others, dropped{kind: "index", name: i})
				}
			}
			rest = dropIndex.ReplaceAllString(s, "")
		case dropFunc.MatchString(s):
			f := dropFunc.FindStringSubmatch(s)
			args := strings.Join(strings.Fields(strings.ReplaceAll(f[2], ",", ", ")), " ")
			others = append(others, dropped{kind: "function", name: f[1] + "(" + args + ")"})
			rest = dropFunc.ReplaceAllString(s, "")
		case dropTrig.MatchString(s):
			f := dropTrig.FindStringSubmatch(s)
			others = append(others, dropped{kind: "trigger", name: f[1], table: f[2]})
			rest = dropTrig.ReplaceAllString(s, "")
		case alterTable.MatchString(s):
			f := alterTable.FindStringSubmatch(s)
			l, o, err := alterDrops(f[1], f[2])
			if err != nil {
				return nil, nil, fmt.Errorf("cannot tell what %q drops: %w", s, err)
			}
			losses, others = append(losses, l...), append(others, o...)
			rest = alterTable.ReplaceAllString(s, "")
		}
		if destroys.MatchString(rest) {
			return nil, nil, fmt.Errorf("cannot tell what %q drops", s)
		}
	}
	return losses, others, nil
}

// alterDrops returns what the actions of one ALTER TABLE on table drop.
func alterDrops(table, actions string) ([]loss, []dropped, error) {
	var cols []string
	var others []dropped
	added := map[string]bool{}
	for _, action := range splitTop(actions) {
		if m := addConstr.FindStringSubmatch(action); m != nil {
			added[m[1]] = true
		}
	}
	for _, action := range splitTop(actions) {
		switch {
		case dropConstr.MatchString(action):
			c := dropConstr.FindStringSubmatch(action)[1]
			others = append(others, dropped{kind: "constraint", name: c, table: table, replaced: added[c]})
		case dropColumn.MatchString(action):
			cols = append(cols, dropColumn.FindStringSubmatch(action)[1])
		case strings.HasPrefix(strings.ToUpper(action), "ALTER "):
			// ALTER COLUMN … DROP DEFAULT or NOT NULL drops no data.
		case destroys.MatchString(action):
			return nil, nil, fmt.Errorf("action %q", action)
		}
	}
	if cols == nil {
		return nil, others, nil
	}
	l := loss{table: table, columns: cols}
	if len(cols) == 1 {
		l.derived = derivedColumns[table+"."+cols[0]]
	}
	return []loss{l}, others, nil
}

// splitTop splits s at the commas outside parentheses.
func splitTop(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(parts, strings.TrimSpace(s[start:]))
}
