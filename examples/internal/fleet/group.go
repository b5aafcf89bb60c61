package fleet

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Group is the set of consumer processes a kill test starts, SIGKILLs and
// replaces. All holds every process started, Live those not killed.
type Group struct {
	t         *testing.T
	childEnv  string
	args      []string
	All, Live []*Proc[*Log]
}

// NewGroup starts n consumer processes (see [Start]) named c01, c02, ...,
// each with args.
func NewGroup(t *testing.T, childEnv string, n int, args ...string) *Group {
	t.Helper()
	g := &Group{t: t, childEnv: childEnv, args: args}
	for range n {
		g.StartOne()
	}
	return g
}

// StartOne starts one more consumer process.
func (g *Group) StartOne() {
	g.t.Helper()
	p := Start(g.t, g.childEnv, fmt.Sprintf("c%02d", len(g.All)+1), g.args...)
	g.All, g.Live = append(g.All, p), append(g.Live, p)
}

// KillOne SIGKILLs a live process chosen with rng and returns it.
func (g *Group) KillOne(rng *rand.Rand) *Proc[*Log] {
	i := rng.IntN(len(g.Live))
	victim := g.Live[i]
	victim.Kill()
	g.Live = slices.Delete(g.Live, i, i+1)
	return victim
}

// CheckRunning fails the test if a live process has exited.
func (g *Group) CheckRunning() {
	g.t.Helper()
	for _, p := range g.Live {
		if !p.Running() {
			g.t.Fatalf("consumer %s exited: %v\n%s", p.Name, p.Err(), p.Log.LastLines())
		}
	}
}

// StopLive sends SIGTERM to every live process (finish, ack and exit
// cleanly) and reports an error for each that does not exit 0 within timeout.
func (g *Group) StopLive(timeout time.Duration) {
	g.t.Helper()
	for _, p := range g.Live {
		if err := p.Stop(timeout); err != nil {
			g.t.Errorf("consumer %s after SIGTERM: %v\n%s", p.Name, err, p.Log.LastLines())
		}
	}
}

// Counts is the sum of every process's [Log.Counts].
func (g *Group) Counts() Counts {
	var total Counts
	for _, p := range g.All {
		total.Add(p.Log.Counts())
	}
	return total
}

// LastLines returns the last log lines of every process, for failure messages.
func (g *Group) LastLines() string {
	var s string
	for _, p := range g.All {
		s += fmt.Sprintf("--- %s (running %t)\n%s\n", p.Name, p.Running(), p.Log.LastLines())
	}
	return s
}

// KillPoints returns, for kills SIGKILLs spread over orders, the number of
// orders charged at which each one happens: random points of progress, so
// that the kills land while deliveries are being processed however fast the
// machine is.
func KillPoints(rng *rand.Rand, kills, orders int) []int {
	var killAt []int
	for i := range kills {
		killAt = append(killAt, int((float64(i)+rng.Float64())/float64(kills+1)*float64(orders)))
	}
	return killAt
}

// Rand returns a random source for a kill test, seeded from the clock; the
// seed is logged, to tell runs apart.
func Rand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed>>1))
}
