package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progress prints where the run is on stderr: one line rewritten in place on
// a terminal, a line per step otherwise (CI logs, redirects).
type progress struct {
	w     io.Writer
	tty   bool
	total int
	done  int
	start time.Time
}

func newProgress(w io.Writer, total int) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil {
			tty = st.Mode()&os.ModeCharDevice != 0
		}
	}
	return &progress{w: w, tty: tty, total: total, start: time.Now()}
}

// step announces the next step; total is a forecast, so done may pass it.
func (p *progress) step(format string, args ...any) {
	p.done++
	line := fmt.Sprintf("[%3d/%d %5.0fs] %s", p.done, p.total, time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// finish ends the progress line.
func (p *progress) finish() {
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[Kdone in %.0fs\n", time.Since(p.start).Seconds())
	}
}
