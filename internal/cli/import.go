package cli

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
)

const importHelp = `Usage: pgdedup import --consumer C [--file F] [--retention D] [flags]

Records message IDs processed elsewhere (another dedup store, such as Redis
SET NX keys) with their original times, so that their next deliveries are
duplicates. Reads CSV from F (default: standard input), one ID a line:

  message_id,processed_at[,expires_at]

with times in RFC 3339 (2026-01-02T15:04:05Z); without expires_at, an ID
expires at processed_at + --retention. A first line "message_id,..." is
skipped. Every line is checked before anything is written, and a bad one is
reported with its line number; then all IDs are written in one transaction,
and IDs already recorded are left as they are. It prints how many were
imported and how many were already there.

On a partitioned table (docs/partitioning.md) each row goes to the partition
of its processed_at: import before consumers start.

Flags:
{{flags}}
Examples:
  DATABASE_URL=postgres://app@db/app pgdedup import --consumer billing --file ids.csv
`

// importBatch is how many rows one INSERT writes.
const importBatch = 5_000

// importRow is one checked line of the input.
type importRow struct {
	id                 string
	processed, expires time.Time
}

func runImport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("import", importHelp, stdout, stderr)
	fs := c.flags(true)
	consumer := fs.String("consumer", "", "the consumer `NAME` to record the IDs under (required)")
	file := fs.String("file", "-", "read the CSV from `F` (- for standard input)")
	retention := fs.Duration("retention", pgdedup.DefaultRetention, "without expires_at, an ID expires `D` after processed_at")
	_, code, ok := c.parseArgs(fs, args, 0, "")
	switch {
	case !ok:
		return code
	case *consumer == "":
		return c.usageError("--consumer is required")
	case *retention <= 0:
		return c.usageError("--retention must be positive, got %s", *retention)
	}
	in := io.Reader(os.Stdin)
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return c.fail(err)
		}
		defer f.Close()
		in = f
	}
	rows, err := readImport(in, *retention, time.Now())
	if err != nil {
		return c.fail(fmt.Errorf("%s: %w; nothing was imported", *file, err))
	}
	store, conn, code := c.openStore(ctx, pgdedup.Config{Consumer: *consumer})
	if store == nil {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	imported, err := writeImport(ctx, conn, store.Table(), *consumer, rows)
	if err != nil {
		return c.fail(fmt.Errorf("import into %s: %w; nothing was imported", c.table, err))
	}
	fmt.Fprintf(stdout, "imported %d of %d message IDs (consumer %s, table %s); %d already recorded\n",
		imported, len(rows), shown(*consumer), c.table, int64(len(rows))-imported)
	return exitOK
}

// readImport reads and checks every line of in. now bounds processed_at.
func readImport(in io.Reader, retention time.Duration, now time.Time) ([]importRow, error) {
	r := csv.NewReader(in)
	r.FieldsPerRecord = -1
	r.ReuseRecord = true
	var rows []importRow
	seen := map[string]int{}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err // csv's errors give the line
		}
		line, _ := r.FieldPos(0)
		if line == 1 && rec[0] == "message_id" {
			continue
		}
		row, err := importLine(rec, retention, now)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if first, ok := seen[row.id]; ok {
			return nil, fmt.Errorf("line %d: message ID %s repeats line %d", line, shown(row.id), first)
		}
		seen[row.id] = line
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return nil, errors.New("no message ID in it")
	}
	return rows, nil
}

// importLine checks one record of the form
// message_id,processed_at[,expires_at].
func importLine(rec []string, retention time.Duration, now time.Time) (importRow, error) {
	if len(rec) != 2 && len(rec) != 3 {
		return importRow{}, fmt.Errorf("%d fields, want message_id,processed_at[,expires_at]", len(rec))
	}
	row := importRow{id: rec[0]}
	if err := pgdedup.ValidateMessageID(row.id); err != nil {
		return importRow{}, fmt.Errorf("message ID %s: %s", shown(row.id), strings.TrimPrefix(err.Error(), "pgdedup: "))
	}
	parse := func(name, s string) (time.Time, error) {
		t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(s))
		if err != nil {
			return t, fmt.Errorf("%s %s: not an RFC 3339 time such as 2026-01-02T15:04:05Z", name, shown(s))
		}
		return t, nil
	}
	var err error
	if row.processed, err = parse("processed_at", rec[1]); err != nil {
		return importRow{}, err
	}
	if row.processed.After(now.Add(time.Minute)) {
		return importRow{}, fmt.Errorf("processed_at %s is in the future", rec[1])
	}
	row.expires = row.processed.Add(retention)
	if len(rec) == 3 {
		if row.expires, err = parse("expires_at", rec[2]); err != nil {
			return importRow{}, err
		}
		if !row.expires.After(row.processed) {
			return importRow{}, fmt.Errorf("expires_at %s is not after processed_at %s", rec[2], rec[1])
		}
	}
	return row, nil
}

// writeImport writes rows for consumer into table in one transaction,
// leaving the IDs already recorded, and returns how many it wrote.
func writeImport(ctx context.Context, conn *pgx.Conn, table, consumer string, rows []importRow) (int64, error) {
	var imported int64
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for start := 0; start < len(rows); start += importBatch {
			part := rows[start:min(start+importBatch, len(rows))]
			ids := make([]string, len(part))
			for i, r := range part {
				ids[i] = r.id
			}
			// IDs recorded already, in whatever partition, are left as they
			// are.
			present := map[string]bool{}
			found, _ := tx.Query(ctx, `SELECT message_id FROM `+table+` WHERE consumer = $1 AND message_id = ANY ($2::text[])`, consumer, ids)
			var id string
			if _, err := pgx.ForEachRow(found, []any{&id}, func() error { present[id] = true; return nil }); err != nil {
				return err
			}
			var keys, fresh []string
			var processed, expires []time.Time
			for _, r := range part {
				if !present[r.id] {
					keys, fresh = append(keys, pgdedup.Key(consumer, r.id)), append(fresh, r.id)
					processed, expires = append(processed, r.processed), append(expires, r.expires)
				}
			}
			tag, err := tx.Exec(ctx, `INSERT INTO `+table+` (key, consumer, message_id, processed_at, expires_at)
SELECT u.k, $1, u.id, u.p, u.e FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::timestamptz[]) AS u(k, id, p, e)
ON CONFLICT DO NOTHING`, consumer, keys, fresh, processed, expires)
			if err != nil {
				if strings.Contains(err.Error(), "no partition") {
					return fmt.Errorf("a processed_at older than the table's oldest partition, or ahead of its newest (Setup makes one for the past Retention, Cleanup the next ones): %w", err)
				}
				return err
			}
			imported += tag.RowsAffected()
		}
		return nil
	})
	return imported, err
}
