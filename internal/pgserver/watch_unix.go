//go:build unix

package pgserver

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// watch starts a process, in a session of its own so that Ctrl-C does not end
// it, that waits for this process to end, then stops the cluster and removes
// its directory: a test binary has no hook that runs at exit.
func (c *Cluster) watch() error {
	stop := c.command("pg_ctl", "-D", c.Dir, "-m", "immediate", "-w", "stop").Args
	script := `while kill -0 "$1" 2>/dev/null; do sleep 1; done; dir=$2; shift 2; "$@" >/dev/null 2>&1; rm -rf "$dir"`
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "pgdedup-cluster-watchdog", strconv.Itoa(os.Getpid()), c.Dir}, stop...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = os.TempDir()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: cluster watchdog: %w", err)
	}
	go cmd.Wait() //nolint:errcheck // reaps it if it ends first
	return nil
}
