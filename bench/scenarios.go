package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup"
)

// scenario handles one message the way one design does. Every scenario that
// processes a new message performs the same business write, writeLedger.
type scenario struct {
	key   string // short name, for flags and progress
	title string // what the table calls it
	// handle processes message id; an unexpected outcome (a new ID seen as a
	// duplicate, or the reverse) is an error that stops the run.
	handle func(ctx context.Context, e *env, id string) error
	// duplicate makes the runner pass IDs that are already recorded.
	duplicate bool
}

var (
	bareTx     = scenario{key: "bare", title: "bare business tx (no dedup)", handle: handleBare}
	pipelineTx = scenario{key: "pipeline", title: "hand-written pgx pipeline, same SQL as Process", handle: handlePipeline}
	processTx  = scenario{key: "process", title: "Store.Process", handle: handleProcess}
	claimTx    = scenario{key: "claim", title: "Store.Claim in the caller's tx", handle: handleClaim}
	redisTx    = scenario{key: "redis", title: "Redis SET NX EX, then business tx", handle: handleRedis}
	dupTx      = scenario{key: "duplicate", title: "Store.Process, duplicate ID", handle: handleDuplicate, duplicate: true}
)

// messageScenarios are scenarios 1-5 and the pipeline, in table order.
var messageScenarios = []scenario{bareTx, pipelineTx, processTx, claimTx, redisTx, dupTx}

var errSeenAsDuplicate = errors.New("a new message ID was taken for a duplicate")

// writeLedger is the business write of every scenario: one ledger row.
func writeLedger(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `INSERT INTO ledger (message_id, amount) VALUES ($1, $2)`, id, 100)
	return err
}

func handleBare(ctx context.Context, e *env, id string) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return writeLedger(ctx, tx, id) })
}

func handleProcess(ctx context.Context, e *env, id string) error {
	processed, err := e.store.Process(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
		return writeLedger(ctx, tx, id)
	})
	if err == nil && !processed {
		err = errSeenAsDuplicate
	}
	return err
}

// handlePipeline is what Process does, written by hand with pgx: BEGIN and the
// claim in one batch, the business write, COMMIT. It is the limit Process is
// measured against; the run checks that both send the same SQL.
func handlePipeline(ctx context.Context, e *env, id string) error {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(e.claimSQL, consumer, id, pgdedup.Key(consumer, id))
	br := e.pool.SendBatch(ctx, b)
	tx := br.Tx()
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	_, err := br.Exec()
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err == nil && tag.RowsAffected() != 1 {
			err = errSeenAsDuplicate
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := writeLedger(ctx, tx, id); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func handleClaim(ctx context.Context, e *env, id string) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		claimed, err := e.store.Claim(ctx, tx, id)
		if err != nil {
			return err
		}
		if !claimed {
			return errSeenAsDuplicate
		}
		return writeLedger(ctx, tx, id)
	})
}

// handleRedis is the recipe pgdedup replaces: SET key NX EX in Redis, and the
// business transaction only if the key was new. A crash between the two loses
// the message; that is the design's flaw, not measured here.
func handleRedis(ctx context.Context, e *env, id string) error {
	isNew, err := e.rdb.SetNX(ctx, e.keyPrefix+id, 1, retention).Result()
	if err != nil {
		return err
	}
	if !isNew {
		return errSeenAsDuplicate
	}
	return handleBare(ctx, e, id)
}

func handleDuplicate(ctx context.Context, e *env, id string) error {
	processed, err := e.store.Process(ctx, id, func(context.Context, pgx.Tx) error {
		return fmt.Errorf("business write ran for the recorded ID %q", id)
	})
	if err == nil && processed {
		err = fmt.Errorf("recorded ID %q was processed again", id)
	}
	return err
}

// nextID returns the ID the scenario handles next: a fresh one, or for the
// duplicate path one of the recorded IDs in turn.
func (s scenario) nextID(b *bench) string {
	if s.duplicate {
		n := b.dupNext.Add(1)
		return b.recorded[int(n)%len(b.recorded)]
	}
	return newID()
}

// newID returns a random UUID-shaped ID, as brokers commonly assign: random
// keys spread over the primary key index, which costs more than sequential ones.
func newID() string {
	const hexdigits = "0123456789abcdef"
	var buf [36]byte
	hi, lo := rand.Uint64(), rand.Uint64()
	j := 0
	for i := range buf {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			buf[i] = '-'
			continue
		}
		var nibble uint64
		if j < 16 {
			nibble = hi >> (60 - 4*j) & 0xf
		} else {
			nibble = lo >> (60 - 4*(j-16)) & 0xf
		}
		buf[i] = hexdigits[nibble]
		j++
	}
	return string(buf[:])
}
