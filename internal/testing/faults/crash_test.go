package faults

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// crashFigures is what one recipe's run of the crash scenario saw.
type crashFigures struct {
	crashes    [len(crashPoints)]atomic.Int64
	processes  atomic.Int64 // consumer processes started
	errorLines atomic.Int64 // failed deliveries the consumers reported
	firstError atomic.Value // string
}

// TestConsumerCrashes feeds a durable queue to consumer processes that SIGKILL
// themselves at random points of a delivery (before the claim, between claim
// and business write, between business write and COMMIT, between COMMIT and
// ack) and are restarted until the queue is empty. Through pgdedup every message
// must have exactly one effect. The same run through the two orders of the
// Redis SET NX recipe shows what they lose or double.
//
// pgdedup runs on both layouts (the partitioned one switching partitions
// every span), the Redis recipes once.
func TestConsumerCrashes(t *testing.T) {
	for _, run := range []struct{ name, recipe, layout string }{
		{recipePgdedup, recipePgdedup, layoutPlain},
		{recipePgdedup + "-" + layoutPartitioned, recipePgdedup, layoutPartitioned},
		{recipeMarkFirst, recipeMarkFirst, ""},
		{recipeMarkAfter, recipeMarkAfter, ""},
	} {
		t.Run(run.name, func(t *testing.T) {
			t.Parallel()
			testCrashes(t, run.recipe, run.layout)
		})
	}
}

func testCrashes(t *testing.T, recipe, layout string) {
	const workers, crashP = 4, 0.2
	n := scaled(200)
	// A guard against a hang, not a time limit: on a loaded 2-core machine
	// the consumer processes, each a fresh test binary, start slowly.
	ctx := testCtx(t, 5*time.Minute)
	db := pgtest.New(t)
	q, err := NewQueue(ctx, db.Pool, crashQueue, crashVisibility)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := NewLedger(ctx, db.Pool, crashLedger)
	if err != nil {
		t.Fatal(err)
	}
	ids := messageIDs("crash", n)
	if err := q.Enqueue(ctx, ids); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	env := append(os.Environ(), envRecipe+"="+recipe, envURL+"="+db.URL, envCrash+"="+strconv.FormatFloat(crashP, 'f', -1, 64),
		envSentAt+"="+sent.Format(time.RFC3339Nano))
	var cleaner *CleanerLoad
	if recipe == recipePgdedup {
		cleaner = StartCleanerLoad(t, db.Pool, layout)
	} else {
		addr, prefix := redisFor(t, ids)
		env = append(env, envRedis+"="+addr, envPrefix+"="+prefix)
	}

	var f crashFigures
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				done, err := runConsumerProcess(ctx, env, &f)
				if err != nil {
					t.Error(err)
					return
				}
				if done {
					return
				}
			}
			t.Errorf("consumers still running at the deadline: %v", ctx.Err())
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	tally, err := ledger.Tally(ctx, db.Pool, ids)
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := q.Deliveries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	left, err := q.Len(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var perPoint []string
	var total, lostly int64 // lostly: crashes after a Redis mark-first SET and before COMMIT
	for i := range crashPoints {
		c := f.crashes[i].Load()
		total += c
		perPoint = append(perPoint, fmt.Sprintf("%s=%d", crashPoints[i], c))
		if i == 1 || i == 2 {
			lostly += c
		}
	}
	t.Logf("FIGURES crash %s: %s deliveries=%d sigkills=%d (%s) processes=%d failed_deliveries=%d queue_left=%d in %s",
		strings.TrimPrefix(t.Name(), "TestConsumerCrashes/"), tally, deliveries, total, strings.Join(perPoint, " "), f.processes.Load(), f.errorLines.Load(), left, elapsed.Round(time.Millisecond))
	if e, _ := f.firstError.Load().(string); e != "" {
		t.Logf("first failed delivery: %s", e)
	}
	for i := range crashPoints {
		if f.crashes[i].Load() == 0 {
			t.Errorf("no crash at %s: the scenario did not inject every fault", crashPoints[i])
		}
	}
	if left != 0 {
		t.Errorf("%d messages left in the queue", left)
	}
	switch recipe {
	case recipePgdedup:
		assertExactlyOnce(t, tally)
		// Checked while the cleaner runs: it creates the partitions that the
		// check claims in.
		assertStillDuplicates(t, db.Pool, crashConsumer, ids, cleaner, sent)
		cleaner.Stop(t)
	case recipeMarkFirst:
		// Every crash between SET and COMMIT loses its message; nothing doubles.
		if tally.Lost == 0 || int64(tally.Lost) != lostly || tally.Doubled != 0 {
			t.Errorf("the mark-first recipe should lose exactly the %d messages whose consumer died between SET and COMMIT, and double none: %s", lostly, tally)
		}
	case recipeMarkAfter:
		// Every crash between COMMIT and SET doubles its message; nothing is lost.
		if tally.Doubled == 0 || tally.Lost != 0 {
			t.Errorf("the mark-after recipe should double the messages whose consumer died between COMMIT and SET (%d), and lose none: %s", f.crashes[3].Load(), tally)
		}
	}
}

// runConsumerProcess runs one consumer process to its end: done when it
// emptied the queue, not done when it killed itself.
func runConsumerProcess(ctx context.Context, env []string, f *crashFigures) (done bool, err error) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return false, err
	}
	if err := cmd.Start(); err != nil {
		return false, err
	}
	f.processes.Add(1)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if point, ok := strings.CutPrefix(line, "CRASH "); ok {
			p, _ := strconv.Atoi(strings.Fields(point)[0])
			f.crashes[p].Add(1)
		} else if msg, ok := strings.CutPrefix(line, "ERROR "); ok {
			f.errorLines.Add(1)
			f.firstError.CompareAndSwap(nil, msg)
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL && ctx.Err() == nil:
		return false, nil
	}
	return false, fmt.Errorf("consumer process: %w\n%s", err, stderr.Bytes())
}
