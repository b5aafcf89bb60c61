package cli

import (
	"context"
	"fmt"
	"io"
)

func runCleanup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "pgdedup cleanup: not implemented yet")
	return 1
}
