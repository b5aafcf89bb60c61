// Package fleet runs an example's consumer command as real processes for the
// fleet and kill tests, and reads what they logged per delivery.
package fleet

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

// Proc is one consumer process started by a test.
type Proc struct {
	Name   string
	cmd    *exec.Cmd
	Log    *Log
	exited chan struct{} // closed when Wait returns; err is set then
	err    error
}

// Start starts the test binary as "<command> consume args..." with childEnv=1
// in its environment, which the broker's TestMain turns into a run of the
// command instead of the tests. The process is killed when the test ends.
func Start(t *testing.T, childEnv, name string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"consume", "-name", name, "-log-level", "debug"}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	p := &Proc{Name: name, cmd: cmd, Log: &Log{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start consumer %s: %v", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.Kill() })
	return p
}

// Kill sends SIGKILL: no deferred function, no ack, no rollback runs. Postgres
// aborts the open transactions when their connections drop, and the broker
// delivers again every message the process held unacked (RabbitMQ at once,
// flagged redelivered; JetStream once its AckWait ends).
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Stop sends SIGTERM and waits up to timeout for a clean exit.
func (p *Proc) Stop(timeout time.Duration) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return p.err
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("no exit %s after SIGTERM", timeout)
	}
}

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Log counts a consumer's per-delivery log lines (msg=delivery, written at
// debug level) and keeps its last lines for failure messages. It is what the
// test knows about redeliveries: rows written in a transaction a SIGKILL rolled
// back are gone, lines written to the pipe are not.
type Log struct {
	mu      sync.Mutex
	partial []byte
	tail    []string
	n       Counts
}

// Counts are the deliveries a consumer logged, by outcome.
type Counts struct {
	Deliveries            int
	Redelivered           int
	Processed             int
	Duplicates            int
	RedeliveredProcessed  int // redelivered and charged: no earlier delivery had committed
	RedeliveredDuplicates int // redelivered and skipped: an earlier delivery committed but died before its ack
	InFlight              int
	Rejected              int
	Failed                int
	Races                 int // "DATA RACE" reports from the race detector
}

// Add adds o to c.
func (c *Counts) Add(o Counts) {
	c.Deliveries += o.Deliveries
	c.Redelivered += o.Redelivered
	c.Processed += o.Processed
	c.Duplicates += o.Duplicates
	c.RedeliveredProcessed += o.RedeliveredProcessed
	c.RedeliveredDuplicates += o.RedeliveredDuplicates
	c.InFlight += o.InFlight
	c.Rejected += o.Rejected
	c.Failed += o.Failed
	c.Races += o.Races
}

// Write takes the process's output; it never fails.
func (l *Log) Write(b []byte) (int, error) {
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

func (l *Log) line(s string) {
	if l.tail = append(l.tail, s); len(l.tail) > 15 {
		l.tail = l.tail[1:]
	}
	if strings.Contains(s, "DATA RACE") {
		l.n.Races++
	}
	if !strings.Contains(s, " msg=delivery ") {
		return
	}
	l.n.Deliveries++
	redelivered := strings.Contains(s, " redelivered=true")
	if redelivered {
		l.n.Redelivered++
	}
	switch {
	case strings.Contains(s, " outcome=processed"):
		l.n.Processed++
		if redelivered {
			l.n.RedeliveredProcessed++
		}
	case strings.Contains(s, " outcome=duplicate"):
		l.n.Duplicates++
		if redelivered {
			l.n.RedeliveredDuplicates++
		}
	case strings.Contains(s, " outcome=in_flight"):
		l.n.InFlight++
	case strings.Contains(s, " outcome=rejected"):
		l.n.Rejected++
	case strings.Contains(s, " outcome=failed"):
		l.n.Failed++
	}
}

// Counts returns the counters so far.
func (l *Log) Counts() Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// LastLines returns the process's last log lines, for failure messages.
func (l *Log) LastLines() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.tail, "\n")
}

// Err is how the process exited, as [exec.Cmd.Wait] reported it; nil while it
// runs.
func (p *Proc) Err() error {
	select {
	case <-p.exited:
		return p.err
	default:
		return nil
	}
}
