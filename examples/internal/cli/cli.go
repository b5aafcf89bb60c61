// Package cli is the command scaffolding the broker examples share: dispatch
// to a subcommand with conventional exit codes, flag parsing, settings from
// the environment, and the logger.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Command is one subcommand: it runs with the arguments after its name.
type Command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// WithSignals calls run with args, os.Stdout and os.Stderr, and a context
// that SIGTERM or SIGINT (Ctrl-C) cancels, and returns its exit code.
func WithSignals(run func(ctx context.Context, args []string, stdout, stderr io.Writer) int, args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr)
}

// Run dispatches args[0] to its command of commands and returns the exit
// code: 0 on success, 1 on failure, 2 on bad usage. name is the program's name
// in messages; usage is printed for no command, help, or an unknown command.
func Run(ctx context.Context, name, usage string, commands map[string]Command, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, ok := commands[args[0]]
	switch {
	case ok:
	case args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "%s: unknown command %q\n%s", name, args[0], usage)
		return 2
	}
	err := cmd(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "%s %s: %v\n", name, args[0], err)
		return 1
	}
}

// ErrUsage is returned for bad flags, which the flag package already reported.
var ErrUsage = errors.New("bad usage")

// Parse parses args into fs, which reports errors to stderr itself.
func Parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return ErrUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %v\n", fs.Args())
		return ErrUsage
	}
	return nil
}

// Env returns the environment variable key, or def when it is unset or empty.
func Env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// NewLogger returns a text logger to w at level (debug, info, warn or error),
// or an error naming the -log-level flag.
func NewLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
