// Command pgdedup runs pgdedup's migrations, cleanup, stats and demo.
// Run `pgdedup --help` for usage.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgdedup/pgdedup/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
