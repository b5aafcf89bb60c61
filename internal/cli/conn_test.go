package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/internal/cli"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// result is what one pgdedup invocation did.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// run runs pgdedup with args, as the binary would, and returns what it did.
func run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := cli.Main(ctx, args, &out, &errs)
	return result{code, out.String(), errs.String()}
}

// secret is a password in the URLs of these tests. The test database trusts
// local connections, so any password connects.
const secret = "Secr3t-Pw-42"

// withPassword returns db's URL with a password in it, and that password. It
// is the URL's own if it has one, else secret.
func withPassword(t *testing.T, db *pgtest.DB) (string, string) {
	t.Helper()
	u, err := url.Parse(db.URL)
	if err != nil || u.Scheme == "" {
		t.Fatalf("these tests need TEST_DATABASE_URL in URL form, got %v", err)
	}
	if pw, ok := u.User.Password(); ok {
		return db.URL, pw
	}
	u.User = url.UserPassword(u.User.Username(), secret)
	return u.String(), secret
}

// noPassword fails t if r printed password, as written or URL-encoded.
func noPassword(t *testing.T, r result, password string) {
	t.Helper()
	for _, s := range []string{password, url.QueryEscape(password), url.PathEscape(password)} {
		if strings.Contains(r.stdout+r.stderr, s) {
			t.Errorf("the password %q was printed:\n%s", s, r)
		}
	}
}

// With a URL that does not parse, or a database that does not answer, every
// command fails with a message saying which, never the password.
func TestBadDatabaseURL(t *testing.T) {
	t.Parallel()
	commands := [][]string{{"migrate", "up"}, {"migrate", "status"}, {"cleanup"}, {"stats"}}
	cases := []struct {
		name, url, password, want string
		code                      int
	}{
		{"unparsable", "postgres://app:" + secret + "@127.0.0.1:notaport/app", secret, "invalid database URL", 2},
		{"unparsable key=value", "host=127.0.0.1 port=notaport user=app password=" + secret, secret, "invalid database URL", 2},
		{"unreachable", "postgres://app:" + secret + "@127.0.0.1:1/app?connect_timeout=5", secret, "cannot connect to app@127.0.0.1:1/app", 1},
		{"encoded password", "postgres://app:p%40ss-w0rd%2F@127.0.0.1:1/app", "p@ss-w0rd/", "cannot connect", 1},
	}
	for _, tc := range cases {
		for _, args := range commands {
			t.Run(tc.name+"/"+strings.Join(args, " "), func(t *testing.T) {
				t.Parallel()
				r := run(t, append(args, "--database-url", tc.url)...)
				if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
					t.Errorf("want exit %d and %q on stderr; got %s", tc.code, tc.want, r)
				}
				noPassword(t, r, tc.password)
			})
		}
	}
}

// With a password in a URL that works, nothing prints it either, including the
// error for a missing table.
func TestPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	migrated, unmigrated := pgtest.New(t), pgtest.NewUnmigrated(t)
	good, pw := withPassword(t, migrated)
	missing, _ := withPassword(t, unmigrated)
	for _, args := range [][]string{
		{"stats", "--database-url", good},
		{"stats", "--json", "--database-url", good},
		{"cleanup", "--verbose", "--database-url", good},
		{"cleanup", "--dry-run", "--database-url", good},
		{"migrate", "status", "--database-url", good},
		{"migrate", "up", "--database-url", good},
	} {
		r := run(t, args...)
		if r.code != 0 {
			t.Errorf("%s: %s", args[0], r)
		}
		noPassword(t, r, pw)
	}
	for _, cmd := range []string{"stats", "cleanup"} {
		r := run(t, cmd, "--database-url", missing)
		if r.code != 1 || !strings.Contains(r.stderr, "pgdedup migrate up") {
			t.Errorf("%s on a missing table: %s", cmd, r)
		}
		noPassword(t, r, pw)
	}
}

// Without --database-url, DATABASE_URL is used. With neither, it is a usage
// error.
func TestDatabaseURLFromEnv(t *testing.T) {
	db := pgtest.New(t)
	t.Setenv("DATABASE_URL", db.URL)
	if r := run(t, "stats"); r.code != 0 || !strings.Contains(r.stdout, "processed_messages: 0 rows") {
		t.Errorf("stats with DATABASE_URL: %s", r)
	}
	t.Setenv("DATABASE_URL", "")
	for _, args := range [][]string{{"stats"}, {"cleanup"}, {"migrate", "up"}} {
		r := run(t, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "pass --database-url or set DATABASE_URL") {
			t.Errorf("%s without a database: %s", args[0], r)
		}
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"migrate", "cleanup", "stats"} {
		for _, flag := range []string{"--help", "-h"} {
			r := run(t, cmd, flag)
			_, examples, _ := strings.Cut(r.stdout, "\nExamples:\n  ")
			if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Usage: pgdedup "+cmd) ||
				!strings.Contains(examples, "pgdedup "+cmd+" ") || !strings.Contains(r.stdout, "--database-url") {
				t.Errorf("%s %s: %s", cmd, flag, r)
			}
		}
		r := run(t, cmd, "--no-such-flag")
		if r.code != 2 || !strings.Contains(r.stderr, "-no-such-flag") || !strings.Contains(r.stderr, "pgdedup "+cmd+" --help") {
			t.Errorf("%s with an unknown flag: %s", cmd, r)
		}
	}
	if r := run(t, "--help"); r.code != 0 || !strings.Contains(r.stdout, "--table") {
		t.Errorf("pgdedup --help: %s", r)
	}
}

// The usage recommends DATABASE_URL over --database-url, which shows in ps,
// and sslmode=verify-full in its examples.
func TestUsageRecommendsTheVariable(t *testing.T) {
	t.Parallel()
	r := run(t, "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "Prefer the variable: a command line is visible to every user") ||
		!strings.Contains(r.stdout, "sslmode=verify-full") {
		t.Errorf("pgdedup --help: %s", r)
	}
	for _, cmd := range []string{"migrate", "cleanup", "stats", "citus"} {
		r := run(t, cmd, "--help")
		if r.code != 0 || !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), "visible to every user of the machine in ps") ||
			strings.Contains(r.stdout, "sslmode=require") || strings.Contains(r.stdout, "--database-url '") {
			t.Errorf("pgdedup %s --help: %s", cmd, r)
		}
	}
}
