package pgdedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// validID is the model's predicate for a valid ID, written from the
// documentation rather than from the code (FuzzValidateMessageID checks
// ValidateMessageID against the same).
func validID(id string) bool {
	return id != "" && len(id) <= pgdedup.MaxMessageIDLen && utf8.ValidString(id) && !strings.ContainsRune(id, 0)
}

// FuzzClaimBatch claims a random batch in a transaction against real Postgres,
// after claiming its first k IDs, and checks the outcome against a model: a
// batch with a bad ID fails whole, naming the first bad index, and records
// nothing; otherwise the fresh IDs are the batch's IDs not claimed before, each
// once, in input order, and what Postgres holds equals the IDs byte for byte.
// The batch is data split at sep. Each input rolls back, so inputs are
// independent. Run longer with:
// go test -run '^$' -fuzz '^FuzzClaimBatch$' -fuzztime 1m .
func FuzzClaimBatch(f *testing.F) {
	f.Add([]byte("a,b,c"), byte(','), uint8(0))
	f.Add([]byte("a,b,a,c,b"), byte(','), uint8(2))
	f.Add([]byte("x|y|x"), byte('|'), uint8(3))
	f.Add([]byte("ok,,ok"), byte(','), uint8(1))
	f.Add([]byte("ok;bad\x00;ok"), byte(';'), uint8(1))
	f.Add([]byte("ok;\xff;ok"), byte(';'), uint8(0))
	f.Add([]byte("é;e\u0301;E; é;é "), byte(';'), uint8(1))
	f.Add(append([]byte("short\n"), bytes.Repeat([]byte("L"), 1025)...), byte('\n'), uint8(1))
	f.Add(bytes.Repeat([]byte("id\x00"), 500), byte(0), uint8(7))

	db := pgtest.New(f)
	store, err := pgdedup.New(db.Pool, pgdedup.Config{Consumer: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, sep byte, k uint8) {
		ids := strings.Split(string(data), string([]byte{sep}))
		pre := ids[:min(int(k), len(ids))]
		ctx := context.Background()
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // the model's checks run inside tx

		claimed := checkClaimBatch(t, store, tx, pre, nil)
		checkClaimBatch(t, store, tx, ids, claimed)
	})
}

// checkClaimBatch runs ClaimBatch(ids) in tx, whose claims so far are claimed,
// checks it against the model and returns the claims after it.
func checkClaimBatch(t *testing.T, store *pgdedup.Store, tx pgx.Tx, ids, claimed []string) []string {
	t.Helper()
	ctx := context.Background()
	fresh, err := store.ClaimBatch(ctx, tx, ids)

	bad := slices.IndexFunc(ids, func(id string) bool { return !validID(id) })
	var want []string
	if bad < 0 {
		seen := make(map[string]bool, len(claimed)+len(ids))
		for _, id := range claimed {
			seen[id] = true
		}
		for _, id := range ids {
			if !seen[id] {
				want = append(want, id)
			}
			seen[id] = true
		}
	} else {
		says := fmt.Sprintf("message %d of %d", bad, len(ids))
		if !errors.Is(err, pgdedup.ErrInvalidMessageID) || !strings.Contains(err.Error(), says) {
			t.Fatalf("ClaimBatch(%q) err=%v, want ErrInvalidMessageID saying %q", ids, err, says)
		}
	}
	if bad < 0 && err != nil {
		t.Fatalf("ClaimBatch(%q): %v", ids, err)
	}
	if !slices.Equal(fresh, want) {
		t.Fatalf("ClaimBatch(%q) after %q: fresh=%q, want %q", ids, claimed, fresh, want)
	}
	claimed = append(claimed, want...)

	rows, err := tx.Query(ctx, `SELECT message_id FROM processed_messages WHERE consumer = 'fuzz'`)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(stored)
	if want := slices.Sorted(slices.Values(claimed)); !slices.Equal(stored, want) {
		t.Fatalf("after ClaimBatch(%q): Postgres holds %q, want %q", ids, stored, want)
	}
	return claimed
}

// batchIDs returns n distinct IDs starting at from.
func batchIDs(from, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("msg-%07d", from+i)
	}
	return ids
}

// uniqueInOrder removes repeats from ids, keeping first appearances.
func uniqueInOrder(ids []string) []string {
	seen := map[string]bool{}
	return slices.DeleteFunc(ids, func(id string) bool { dup := seen[id]; seen[id] = true; return dup })
}
