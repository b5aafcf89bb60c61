package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary run as the consumer command instead of the
// tests, so the kill test starts real consumer processes without a separate
// build (and they run with the race detector too).
const childEnv = "PGDEDUP_KAFKA_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runWithSignals(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// proc is one consumer process started by the test.
type proc struct {
	name   string
	cmd    *exec.Cmd
	log    *procLog
	exited chan struct{} // closed when Wait returns; err is set then
	err    error
}

// startConsumer starts the test binary as "kafka consume args...".
func startConsumer(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"consume", "-name", name, "-log-level", "debug"}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	p := &proc{name: name, cmd: cmd, log: &procLog{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if dir := os.Getenv("KAFKA_TEST_LOGDIR"); dir != "" { // the whole log, for debugging
		f, err := os.Create(dir + "/" + name + ".log")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		cmd.Stdout, cmd.Stderr = io.MultiWriter(p.log, f), io.MultiWriter(p.log, f)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start consumer %s: %v", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.kill() })
	return p
}

// kill sends SIGKILL: no deferred function, no rollback, no leaving the group
// runs. Postgres aborts the open transaction when its connection drops; the
// group notices the member gone after the session timeout.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies as well, but resume it to be sure
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// pause stops the process for d (SIGSTOP, then SIGCONT): long enough, it
// misses its heartbeats, the group gives its partitions to others, and it
// comes back a zombie, with a transaction perhaps open and a batch in hand.
func (p *proc) pause(d time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(d)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
}

// stop sends SIGTERM and waits up to timeout for a clean exit.
func (p *proc) stop(timeout time.Duration) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return p.err
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("no exit %s after SIGTERM", timeout)
	}
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// procLog counts a consumer's per-batch log lines (msg=batch) and keeps its
// last lines for failure messages. It is what the test knows about batches
// that were rolled back by a kill: their lines were written, their rows are
// gone.
type procLog struct {
	mu      sync.Mutex
	partial []byte
	tail    []string
	n       logCounts
	last    time.Time // when the last batch line came
}

// logCounts are the batches a consumer logged, by outcome, and their records.
type logCounts struct {
	batches       int
	records       int // in batches that committed or were skipped whole
	skipped       int // records at or below the stored offset: handler not run
	charged       int
	producedTwice int
	rejected      int
	duplicate     int // batches skipped whole
	fenced        int
	inFlight      int
	failed        int
	assignments   int
	races         int // "DATA RACE" reports from the race detector
}

func (c *logCounts) add(o logCounts) {
	c.batches += o.batches
	c.records += o.records
	c.skipped += o.skipped
	c.charged += o.charged
	c.producedTwice += o.producedTwice
	c.rejected += o.rejected
	c.duplicate += o.duplicate
	c.fenced += o.fenced
	c.inFlight += o.inFlight
	c.failed += o.failed
	c.assignments += o.assignments
	c.races += o.races
}

func (l *procLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		l.line(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
}

var attrRe = regexp.MustCompile(` (\w+)=(\S+)`)

func (l *procLog) line(s string) {
	if l.tail = append(l.tail, s); len(l.tail) > 15 {
		l.tail = l.tail[1:]
	}
	switch {
	case strings.Contains(s, "DATA RACE"):
		l.n.races++
	case strings.Contains(s, " msg=assigned "):
		l.n.assignments++
	}
	if !strings.Contains(s, " msg=batch ") {
		return
	}
	attrs := map[string]string{}
	for _, m := range attrRe.FindAllStringSubmatch(s, -1) {
		attrs[m[1]] = m[2]
	}
	num := func(k string) int { n, _ := strconv.Atoi(attrs[k]); return n }
	l.n.batches++
	l.last = time.Now()
	switch attrs["outcome"] {
	case "processed", "duplicate":
		l.n.records += num("records")
		l.n.skipped += num("skipped")
		l.n.charged += num("charged")
		l.n.producedTwice += num("produced_twice")
		l.n.rejected += num("rejected")
		if attrs["outcome"] == "duplicate" {
			l.n.duplicate++
		}
	case "fenced":
		l.n.fenced++
	case "in_flight":
		l.n.inFlight++
	default:
		l.n.failed++
	}
}

// lastBatch returns when the process last logged a batch.
func (l *procLog) lastBatch() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// counts returns the counters so far.
func (l *procLog) counts() logCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// lastLines returns the process's last log lines, for failure messages.
func (l *procLog) lastLines() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.tail, "\n")
}
