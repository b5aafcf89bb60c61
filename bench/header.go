package main

import (
	"bufio"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// header opens a results file: the command that wrote it, when, and on what,
// so that a figure can be traced to its run and reproduced. Figures are
// never typed into prose; docs link to a file this writes.
func header(args []string, start time.Time, took time.Duration, loadBefore, loadAfter string) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# pgdedup benchmark results\n\n")
	p("Written by `%s` from the repository root, %s UTC, in %s.\n\n",
		commandLine(args), start.UTC().Format("2006-01-02 15:04"), took.Round(time.Second))
	p("- Machine: %d CPUs (%s), %s RAM, %s/%s, %s\n", runtime.NumCPU(), cpuModel(), memTotal(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	p("- Load average (1, 5, 15 min) before: **%s**; after: **%s**. %s\n", loadBefore, loadAfter, busy(loadBefore, loadAfter))
	return b.String()
}

// busy says how to read the figures when other work shared the machine.
func busy(loads ...string) string {
	for _, l := range loads {
		one, _, _ := strings.Cut(l, " ")
		if f, err := strconv.ParseFloat(one, 64); err == nil && f > float64(runtime.NumCPU()) {
			return "More runnable processes than CPUs: other work shared the machine, so absolute rates and latencies " +
				"are pessimistic and move between runs; the ratios (taken within a round) hold better."
		}
	}
	return ""
}

// commandLine is the command as a user types it from the repository root.
func commandLine(args []string) string {
	parts := []string{"go run -C bench ."}
	for _, a := range args {
		if strings.ContainsAny(a, " \t'\"$`\\*?&;|<>()") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// memTotal is /proc/meminfo's MemTotal in GiB, or "unknown".
func memTotal() string {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				break
			}
			return fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	return "unknown"
}

// redactArgs hides the password of any URL among args.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		for _, prefix := range []string{"", "-database-url=", "-citus-url=", "--database-url=", "--citus-url="} {
			if rest, ok := strings.CutPrefix(a, prefix); ok && strings.Contains(rest, "://") {
				if u, err := url.Parse(rest); err == nil {
					out[i] = prefix + u.Redacted()
				}
			}
		}
	}
	return out
}
