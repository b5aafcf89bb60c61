// Package fleet runs an example's consumer command as real processes for the
// fleet and kill tests, and reads what they logged per delivery.
package fleet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Output is where a [Proc] writes what the process prints: a [Log], or an
// example's own counter built on [Lines].
type Output interface {
	io.Writer
	LastLines() string
}

// Proc is one consumer process started by a test; L reads its output.
type Proc[L Output] struct {
	Name   string
	Log    L
	cmd    *exec.Cmd
	exited chan struct{} // closed when Wait returns; err is set then
	err    error
	spoke  chan struct{} // closed at the process's first output
	once   sync.Once
}

// Write closes spoke at the process's first output: by then its main has run,
// and the command installs its SIGTERM handler before anything else.
func (p *Proc[L]) Write(b []byte) (int, error) {
	p.once.Do(func() { close(p.spoke) })
	return len(b), nil
}

// Start is [StartWith] with a [Log]: per-delivery counts.
func Start(t *testing.T, childEnv, name string, args ...string) *Proc[*Log] {
	t.Helper()
	return StartWith(t, childEnv, name, &Log{}, args...)
}

// StartWith starts the test binary as "<command> consume args..." with
// childEnv=1 in its environment, which the broker's TestMain turns into a run
// of the command instead of the tests, its output going to log (and, with
// EXAMPLES_TEST_LOGDIR set, to <dir>/<name>.log as well, for debugging). The
// process is killed when the test ends.
func StartWith[L Output](t *testing.T, childEnv, name string, log L, args ...string) *Proc[L] {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"consume", "-name", name, "-log-level", "debug"}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	p := &Proc[L]{Name: name, cmd: cmd, Log: log, exited: make(chan struct{}), spoke: make(chan struct{})}
	out := io.MultiWriter(p, log)
	cmd.Stdout, cmd.Stderr = out, out
	if dir := os.Getenv("EXAMPLES_TEST_LOGDIR"); dir != "" {
		f, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		cmd.Stdout, cmd.Stderr = io.MultiWriter(out, f), io.MultiWriter(out, f)
	}
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
// flagged redelivered; JetStream once its AckWait ends; Kafka once the group
// notices the member gone). A paused process is resumed first, to be sure.
func (p *Proc[L]) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Pause stops the process for d (SIGSTOP, then SIGCONT): long enough, it
// misses its heartbeats and comes back a zombie, with a transaction perhaps
// open and messages in hand.
func (p *Proc[L]) Pause(d time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(d)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
}

// Stop sends SIGTERM and waits up to timeout for a clean exit. A process that
// has printed nothing yet may not have installed its SIGTERM handler (a test
// binary built with -race takes a while to reach main), and SIGTERM's default
// action would kill it: Stop waits for its first output first, within the
// same timeout.
func (p *Proc[L]) Stop(timeout time.Duration) error {
	deadline := time.After(timeout)
	select {
	case <-p.spoke:
	case <-p.exited:
		return p.err
	case <-deadline:
		p.Kill()
		return fmt.Errorf("no output %s after it started", timeout)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return p.err
	case <-deadline:
		p.Kill()
		return fmt.Errorf("no exit %s after SIGTERM", timeout)
	}
}

// Running reports whether the process has not exited yet.
func (p *Proc[L]) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Err is how the process exited, as [exec.Cmd.Wait] reported it; nil while it
// runs.
func (p *Proc[L]) Err() error {
	select {
	case <-p.exited:
		return p.err
	default:
		return nil
	}
}

// Lines splits a process's output into lines and keeps the last ones, for
// failure messages. Its zero value is ready; embed it in a counter.
type Lines struct {
	mu      sync.Mutex
	partial []byte
	tail    []string
}

// Split takes output b and calls line with each line it completes, holding
// the lock that [Lines.Do] takes.
func (l *Lines) Split(b []byte, line func(string)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return
		}
		s := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		if l.tail = append(l.tail, s); len(l.tail) > 15 {
			l.tail = l.tail[1:]
		}
		line(s)
	}
}

// Do runs f holding the lock Split holds: to read what line counted.
func (l *Lines) Do(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f()
}

// LastLines returns the process's last lines.
func (l *Lines) LastLines() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.tail, "\n")
}

// Log counts a consumer's per-delivery log lines (msg=delivery, written at
// debug level) and keeps its last lines for failure messages. It is what the
// test knows about redeliveries: rows written in a transaction a SIGKILL rolled
// back are gone, lines written to the pipe are not.
type Log struct {
	Lines
	n Counts
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
	l.Split(b, l.line)
	return len(b), nil
}

func (l *Log) line(s string) {
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
func (l *Log) Counts() (c Counts) {
	l.Do(func() { c = l.n })
	return c
}

// WaitFor polls l's counts until cond holds, failing the test with the
// consumer's last lines when ctx ends first.
func (l *Log) WaitFor(t *testing.T, ctx context.Context, what string, cond func(Counts) bool) {
	t.Helper()
	for !cond(l.Counts()) {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v; consumer log:\n%s", what, ctx.Err(), l.LastLines())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
