package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// writeFile writes content to a file of the test's and returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ids.csv")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Imported IDs keep the times given (expires_at defaults to processed_at +
// --retention), are duplicates for their consumer, and an ID recorded
// already is left as it is and counted. On a partitioned table the rows go
// to the partitions of their processed_at.
func TestImportCommand(t *testing.T) {
	t.Parallel()
	for _, layout := range []pgdedup.Layout{pgdedup.LayoutPlain, pgdedup.LayoutPartitioned} {
		db := pgtest.New(t)
		ctx := context.Background()
		store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing", Layout: layout, Retention: 2 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Setup(ctx); err != nil {
			t.Fatal(err)
		}
		noop := func(context.Context, pgx.Tx) error { return nil }
		if _, err := store.Process(ctx, "known", noop); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC().Truncate(time.Second)
		p1, p2, e1 := now.Add(-90*time.Minute), now.Add(-time.Minute), now.Add(time.Hour)
		file := writeFile(t, "message_id,processed_at,expires_at\n"+
			"a-1,"+p1.Format(time.RFC3339)+","+e1.Format(time.RFC3339)+"\n"+
			"a-2,"+p2.Format(time.RFC3339)+"\n"+
			"known,"+p2.Format(time.RFC3339)+"\n")
		r := run(t, "import", "--consumer", "billing", "--retention", "30m", "--file", file, "--database-url", db.URL)
		if r.code != 0 || r.stdout != "imported 2 of 3 message IDs (consumer billing, table processed_messages); 1 already recorded\n" {
			t.Fatalf("%s: import: %s", layout, r)
		}
		for id, want := range map[string][2]time.Time{"a-1": {p1, e1}, "a-2": {p2, p2.Add(30 * time.Minute)}} {
			rec, ok, err := store.Lookup(ctx, id)
			if err != nil || !ok || !rec.ProcessedAt.Equal(want[0]) || !rec.ExpiresAt.Equal(want[1]) {
				t.Errorf("%s: %s recorded %v %+v %v, want processed %s, expires %s", layout, id, ok, rec, err, want[0], want[1])
			}
			if processed, err := store.Process(ctx, id, noop); err != nil || processed {
				t.Errorf("%s: %s after the import: processed=%v err=%v, want a duplicate", layout, id, processed, err)
			}
		}
		if n := pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE message_id = 'known'`); n != 1 {
			t.Errorf("%s: %d rows of known, want its own only", layout, n)
		}
		// An ID older than every partition is refused, and nothing is written.
		if layout == pgdedup.LayoutPartitioned {
			file := writeFile(t, "b-1,"+p2.Format(time.RFC3339)+"\nb-2,"+now.Add(-72*time.Hour).Format(time.RFC3339)+"\n")
			r := run(t, "import", "--consumer", "billing", "--file", file, "--database-url", db.URL)
			if r.code != 1 || !strings.Contains(r.stderr, "older than the table's oldest partition") || !strings.Contains(r.stderr, "nothing was imported") ||
				pgtest.Count(t, db.Pool, `SELECT count(*) FROM processed_messages WHERE message_id LIKE 'b-%'`) != 0 {
				t.Errorf("import of an ID older than every partition: %s", r)
			}
		}
	}
}

// Every line is checked before connecting (the URL here answers nothing). A
// bad one fails the import, naming its line.
func TestImportCommandBadInput(t *testing.T) {
	t.Parallel()
	nowhere := "postgres://app@127.0.0.1:1/app"
	good := "ok,2026-01-01T00:00:00Z\n"
	for _, tc := range []struct {
		csv, want string
	}{
		{good + "x,yesterday\n", "line 2: processed_at yesterday: not an RFC 3339 time"},
		{good + "x\n", "line 2: 1 fields, want message_id,processed_at[,expires_at]"},
		{good + "x,2026-01-01T00:00:00Z,2025-01-01T00:00:00Z\n", "line 2: expires_at 2025-01-01T00:00:00Z is not after processed_at"},
		{good + good, `line 2: message ID ok repeats line 1`},
		{",2026-01-01T00:00:00Z\n", "line 1: message ID"},
		{good + "\"  \",2026-01-01T00:00:00Z\n", "line 2: message ID \"  \": invalid message ID: blank"},
		{"x,2999-01-01T00:00:00Z\n", "line 1: processed_at 2999-01-01T00:00:00Z is in the future"},
		{"message_id,processed_at\n", "no message ID in it"},
		{good + "\"x,2026\n", "nothing was imported"},
	} {
		r := run(t, "import", "--consumer", "billing", "--file", writeFile(t, tc.csv), "--database-url", nowhere)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "nothing was imported") {
			t.Errorf("import of %q: want exit 1 and %q, got %s", tc.csv, tc.want, r)
		}
	}
	if r := run(t, "import", "--file", writeFile(t, good), "--database-url", nowhere); r.code != 2 || !strings.Contains(r.stderr, "--consumer is required") {
		t.Errorf("import without --consumer: %s", r)
	}
}
