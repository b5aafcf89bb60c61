package citus

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
)

// pgCtl runs pg_ctl on the data directory dir, as the postgres user when the
// test runs as root (PostgreSQL refuses to run as root).
func pgCtl(dir string, args ...string) error {
	cmd := append([]string{"/usr/lib/postgresql/15/bin/pg_ctl", "-D", dir}, args...)
	if os.Geteuid() == 0 {
		cmd = append([]string{"runuser", "-u", "postgres", "--"}, cmd...)
	}
	if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(cmd, " "), err, out)
	}
	return nil
}

// A worker crashes (pg_ctl restart -m immediate) while 8 consumers process
// messages delivered twice each: deliveries that fail meanwhile are delivered
// again, and in the end every message is charged exactly once: none doubled,
// none lost. Every failure is one IsTransient calls transient, Citus's
// "failure on connection marked as essential" (XX000) included, so a consumer
// requeues rather than dead-letters it. Not parallel: the restart breaks
// every open transaction on the worker.
func TestWorkerRestartUnderLoad(t *testing.T) {
	dir := need(t, "TEST_CITUS_WORKER_PGDATA")
	s := newSchema(t, 0)
	store := s.store(t, pgdedup.Config{MaxAttempts: 5})
	ctx := ctxT(t, 3*time.Minute)
	b := &broker{}
	var restarted atomic.Bool
	go func() {
		for b.acked.Load() < 600 && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		if err := pgCtl(dir, "restart", "-m", "immediate", "-w", "-t", "60", "-l", dir+".log"); err != nil {
			t.Error(err)
		}
		restarted.Store(true)
	}()
	err := b.run(ctx, 8, nil, func() bool {
		switch {
		case len(b.published()) >= 3_000 && restarted.Load():
			return false
		case b.backlog() < 100:
			b.publish(100)
		}
		return true
	}, func(ctx context.Context, _ int, ids []string) error {
		_, err := store.Process(ctx, ids[0], charge(ids[0]))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := b.published()
	t.Logf("%d messages, %d deliveries acked, %d failed and delivered again:\n%s",
		len(ids), b.acked.Load(), b.failures.Load(), b.errorSummary())
	s.checkExactlyOnce(t, ids)
	if n := b.permanent.Load(); n != 0 {
		t.Errorf("%d deliveries failed with an error IsTransient does not call transient", n)
	}
}

// Scale-out under load: while 8 consumers process messages (each delivered
// twice), a third worker joins the cluster and the shards are rebalanced onto
// it with non-blocking (logical replication) moves. Every message is charged
// exactly once, the rebalance finishes and the new worker holds shards. At the
// end the worker is drained and removed, leaving the cluster as it was. Not
// parallel: the rebalance moves the shards of every table in the cluster.
func TestScaleOutUnderLoad(t *testing.T) {
	spare := need(t, "TEST_CITUS_SPARE_WORKER")
	host, port, ok := strings.Cut(spare, ":")
	if !ok {
		t.Fatalf("TEST_CITUS_SPARE_WORKER=%q: want host:port", spare)
	}
	s := newSchema(t, 8)
	store := s.store(t, pgdedup.Config{MaxAttempts: 5})
	ctx := ctxT(t, 4*time.Minute)
	admin := s.admin
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		for _, q := range []string{
			`SELECT citus_drain_node($1, $2::int, shard_transfer_mode => 'block_writes')`,
			`SELECT citus_remove_node($1, $2::int)`,
		} {
			// Citus's maintenance daemon drops the moved shards' old
			// placements in the background, and a node removed meanwhile
			// can fail with "tuple concurrently deleted": try again.
			_, err := admin.Exec(ctx, q, host, port)
			for try := 0; err != nil && strings.Contains(err.Error(), "concurrently") && try < 20; try++ {
				time.Sleep(250 * time.Millisecond)
				_, err = admin.Exec(ctx, q, host, port)
			}
			if err != nil {
				t.Errorf("%s: %v", q, err)
				return
			}
		}
	})

	b := &broker{}
	var rebalanced atomic.Bool
	var moved atomic.Int64
	var took atomic.Int64
	rebalanceErr := make(chan error, 1)
	go func() {
		rebalanceErr <- func() error {
			for b.acked.Load() < 300 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			start := time.Now()
			defer func() { took.Store(int64(time.Since(start))) }()
			if _, err := admin.Exec(ctx, `SELECT citus_add_node($1, $2::int)`, host, port); err != nil {
				return fmt.Errorf("citus_add_node: %w", err)
			}
			if _, err := admin.Exec(ctx, `SELECT citus_rebalance_start(shard_transfer_mode => 'force_logical')`); err != nil {
				return fmt.Errorf("citus_rebalance_start: %w", err)
			}
			if _, err := admin.Exec(ctx, `SELECT citus_rebalance_wait()`); err != nil {
				return fmt.Errorf("citus_rebalance_wait: %w", err)
			}
			var state string
			var n int64
			err := admin.QueryRow(ctx, `SELECT state::text, (SELECT count(*) FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
JOIN pg_dist_shard USING (shardid) WHERE n.nodeport = $1::int AND logicalrelid = $2::regclass)
FROM citus_rebalance_status() ORDER BY job_id DESC LIMIT 1`, port, s.name+".processed_messages").Scan(&state, &n)
			if err != nil {
				return fmt.Errorf("citus_rebalance_status: %w", err)
			}
			moved.Store(n)
			if state != "finished" {
				return fmt.Errorf("rebalance state %s, want finished", state)
			}
			return nil
		}()
		rebalanced.Store(true)
	}()
	var afterwards int
	err := b.run(ctx, 8, nil, func() bool {
		switch {
		case b.backlog() >= 100:
		case !rebalanced.Load():
			b.publish(50)
		case afterwards < 500: // and some more on the rebalanced cluster
			afterwards += 50
			b.publish(50)
		default:
			return false
		}
		return true
	}, func(ctx context.Context, _ int, ids []string) error {
		_, err := store.Process(ctx, ids[0], charge(ids[0]))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-rebalanceErr; err != nil {
		t.Fatal(err)
	}
	ids := b.published()
	t.Logf("%d messages, %d deliveries acked, %d failed and delivered again; node added and %d of 8 shards moved to it in %s:\n%s",
		len(ids), b.acked.Load(), b.failures.Load(), moved.Load(), time.Duration(took.Load()).Round(time.Millisecond), b.errorSummary())
	if moved.Load() == 0 {
		t.Errorf("no shard of processed_messages moved to the new worker")
	}
	s.checkExactlyOnce(t, ids)
}
