package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pgdedup/pgdedup"
)

const forgetHelp = `Usage: pgdedup forget --consumer C [flags] ID...

Deletes the rows recording the message IDs for consumer C, and says how many
there were: the next delivery of each is processed again. Use it to let a
message through on purpose, after fixing a handler that wrongly succeeded.
Forgetting re-opens the door to the very duplicate the table exists to stop.

An ID whose first delivery is still in flight is never deleted under it:
forget waits for that transaction to end, up to --lock-timeout, then fails
naming the ID; the IDs before it stay forgotten.

Flags:
{{flags}}
Examples:
  DATABASE_URL=postgres://app@db/app pgdedup forget --consumer billing order-1
  DATABASE_URL=postgres://app@db/app pgdedup forget --consumer billing --table ops.processed_messages order-1 order-2
`

func runForget(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("forget", forgetHelp, stdout, stderr)
	fs := c.flags(true)
	consumer := fs.String("consumer", "", "the consumer `NAME` the IDs are recorded under (required)")
	lockTimeout := fs.Duration("lock-timeout", 10*time.Second, "wait up to `D` for a delivery in flight to end, then fail")
	ids, code, ok := c.parseIDs(fs, args, consumer)
	switch {
	case !ok:
		return code
	case *lockTimeout <= 0:
		return c.usageError("--lock-timeout must be positive, got %s", *lockTimeout)
	}
	store, conn, code := c.openStore(ctx, pgdedup.Config{Consumer: *consumer, LockTimeout: *lockTimeout})
	if store == nil {
		return code
	}
	defer conn.Close(context.WithoutCancel(ctx))
	forgotten := 0
	for _, id := range ids {
		ok, err := store.Forget(ctx, id)
		if err != nil {
			if errors.Is(err, pgdedup.ErrInFlight) {
				err = fmt.Errorf("%s is in flight: a delivery still holds it after %s; try again (%w)", shown(id), *lockTimeout, err)
			}
			fmt.Fprintf(stdout, "forgot %d of the %d IDs before the failure\n", forgotten, len(ids))
			return c.fail(err)
		}
		if ok {
			forgotten++
		}
	}
	fmt.Fprintf(stdout, "forgot %d of %d message IDs (consumer %s, table %s); %d not recorded\n",
		forgotten, len(ids), shown(*consumer), c.table, len(ids)-forgotten)
	return exitOK
}

// parseIDs parses lookup's and forget's arguments. They are flags, then at
// least one message ID, each checked as pgdedup would before anything is
// sent, and a --consumer.
func (c *command) parseIDs(fs *flag.FlagSet, args []string, consumer *string) ([]string, int, bool) {
	ids, code, ok := c.parse(fs, args)
	switch {
	case !ok:
		return nil, code, false
	case *consumer == "":
		return nil, c.usageError("--consumer is required"), false
	case len(ids) == 0:
		return nil, c.usageError("no message ID given"), false
	}
	for i, id := range ids {
		if err := pgdedup.ValidateMessageID(id); err != nil {
			return nil, c.usageError("message ID %d (%s): %s", i+1, shown(id), strings.TrimPrefix(err.Error(), "pgdedup: ")), false
		}
	}
	return ids, exitOK, true
}
