package cli

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// `pgdedup demo` with small numbers prints the table with pgdedup's verdict
// and exits 0.
func TestDemoCommand(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	code := Main(context.Background(), []string{"demo", "--orders", "200", "--consumers", "3",
		"--redelivery-rate", "0.4", "--crash-rate", "0.1", "--database-url", pgtest.URL(t)}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d, stderr:\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"200 orders, 3 consumers", "pgdedup (claim in the charge's tx)",
		"mark-then-process", "pgdedup: OK", "dropped"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// DATABASE_URL is used when --database-url is absent.
func TestDemoCommandReadsDatabaseURL(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtest.URL(t))
	var stdout, stderr strings.Builder
	if code := Main(context.Background(), []string{"demo", "--orders", "20"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d, stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "pgdedup: OK") {
		t.Errorf("output:\n%s", stdout.String())
	}
}

// --help prints flags and examples on stdout and exits 0. Bad flags exit 2
// before any connection.
func TestDemoCommandUsage(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	if code := Main(context.Background(), []string{"demo", "--help"}, &stdout, &stderr); code != 0 || stderr.Len() != 0 {
		t.Errorf("--help: exit code %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{"--orders", "--keep", "DATABASE_URL", "Examples:"} {
		if !strings.Contains(stdout.String(), strings.TrimLeft(want, "-")) {
			t.Errorf("--help lacks %q:\n%s", want, stdout.String())
		}
	}
	unreachable := "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	for _, args := range [][]string{
		{"demo", "--orders", "x"},
		{"demo", "--crash-rate", "0.95", "--database-url", unreachable},
		{"demo", "--consumers", "0", "--database-url", unreachable},
		{"demo", "extra"},
	} {
		stderr.Reset()
		if code := Main(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit code %d, want 2 (stderr: %s)", args, code, stderr.String())
		}
	}
}

// deadURL is a server URL on a port of 127.0.0.1 that nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", ln.Addr())
}

// withNoLocalServer makes the demo find nothing on its usual port and no
// DATABASE_URL, for one (non-parallel) test.
func withNoLocalServer(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	old := demoLocalURL
	demoLocalURL = deadURL(t)
	t.Cleanup(func() { demoLocalURL = old })
}

// A first run on a machine where no server runs but the PostgreSQL binaries
// are installed. The demo starts a throwaway cluster, says so, runs on it and
// removes it.
func TestDemoStartsAThrowawayCluster(t *testing.T) {
	withNoLocalServer(t)
	var stdout, stderr strings.Builder
	if code := Main(context.Background(), []string{"demo", "--orders", "50"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d, stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "using a throwaway cluster") || !strings.Contains(stdout.String(), "pgdedup: OK") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
}

// With no server anywhere, the demo names every place it looked and what to do.
func TestDemoSaysWhatToDoWithoutAServer(t *testing.T) {
	withNoLocalServer(t)
	t.Setenv("PGDEDUP_PG_BIN", t.TempDir()) // no binaries there
	var stdout, stderr strings.Builder
	if code := Main(context.Background(), []string{"demo", "--orders", "50"}, &stdout, &stderr); code != 1 {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{"DATABASE_URL: not set", demoLocalURL, "throwaway cluster", "docker compose up -d", "--database-url"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

// The demo's errors pass through the redactor like every command's. They have
// one "pgdedup demo:" prefix and never the URL's password.
func TestDemoErrorsAreRedacted(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	url := "postgres://app:Demo-Secr3t@127.0.0.1:1/app?connect_timeout=2"
	if code := Main(context.Background(), []string{"demo", "--orders", "10", "--database-url", url}, &stdout, &stderr); code != 1 {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", code, stderr.String())
	}
	if strings.Contains(stderr.String(), "Demo-Secr3t") || !strings.HasPrefix(stderr.String(), "pgdedup demo: ") ||
		strings.Count(stderr.String(), "pgdedup") != 1 {
		t.Errorf("stderr:\n%s", stderr.String())
	}
}
