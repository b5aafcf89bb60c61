package demo

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// startProgress redraws a one-line progress bar on w every 200 ms until the
// returned stop is called, which draws the final state and ends the line.
// With a nil w it does nothing. Callers pass a terminal, not a log file.
func startProgress(w io.Writer, b *broker) (stop func()) {
	if w == nil {
		return func() {}
	}
	start := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				drawProgress(w, b, start)
				fmt.Fprintln(w)
				return
			case <-t.C:
				drawProgress(w, b, start)
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

func drawProgress(w io.Writer, b *broker, start time.Time) {
	const width = 30
	acked, total := b.progress()
	filled := 0
	if total > 0 {
		filled = acked * width / total
	}
	bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
	fmt.Fprintf(w, "\r[%s] %d/%d deliveries acked  %4.1fs", bar, acked, total, time.Since(start).Seconds())
}
