package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/citusdist"
)

const citusHelp = `Usage: pgdedup citus distribute [--by message_id|key] [--colocate TABLE:COLUMN]... [flags]

Distributes the dedup table over a Citus cluster (run it against the
coordinator, after "pgdedup migrate up" and before consumers start), and
optionally business tables co-located with it, in one transaction:

  SELECT create_distributed_table('processed_messages', 'message_id');
  SELECT create_distributed_table('charges', 'message_id', colocate_with => 'processed_messages');

By message_id, the primary key (key) first becomes (message_id, key), since
Citus wants the distribution column in the primary key, and the trigger that
fills key for writers older than migration 00003 is kept, on every shard. By
key, that trigger is dropped: every writer must pass the key (Stores do).

A business table co-located with the dedup table keeps a message's claim and its
business rows on one shard: the transaction is routed to one worker and
commits there, without two-phase commit. Rows already in the tables are moved
into the shards. Running it again on a table already distributed by the same
column does nothing. See docs/citus.md.

Flags:
{{flags}}
Examples:
  DATABASE_URL='postgres://app@coordinator:5432/app?sslmode=verify-full' pgdedup citus distribute
  pgdedup citus distribute --colocate charges:message_id --colocate ledger:message_id
  pgdedup citus distribute --sql > 00010_distribute.sql   # for your own migration tool
`

var plainIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}(\.[A-Za-z_][A-Za-z0-9_$]{0,62})?$`)

func runCitus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("citus", citusHelp, stdout, stderr)
	fs := c.flags(true)
	var colocate []string
	fs.Func("colocate", "also distribute the business `TABLE:COLUMN` by COLUMN (which holds the message ID), co-located with the dedup table; repeatable",
		func(v string) error { colocate = append(colocate, v); return nil })
	by := fs.String("by", "message_id", "the dedup table's distribution `COLUMN`: message_id (business rows keyed by the message ID co-locate) or key (business rows storing pgdedup.Key co-locate)")
	shards := fs.Int("shard-count", 0, "`N` shards per table (default: citus.shard_count, 32)")
	printSQL := fs.Bool("sql", false, "print the statements instead of running them")
	rest, code, ok := c.parseArgs(fs, args, 1, "missing subcommand: distribute")
	switch {
	case !ok:
		return code
	case rest[0] != "distribute":
		return c.usageError("unknown subcommand %q (want distribute)", rest[0])
	case *shards < 0 || *shards > 64000:
		return c.usageError("--shard-count must be between 1 and 64000, got %d", *shards)
	}
	if err := (pgdedup.Config{Consumer: "pgdedup-cli", Table: c.table}).Validate(); err != nil {
		return c.usageError("%s", err)
	}
	dedup := citusdist.QuoteName(c.table)
	type table struct {
		name, column string
		stmts        []string
	}
	dedupStmts, err := citusdist.Dedup(dedup, *by, *shards, "")
	if err != nil {
		return c.usageError("--by: %s", err)
	}
	tables := []table{{dedup, *by, dedupStmts}}
	for _, tc := range colocate {
		name, column, found := strings.Cut(tc, ":")
		if !found || !plainIdent.MatchString(name) || !plainIdent.MatchString(column) || strings.Contains(column, ".") {
			return c.usageError("--colocate %q: want TABLE:COLUMN (plain identifiers, TABLE optionally schema-qualified)", tc)
		}
		col := citusdist.Colocated{Table: citusdist.QuoteName(name), Column: column}
		tables = append(tables, table{col.Table, column, []string{citusdist.Colocate(dedup, col)}})
	}
	if *printSQL {
		for _, tb := range tables {
			fmt.Fprintln(stdout, strings.Join(tb.stmts, "\n"))
		}
		return exitOK
	}

	store, conn, code := c.openStore(ctx, pgdedup.Config{})
	if store == nil {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var citus bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return c.fail(err)
	}
	if !citus {
		return c.fail(fmt.Errorf("the citus extension is not installed in this database: connect to a Citus coordinator"))
	}
	var done []string
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, tb := range tables {
			var current *string
			err := tx.QueryRow(ctx, `SELECT column_to_column_name(logicalrelid, partkey) FROM pg_dist_partition
WHERE logicalrelid = to_regclass($1)`, tb.name).Scan(&current)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return fmt.Errorf("look up %s: %w", tb.name, err)
			case current != nil && *current == tb.column:
				fmt.Fprintf(stdout, "%s is already distributed by %s\n", tb.name, tb.column)
				continue
			default:
				col := "nothing (a reference or local table)"
				if current != nil {
					col = *current
				}
				return fmt.Errorf("%s is already distributed by %s, not %s: undistribute_table it first", tb.name, col, tb.column)
			}
			for _, q := range tb.stmts {
				if _, err := tx.Exec(ctx, q); err != nil {
					return fmt.Errorf("%s: %w", strings.TrimSuffix(q, ";"), withDetail(err))
				}
			}
			// Rows that were in the table were copied into the shards. The
			// coordinator's copies are now invisible dead weight.
			if _, err := tx.Exec(ctx, `SELECT truncate_local_data_after_distributing_table($1)`, tb.name); err != nil {
				return fmt.Errorf("truncate the local copy of %s: %w", tb.name, err)
			}
			done = append(done, fmt.Sprintf("%s by %s", tb.name, tb.column))
		}
		return nil
	})
	if err != nil {
		return c.fail(err)
	}
	var shardCount, workers int
	err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = to_regclass($1)),
(SELECT count(*) FROM pg_dist_node WHERE isactive AND shouldhaveshards AND noderole = 'primary')`, store.Table()).Scan(&shardCount, &workers)
	if err != nil {
		return c.fail(err)
	}
	if len(done) > 0 {
		fmt.Fprintf(stdout, "distributed %s (%d shards per table, on %d nodes)\n", strings.Join(done, ", "), shardCount, workers)
	}
	return exitOK
}

// withDetail adds a server error's DETAIL, which says why Citus refused.
func withDetail(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Detail != "" {
		return fmt.Errorf("%w; DETAIL: %s", err, pgErr.Detail)
	}
	return err
}
