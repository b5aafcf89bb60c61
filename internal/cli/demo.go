package cli

import (
	"context"
	"fmt"
	"io"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "pgdedup demo: not implemented yet")
	return 1
}
