package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Candidate is one way to reach a PostgreSQL server.
type Candidate struct {
	// Name says where the server comes from, in the error of [Choose].
	Name string
	// Open returns the server's URL and a func that releases it (nil when
	// there is nothing to release), or why it cannot.
	Open func(ctx context.Context) (url string, release func(), err error)
	// final makes Choose stop here when Open fails: the user chose it.
	final bool
}

// errUnset is the reason of an Env candidate whose variable is empty.
var errUnset = errors.New("not set")

// Env is the URL in the environment variable name. When the variable is set
// the user has chosen: if that server does not answer, [Choose] fails rather
// than try the next candidates.
func Env(name string) Candidate {
	return Candidate{Name: name, final: true, Open: func(ctx context.Context) (string, func(), error) {
		u := os.Getenv(name)
		if u == "" {
			return "", nil, errUnset
		}
		return u, nil, Ping(ctx, u)
	}}
}

// Server is the server at url, used if it answers.
func Server(url string) Candidate {
	return Candidate{Name: "a server at " + url, Open: func(ctx context.Context) (string, func(), error) {
		return url, nil, Ping(ctx, url)
	}}
}

// Throwaway is a cluster started with [StartCluster]; releasing it stops it
// and removes its directory.
func Throwaway() Candidate {
	return Candidate{Name: "a throwaway cluster from local PostgreSQL binaries", Open: func(context.Context) (string, func(), error) {
		c, err := StartCluster()
		if err != nil {
			return "", nil, err
		}
		return c.URL(), func() { _ = c.Stop() }, nil
	}}
}

// Choose tries the candidates in order and returns the URL of the first
// whose server answers, its name and its release func (never nil). hint ends
// the error when none works: what the user can do.
func Choose(ctx context.Context, hint string, candidates ...Candidate) (url, name string, release func(), err error) {
	var tried []string
	for _, c := range candidates {
		u, rel, err := c.Open(ctx)
		if err == nil {
			if rel == nil {
				rel = func() {}
			}
			return u, c.Name, rel, nil
		}
		if rel != nil {
			rel()
		}
		if c.final && !errors.Is(err, errUnset) {
			return "", "", nil, fmt.Errorf("%s does not answer: %w", c.Name, err)
		}
		tried = append(tried, fmt.Sprintf("  - %s: %s", c.Name, firstLine(err)))
	}
	return "", "", nil, fmt.Errorf("no PostgreSQL server found; tried, in order:\n%s\n%s", strings.Join(tried, "\n"), hint)
}

// Ping connects to url and pings the server, within 10 seconds.
func Ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}
