package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/pgdedup/pgdedup"
)

const lookupHelp = `Usage: pgdedup lookup --consumer C [--json] [flags] ID...

Prints, for each message ID, whether it is recorded for consumer C: when it
was processed and when its row expires. One line per ID, in the order given;
with --json, one JSON object. It reads committed rows only: an ID whose first
delivery is still in flight shows as not recorded. An expired row not yet
cleaned up still counts as processed, and shows so.

Flags:
{{flags}}
Examples:
  DATABASE_URL=postgres://app@db/app pgdedup lookup --consumer billing order-1 order-2
  DATABASE_URL=postgres://app@db/app pgdedup lookup --consumer billing --json order-1 | jq .messages
`

// lookupJSON is the --json output of lookup.
type lookupJSON struct {
	Table    string          `json:"table"`
	Consumer string          `json:"consumer"`
	Messages []lookupMessage `json:"messages"`
}

type lookupMessage struct {
	MessageID   string     `json:"message_id"`
	Recorded    bool       `json:"recorded"`
	ProcessedAt *time.Time `json:"processed_at"` // null when not recorded
	ExpiresAt   *time.Time `json:"expires_at"`
}

func runLookup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("lookup", lookupHelp, stdout, stderr)
	fs := c.flags(true)
	consumer := fs.String("consumer", "", "the consumer `NAME` the IDs are recorded under (required)")
	asJSON := fs.Bool("json", false, "print one JSON object (times in RFC 3339)")
	ids, code, ok := c.parseIDs(fs, args, consumer)
	if !ok {
		return code
	}
	store, conn, code := c.openStore(ctx, pgdedup.Config{Consumer: *consumer})
	if store == nil {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	out := lookupJSON{Table: c.table, Consumer: *consumer}
	for _, id := range ids {
		rec, recorded, err := store.Lookup(ctx, id)
		if err != nil {
			return c.fail(err)
		}
		m := lookupMessage{MessageID: id, Recorded: recorded}
		if recorded {
			m.ProcessedAt, m.ExpiresAt = &rec.ProcessedAt, &rec.ExpiresAt
		}
		out.Messages = append(out.Messages, m)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return c.fail(err)
		}
		return exitOK
	}
	now := time.Now()
	for _, m := range out.Messages {
		if !m.Recorded {
			fmt.Fprintf(stdout, "%s: not recorded\n", shown(m.MessageID))
			continue
		}
		expiry := "expires " + m.ExpiresAt.Format(time.RFC3339) + " (in " + roughly(m.ExpiresAt.Sub(now)) + ")"
		if !m.ExpiresAt.After(now) {
			expiry = "expired " + m.ExpiresAt.Format(time.RFC3339) + ", kept until the next cleanup"
		}
		fmt.Fprintf(stdout, "%s: recorded, processed %s, %s\n", shown(m.MessageID), m.ProcessedAt.Format(time.RFC3339), expiry)
	}
	return exitOK
}
