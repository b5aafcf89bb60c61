package wireproxy

import (
	"errors"
	"syscall"
	"time"
)

// sleepUntil blocks the goroutine's thread in nanosleep until due. A timer of
// the Go runtime would round a sub-millisecond sleep up to 1 ms when the
// process is idle (epoll_wait counts milliseconds); nanosleep with a 1 µs timer
// slack on the thread wakes on time.
func sleepUntil(due time.Time) {
	const prSetTimerSlack = 29
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1000, 0)
	for {
		d := time.Until(due)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(d.Nanoseconds())
		if err := syscall.Nanosleep(&ts, nil); err != nil && !errors.Is(err, syscall.EINTR) {
			return
		}
	}
}
