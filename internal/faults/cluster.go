package faults

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Cluster is a throwaway PostgreSQL cluster: initdb into a temporary
// directory, its own port on 127.0.0.1, trust auth, stopped and removed when
// the test ends. Tests restart and kill it without disturbing any other server.
// Run as root, every pg command runs as the postgres user, who owns the
// directory (PostgreSQL refuses to run as root).
type Cluster struct {
	Bin  string // directory holding initdb, pg_ctl and postgres
	Dir  string // data directory
	Port int

	runAs string // "postgres" when running as root, else ""
}

// StartCluster creates and starts a cluster for t. The binaries come from
// PGDEDUP_PG_BIN if set, else the newest /usr/lib/postgresql/*/bin (Debian
// and Ubuntu), else the PATH. It fails t when none is found.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bin, err := findPgBin()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pgdedup-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &Cluster{Bin: bin, Dir: dir, Port: freePort(t)}
	if os.Geteuid() == 0 {
		c.runAs = "postgres"
		u, err := user.Lookup(c.runAs)
		if err != nil {
			t.Fatalf("faults: running as root, PostgreSQL needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.pg("initdb", "-D", dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n"+
		"max_connections = 40\nshared_buffers = 16MB\nfsync = off\nfull_page_writes = off\n", c.Port, dir)
	// Appending keeps the file's owner. fsync = off only risks data on an OS
	// crash; pg_ctl restart, even -m immediate, is not one.
	f, err := os.OpenFile(filepath.Join(dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := c.pg("pg_ctl", "-D", dir, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.pg("pg_ctl", "-D", dir, "-m", "immediate", "-w", "stop") })
	return c
}

// URL is the connection URL of the cluster's postgres database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// Restart runs pg_ctl restart with the given shutdown mode ("smart", "fast"
// or "immediate") and waits until the server accepts connections again.
func (c *Cluster) Restart(mode string) error {
	return c.pg("pg_ctl", "-D", c.Dir, "-l", filepath.Join(c.Dir, "server.log"), "-m", mode, "-w", "-t", "60", "restart")
}

// pg runs one of the cluster's binaries, as the postgres user when root.
func (c *Cluster) pg(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(c.Bin, name), args...)
	if c.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", c.runAs, "--", filepath.Join(c.Bin, name)}, args...)...)
	}
	cmd.Dir = os.TempDir()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.Dir, "server.log"))
		return fmt.Errorf("faults: %s %s: %w\n%s\nserver.log:\n%s", name, strings.Join(args, " "), err, out.Bytes(), tail(log, 2000))
	}
	return nil
}

func findPgBin() (string, error) {
	if dir := os.Getenv("PGDEDUP_PG_BIN"); dir != "" {
		return dir, nil
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	slices.SortFunc(found, func(a, b string) int { return version(a) - version(b) })
	if len(found) > 0 {
		return filepath.Dir(found[len(found)-1]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("faults: no PostgreSQL binaries (initdb, pg_ctl): set PGDEDUP_PG_BIN, " +
		"install postgresql (Debian: /usr/lib/postgresql/*/bin) or put initdb on the PATH")
}

// version extracts N from /usr/lib/postgresql/N/bin/initdb.
func version(path string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return n
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
