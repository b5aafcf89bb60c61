package cli

import (
	"context"
	"fmt"
	"io"
)

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "pgdedup stats: not implemented yet")
	return 1
}
