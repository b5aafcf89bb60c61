package pgserver_test

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdedup/pgdedup/internal/pgserver"
)

// The throwaway cluster listens on 127.0.0.1, which every user of the machine
// can reach, and on a Unix socket: neither lets anyone in without the
// password only its URL holds. Another user connecting as the superuser, as
// the cluster trusted them to before, is refused; the socket's directory is
// its owner's alone.
func TestClusterAdmitsOnlyItsURL(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	c, err := pgserver.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop() //nolint:errcheck // the test's end; its watchdog removes it otherwise

	if err := pgserver.Ping(ctx, c.URL()); err != nil {
		t.Fatalf("the cluster's own URL: %v", err)
	}
	u, err := url.Parse(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	if len(password) < 20 {
		t.Fatalf("password %q: too short to be random", password)
	}
	for name, dsn := range map[string]string{
		"TCP, no password":         fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port),
		"TCP, another password":    fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port),
		"TCP, another user":        fmt.Sprintf("postgres://nobody@127.0.0.1:%d/postgres?sslmode=disable", c.Port),
		"Unix socket, no password": fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", c.Dir, c.Port),
	} {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			conn.Close(ctx)
			t.Errorf("%s: connected", name)
			continue
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" && pgErr.Code != "28000" {
			t.Errorf("%s: %v, want an authentication failure (28P01)", name, err)
		}
		if password != "" && strings.Contains(err.Error(), password) {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
	st, err := os.Stat(c.Dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("socket directory %s: %v, %v; want 0700", c.Dir, st.Mode(), err)
	}
	var hba string
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SELECT string_agg(DISTINCT auth_method, ',') FROM pg_hba_file_rules`).Scan(&hba); err != nil || hba != "scram-sha-256" {
		t.Errorf("pg_hba.conf methods: %q, %v; want scram-sha-256 alone", hba, err)
	}
}
