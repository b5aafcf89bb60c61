package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/wireproxy"
)

// msgTable is scenarios 1-5 and the pipeline on one network path.
type msgTable struct {
	network  string                    // "loopback" or the added delay
	delayed  bool                      // through the delaying proxy
	pgRTT    time.Duration             // median Postgres round trip on this path
	redisRTT time.Duration             // median Redis round trip on this path
	results  map[int]map[string]series // workers -> scenario key -> rounds
}

// runMessages runs the message scenarios in interleaved rounds at each worker
// count: a warm-up round, then rounds in which every scenario runs for
// cfg.round, the starting scenario rotating from round to round.
func (b *bench) runMessages(ctx context.Context, network string, delay time.Duration, prog *progress) (*msgTable, error) {
	pgAddr, redisAddr := "", ""
	if delay > 0 {
		pgNet, addr, err := postgresTarget(b.cfg.databaseURL)
		if err != nil {
			return nil, err
		}
		pp, err := wireproxy.Start(wireproxy.Config{Network: pgNet, Target: addr, Delay: delay, Raw: true})
		if err != nil {
			return nil, err
		}
		defer pp.Close()
		rp, err := wireproxy.Start(wireproxy.Config{Target: b.cfg.redisAddr, Delay: delay, Raw: true})
		if err != nil {
			return nil, err
		}
		defer rp.Close()
		pgAddr, redisAddr = pp.Addr(), rp.Addr()
	}
	e, err := b.env(ctx, pgAddr, redisAddr, slicesMax(b.cfg.workers), nil)
	if err != nil {
		return nil, err
	}
	defer e.close()
	t := &msgTable{network: network, results: map[int]map[string]series{}}
	if t.pgRTT, t.redisRTT, err = roundTripTimes(ctx, e); err != nil {
		return nil, err
	}
	for _, workers := range b.cfg.workers {
		res := map[string]series{}
		t.results[workers] = res
		for r := range b.cfg.rounds + 1 {
			for i := range messageScenarios {
				s := messageScenarios[(i+r)%len(messageScenarios)]
				d := b.cfg.round
				if r == 0 {
					d = b.cfg.round / 4 // warm-up: connections, statement caches
				}
				prog.step("%s, workers=%d, round %d/%d: %s", network, workers, r, b.cfg.rounds, s.key)
				got, err := measure(ctx, workers, d, nil, func(ctx context.Context, _ int) error {
					return s.handle(ctx, e, s.nextID(b))
				})
				if err != nil {
					return nil, fmt.Errorf("%s, workers=%d: %s: %w", network, workers, s.key, err)
				}
				if r > 0 {
					res[s.key] = append(res[s.key], got)
				}
			}
		}
	}
	return t, nil
}

// roundTripTimes returns the median time of an empty Postgres query and of a
// Redis PING on e, so the table says what network it was measured on.
func roundTripTimes(ctx context.Context, e *env) (pg, rd time.Duration, err error) {
	const n = 200
	pgs, rds := make([]float64, n), make([]float64, n)
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	for i := range n {
		t0 := time.Now()
		if err := conn.Ping(ctx); err != nil {
			return 0, 0, err
		}
		t1 := time.Now()
		if err := e.rdb.Ping(ctx).Err(); err != nil {
			return 0, 0, err
		}
		pgs[i], rds[i] = float64(t1.Sub(t0)), float64(time.Since(t1))
	}
	return time.Duration(median(pgs)), time.Duration(median(rds)), nil
}

// postgresTarget returns where a proxy in front of the database dials.
func postgresTarget(url string) (network, addr string, err error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "", "", err
	}
	port := strconv.Itoa(int(cfg.Port))
	if strings.HasPrefix(cfg.Host, "/") {
		return "unix", cfg.Host + "/.s.PGSQL." + port, nil
	}
	return "tcp", net.JoinHostPort(cfg.Host, port), nil
}

func slicesMax(xs []int) int {
	m := 1
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
