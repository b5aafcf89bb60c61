package pgtest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// GooseVersion is the goose CLI the tests run, as .ci/run installs it:
// go install github.com/pressly/goose/v3/cmd/goose@v3.30.0
const GooseVersion = "v3.30.0"

// Goose is the goose command-line tool, run the way a host service runs it
// against a test's database.
type Goose struct {
	t    testing.TB
	path string
}

// NewGoose finds the goose CLI on PATH or in $GOPATH/bin. Without it the test
// fails when CI is set, and is skipped otherwise, saying how to install it.
func NewGoose(t testing.TB) *Goose {
	t.Helper()
	path, err := exec.LookPath("goose")
	if err != nil {
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			home, _ := os.UserHomeDir()
			gopath = filepath.Join(home, "go")
		}
		path = filepath.Join(gopath, "bin", "goose")
		if _, serr := os.Stat(path); serr != nil {
			msg := "the goose CLI is not installed: go install github.com/pressly/goose/v3/cmd/goose@" + GooseVersion
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	out, err := exec.Command(path, "-version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "v3.") {
		t.Fatalf("%s -version: %v: %s", path, err, out)
	}
	if !strings.Contains(string(out), GooseVersion) {
		t.Logf("%s is %s; CI runs %s", path, strings.TrimSpace(string(out)), GooseVersion)
	}
	return &Goose{t: t, path: path}
}

// Run runs goose -dir dir args... with no .env file and returns its combined
// output and exit code.
func (g *Goose) Run(dir string, args ...string) (out string, code int) {
	g.t.Helper()
	cmd := exec.Command(g.path, append([]string{"-dir", dir, "-env", "none"}, args...)...)
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return b.String(), exit.ExitCode()
	case err != nil:
		g.t.Fatalf("goose %v: %v", args, err)
	}
	return b.String(), 0
}

// Up runs goose up on db, failing the test unless goose exits 0.
func (g *Goose) Up(dir string, db *DB) string {
	g.t.Helper()
	out, code := g.Run(dir, "postgres", db.URL, "up")
	if code != 0 {
		g.t.Fatalf("goose up exited %d:\n%s", code, out)
	}
	return out
}
