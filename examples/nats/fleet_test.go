package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary run as the consumer command instead of the
// tests, so the kill test starts real consumer processes without a separate
// build (and they run with the race detector too).
const childEnv = "PGDEDUP_NATS_CHILD"

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

// startConsumer starts the test binary as "nats consume args...".
func startConsumer(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"consume", "-name", name, "-log-level", "debug"}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	p := &proc{name: name, cmd: cmd, log: &procLog{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start consumer %s: %v", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.kill() })
	return p
}

// kill sends SIGKILL: no deferred function, no ack, no rollback runs. Postgres
// aborts the open transactions when their connections drop, and JetStream
// redelivers every message the process held unacked once its AckWait ends.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
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

// procLog counts a consumer's per-delivery log lines (msg=delivery, written at
// debug level) and keeps its last lines for failure messages. It is what the
// test knows about redeliveries: rows written in a transaction a SIGKILL rolled
// back are gone, lines written to the pipe are not.
type procLog struct {
	mu      sync.Mutex
	partial []byte
	tail    []string
	n       logCounts
}

// logCounts are the deliveries a consumer logged, by outcome.
type logCounts struct {
	deliveries            int
	redelivered           int
	processed             int
	duplicates            int
	redeliveredProcessed  int // redelivered and charged: no earlier delivery had committed
	redeliveredDuplicates int // redelivered and skipped: an earlier delivery committed but died before its ack
	inFlight              int
	rejected              int
	failed                int
	races                 int // "DATA RACE" reports from the race detector
}

func (c *logCounts) add(o logCounts) {
	c.deliveries += o.deliveries
	c.redelivered += o.redelivered
	c.processed += o.processed
	c.duplicates += o.duplicates
	c.redeliveredProcessed += o.redeliveredProcessed
	c.redeliveredDuplicates += o.redeliveredDuplicates
	c.inFlight += o.inFlight
	c.rejected += o.rejected
	c.failed += o.failed
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

func (l *procLog) line(s string) {
	if l.tail = append(l.tail, s); len(l.tail) > 15 {
		l.tail = l.tail[1:]
	}
	if strings.Contains(s, "DATA RACE") {
		l.n.races++
	}
	if !strings.Contains(s, " msg=delivery ") {
		return
	}
	l.n.deliveries++
	redelivered := strings.Contains(s, " redelivered=true")
	if redelivered {
		l.n.redelivered++
	}
	switch {
	case strings.Contains(s, " outcome=processed"):
		l.n.processed++
		if redelivered {
			l.n.redeliveredProcessed++
		}
	case strings.Contains(s, " outcome=duplicate"):
		l.n.duplicates++
		if redelivered {
			l.n.redeliveredDuplicates++
		}
	case strings.Contains(s, " outcome=in_flight"):
		l.n.inFlight++
	case strings.Contains(s, " outcome=rejected"):
		l.n.rejected++
	case strings.Contains(s, " outcome=failed"):
		l.n.failed++
	}
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
