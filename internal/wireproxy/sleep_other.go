//go:build !linux

package wireproxy

import "time"

// sleepUntil sleeps until due (the benchmarks' sub-millisecond precision is
// only had on Linux).
func sleepUntil(due time.Time) { time.Sleep(time.Until(due)) }
