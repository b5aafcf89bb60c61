package cli_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

func TestLookupAndForgetCommands(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"order-1", "order-2"} {
		if _, err := store.Process(ctx, id, func(context.Context, pgx.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}

	r := run(t, "lookup", "--consumer", "billing", "--database-url", db.URL, "order-1", "order-3")
	if r.code != 0 {
		t.Fatalf("lookup: %s", r)
	}
	want := regexp.MustCompile(`^order-1: recorded, processed \S+Z, expires \S+Z \(in 4[78]h\d+m\)\norder-3: not recorded\n$`)
	if !want.MatchString(r.stdout) {
		t.Errorf("lookup printed:\n%s\nwant it to match %s", r.stdout, want)
	}

	r = run(t, "lookup", "--json", "--consumer", "billing", "--database-url", db.URL, "order-2", "order-3")
	var out struct {
		Table    string `json:"table"`
		Consumer string `json:"consumer"`
		Messages []struct {
			MessageID   string     `json:"message_id"`
			Recorded    bool       `json:"recorded"`
			ProcessedAt *time.Time `json:"processed_at"`
			ExpiresAt   *time.Time `json:"expires_at"`
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != 0 {
		t.Fatalf("lookup --json: %v\n%s", err, r)
	}
	if out.Table != "processed_messages" || out.Consumer != "billing" || len(out.Messages) != 2 ||
		out.Messages[0].MessageID != "order-2" || !out.Messages[0].Recorded || out.Messages[0].ExpiresAt == nil ||
		out.Messages[1].MessageID != "order-3" || out.Messages[1].Recorded || out.Messages[1].ProcessedAt != nil {
		t.Errorf("lookup --json: %s", r.stdout)
	}

	r = run(t, "forget", "--consumer", "billing", "--database-url", db.URL, "order-1", "order-3")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "forgot 1 of 2 message IDs") {
		t.Errorf("forget: %s", r)
	}
	if _, ok, err := store.Lookup(ctx, "order-1"); err != nil || ok {
		t.Errorf("order-1 after forget: recorded %v, %v", ok, err)
	}
	if _, ok, err := store.Lookup(ctx, "order-2"); err != nil || !ok {
		t.Errorf("order-2, not forgotten: recorded %v, %v", ok, err)
	}
}

// Invalid input is a usage error (exit 2) before any connection, and the URL
// points nowhere. A missing table is a failure (exit 1) that says what to do.
func TestLookupAndForgetRefuse(t *testing.T) {
	t.Parallel()
	nowhere := "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	for _, cmd := range []string{"lookup", "forget"} {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"order-1"}, "--consumer is required"},
			{[]string{"--consumer", "billing"}, "no message ID given"},
			{[]string{"--consumer", "billing", "ok", ""}, "message ID 2 (\"\"): invalid message ID: empty"},
			{[]string{"--consumer", "billing", strings.Repeat("x", 1025)}, "longer than 1024"},
			{[]string{"--consumer", " ", "order-1"}, "--consumer is blank"},
			{[]string{"--consumer", "billing", "--table", "a.b.c", "order-1"}, "--table \"a.b.c\" is not table or schema.table"},
		} {
			r := run(t, append([]string{cmd, "--database-url", nowhere}, tc.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "connect") {
				t.Errorf("%s %q: %s\nwant exit 2 and %q", cmd, tc.args, r, tc.want)
			}
		}
	}
	db := pgtest.NewUnmigrated(t)
	for _, cmd := range []string{"lookup", "forget"} {
		r := run(t, cmd, "--consumer", "billing", "--database-url", db.URL, "order-1")
		if r.code != 1 || !strings.Contains(r.stderr, "table processed_messages not found") || !strings.Contains(r.stderr, "pgdedup migrate up") {
			t.Errorf("%s on a database without the table: %s", cmd, r)
		}
	}
}
