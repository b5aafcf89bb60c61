package cli

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgdedup/pgdedup"
)

// Exit codes, as documented on Main.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

const defaultConnectTimeout = 10 * time.Second

// command is one run of a subcommand. It holds where it writes, and what it
// must never write (the passwords of the database URL).
type command struct {
	name           string // "cleanup", "migrate", …
	help           string // printed by --help and after a usage error
	stdout, stderr io.Writer
	redactor
	databaseURL string
	table       string
}

func newCommand(name, help string, stdout, stderr io.Writer) *command {
	return &command{name: name, help: help, stdout: stdout, stderr: stderr}
}

// flags returns the subcommand's flag set with --database-url, and --table
// when withTable is set. Each flag's usage text is what --help shows for it
// (see flagHelp). A word in backquotes names its value.
func (c *command) flags(withTable bool) *flag.FlagSet {
	fs := flag.NewFlagSet("pgdedup "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors, in the CLI's words
	fs.Usage = func() {}
	fs.StringVar(&c.databaseURL, "database-url", "", "the database's `URL` (default: $DATABASE_URL, which is better: "+
		"a command line is visible to every user of the machine in ps)")
	if withTable {
		fs.StringVar(&c.table, "table", pgdedup.DefaultTable, "the dedup table's `NAME`, optionally schema.table")
	}
	return fs
}

// flagsMarker stands in a command's help for the list of its flags.
const flagsMarker = "{{flags}}"

// flagHelp lists fs's flags as --help shows them, generated from their
// definitions so that help and flags cannot drift apart. It puts one flag on a
// line, its text wrapped at 80 columns.
func flagHelp(fs *flag.FlagSet) string {
	type row struct{ arg, usage string }
	var rows []row
	width := 0
	fs.VisitAll(func(f *flag.Flag) {
		value, usage := flag.UnquoteUsage(f)
		arg := "--" + f.Name
		if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); !isBool {
			arg += " " + strings.ToUpper(value)
		}
		switch f.DefValue {
		case "", "0", "0s", "false":
		default:
			usage += " (default: " + f.DefValue + ")"
		}
		rows = append(rows, row{arg, usage})
		width = max(width, len(arg))
	})
	var b strings.Builder
	indent := strings.Repeat(" ", 2+width+3)
	for _, r := range rows {
		line := fmt.Sprintf("  %-*s   ", width, r.arg)
		for i, word := range strings.Fields(r.usage) {
			if i > 0 && len(line)+1+len(word) > 80 {
				b.WriteString(line + "\n")
				line = indent
			} else if i > 0 {
				line += " "
			}
			line += word
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// parse parses args, allowing flags before and after the positional arguments
// ("migrate up --database-url …"), and returns the positional ones. When it
// returns ok false, the caller exits with code, which is 0 after --help and 2
// after a usage error, both already reported.
func (c *command) parse(fs *flag.FlagSet, args []string) (positional []string, code int, ok bool) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(c.stdout, strings.Replace(c.help, flagsMarker, flagHelp(fs), 1))
				return nil, exitOK, false
			}
			return nil, c.usageError("%s", flagError(fs, err)), false
		}
		if fs.NArg() == 0 {
			return positional, 0, true
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// parseArgs is parse for a command that takes exactly n positional
// arguments (0 or 1). Fewer is the usage error missing, and more is an
// unexpected argument.
func (c *command) parseArgs(fs *flag.FlagSet, args []string, n int, missing string) (positional []string, code int, ok bool) {
	positional, code, ok = c.parse(fs, args)
	switch {
	case !ok:
		return nil, code, false
	case len(positional) < n:
		return nil, c.usageError("%s", missing), false
	case len(positional) > n:
		return nil, c.usageError("unexpected argument %q", positional[n]), false
	}
	return positional, 0, true
}

// fail reports err, without any password, and returns the failure exit code.
// The library's "pgdedup: " prefixes are dropped, because the line starts
// with the command's name already.
func (c *command) fail(err error) int {
	msg := strings.ReplaceAll(err.Error(), "pgdedup: ", "")
	fmt.Fprintf(c.stderr, "pgdedup %s: %s\n", c.name, c.redact(msg))
	return exitFail
}

// usageError reports a bad invocation and returns the usage exit code.
func (c *command) usageError(format string, args ...any) int {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(c.stderr, "pgdedup %s: %s\nRun 'pgdedup %s --help' for usage.\n", c.name, c.redact(msg), c.name)
	return exitUsage
}

// connConfig parses the database URL from --database-url or DATABASE_URL.
// Unless the URL chooses a query mode, statements are not cached on the server
// (default_query_exec_mode=exec). The CLI runs a handful of them, and so works
// behind PgBouncer in transaction pooling mode as it is.
func (c *command) connConfig() (*pgx.ConnConfig, int, error) {
	raw := c.databaseURL
	if raw == "" {
		raw = os.Getenv("DATABASE_URL")
	}
	if raw == "" {
		return nil, exitUsage, errors.New("no database: pass --database-url or set DATABASE_URL")
	}
	c.addURL(raw)
	cfg, err := pgx.ParseConfig(raw)
	if err != nil {
		return nil, exitUsage, fmt.Errorf("invalid database URL: %w", err)
	}
	c.add(cfg.Password)
	if !strings.Contains(raw, "default_query_exec_mode") {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = defaultConnectTimeout
	}
	return cfg, exitOK, nil
}

// connect opens one connection. On failure it has reported why and returns
// the exit code.
func (c *command) connect(ctx context.Context) (*pgx.Conn, int) {
	cfg, code, err := c.connConfig()
	if err != nil {
		return nil, c.exit(code, err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, c.fail(fmt.Errorf("cannot connect to %s: %w", describe(cfg), err))
	}
	return conn, exitOK
}

// openDB is connect for database/sql, which goose needs.
func (c *command) openDB(ctx context.Context) (*sql.DB, int) {
	cfg, code, err := c.connConfig()
	if err != nil {
		return nil, c.exit(code, err)
	}
	db := stdlib.OpenDB(*cfg)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, c.fail(fmt.Errorf("cannot connect to %s: %w", describe(cfg), err))
	}
	return db, exitOK
}

func (c *command) exit(code int, err error) int {
	if code == exitUsage {
		return c.usageError("%s", err)
	}
	return c.fail(err)
}

// describe names the database without the password.
func describe(cfg *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// openStore checks the flags without touching the database, connects, and
// returns a Store on the connection for the --table flag, with batch rows per
// Cleanup transaction (0 for the default), once it has checked that the table
// exists. The CLI only cleans up and reads, for every consumer, so the
// consumer name is a placeholder. On failure it has reported why and returns
// a nil Store and the exit code. Otherwise the caller closes conn.
func (c *command) openStore(ctx context.Context, cfg pgdedup.Config) (*pgdedup.Store, *pgx.Conn, int) {
	cfg.Consumer = cmp.Or(cfg.Consumer, "pgdedup-cli")
	cfg.Table = c.table
	if err := cfg.Validate(); err != nil {
		var ce *pgdedup.ConfigError
		if errors.As(err, &ce) && (ce.Field == "Table" || ce.Field == "Consumer") {
			return nil, nil, c.usageError("--%s %s", strings.ToLower(ce.Field), ce.Reason)
		}
		return nil, nil, c.usageError("%s", err)
	}
	conn, code := c.connect(ctx)
	if conn == nil {
		return nil, nil, code
	}
	store, err := pgdedup.New(conn, cfg)
	if err == nil {
		err = c.checkTable(ctx, conn, store)
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil, c.fail(err)
	}
	return store, conn, exitOK
}

// checkTable turns a missing table into an error that says what to do.
func (c *command) checkTable(ctx context.Context, conn *pgx.Conn, s *pgdedup.Store) error {
	var exists bool
	var searchPath string
	err := conn.QueryRow(ctx, `SELECT to_regclass($1::text) IS NOT NULL, current_setting('search_path')`, s.Table()).
		Scan(&exists, &searchPath)
	if err != nil {
		return fmt.Errorf("look up table %s: %w", c.table, err)
	}
	if !exists {
		return fmt.Errorf("table %s not found (search_path: %s): run `pgdedup migrate up`, or pass --table if it has another name", c.table, searchPath)
	}
	return nil
}
