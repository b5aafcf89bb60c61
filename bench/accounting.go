package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// cost is what one message costs, counted rather than timed.
type cost struct {
	pgRT, redisRT float64 // round trips per message
	walBytes      float64 // WAL bytes per message
	fpiBytes      float64 // of which full-page images (when known)
}

// account counts round trips and WAL bytes per message for each message
// scenario, one worker at a time, through counting proxies without delay
// (see walMeter for how the WAL is measured).
//
// It first checks that the hand-written pipeline sends exactly the SQL that
// Process sends, so that it is a fair limit.
func (b *bench) account(ctx context.Context, prog *progress) (map[string]cost, string, error) {
	pgNet, addr, err := postgresTarget(b.cfg.databaseURL)
	if err != nil {
		return nil, "", err
	}
	pp, err := wireproxy.Start(wireproxy.Config{Network: pgNet, Target: addr, Raw: true})
	if err != nil {
		return nil, "", err
	}
	defer pp.Close()
	rp, err := wireproxy.Start(wireproxy.Config{Target: b.cfg.redisAddr, Raw: true})
	if err != nil {
		return nil, "", err
	}
	defer rp.Close()
	rec := &sqlRecorder{}
	e, err := b.env(ctx, pp.Addr(), rp.Addr(), 1, rec)
	if err != nil {
		return nil, "", err
	}
	defer e.close()
	if err := checkSameSQL(ctx, e, rec); err != nil {
		return nil, "", err
	}
	wal := newWALMeter(ctx, b)

	out := map[string]cost{}
	for _, s := range messageScenarios {
		prog.step("round trips and WAL: %s", s.key)
		run := func(n int) error {
			for range n {
				if err := s.handle(ctx, e, s.nextID(b)); err != nil {
					return fmt.Errorf("%s: %w", s.key, err)
				}
			}
			return nil
		}
		if err := run(20); err != nil { // warm-up: prepared statements, connections
			return nil, "", err
		}
		n := float64(b.cfg.accountMessages)
		c := cost{walBytes: -1}
		var walSum, fpiSum int64
		for range b.cfg.accountReps {
			pg0, rd0 := pp.RoundTrips(), rp.RoundTrips()
			if err := wal.start(ctx); err != nil {
				return nil, "", err
			}
			if err := run(b.cfg.accountMessages); err != nil {
				return nil, "", err
			}
			bytes, fpi, err := wal.stop(ctx)
			if err != nil {
				return nil, "", err
			}
			c.pgRT, c.redisRT = float64(pp.RoundTrips()-pg0)/n, float64(rp.RoundTrips()-rd0)/n
			walSum, fpiSum = walSum+bytes, fpiSum+fpi
			if w := float64(bytes) / n; c.walBytes < 0 || w < c.walBytes {
				c.walBytes = w
			}
		}
		if wal.inspect { // exact: the average over all repetitions
			reps := n * float64(b.cfg.accountReps)
			c.walBytes, c.fpiBytes = float64(walSum)/reps, float64(fpiSum)/reps
		}
		out[s.key] = c
	}
	return out, wal.method(), nil
}

// checkSameSQL runs one message through Process and one through the
// hand-written pipeline and compares the statements each sent.
func checkSameSQL(ctx context.Context, e *env, rec *sqlRecorder) error {
	// A Store looks up where its table lives on its first claim, once; the
	// message after that shows what every later one sends.
	if err := handleProcess(ctx, e, newID()); err != nil {
		return err
	}
	rec.take()
	if err := handleProcess(ctx, e, newID()); err != nil {
		return err
	}
	viaProcess := rec.take()
	if err := handlePipeline(ctx, e, newID()); err != nil {
		return err
	}
	if viaPipeline := rec.take(); !slices.Equal(viaProcess, viaPipeline) {
		return fmt.Errorf("the hand-written pipeline does not send what Process sends:\nProcess:  %s\npipeline: %s",
			strings.Join(viaProcess, " | "), strings.Join(viaPipeline, " | "))
	}
	return nil
}

// sqlRecorder is a pgx tracer that records the SQL of every query and batched
// query, in order.
type sqlRecorder struct {
	mu  sync.Mutex
	sql []string
}

func (r *sqlRecorder) add(sql string) {
	r.mu.Lock()
	r.sql = append(r.sql, sql)
	r.mu.Unlock()
}

// take returns the SQL recorded since the last take.
func (r *sqlRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.sql
	r.sql = nil
	return out
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(d.SQL)
	return ctx
}

func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *sqlRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (r *sqlRecorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.add(d.SQL)
}

func (r *sqlRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
