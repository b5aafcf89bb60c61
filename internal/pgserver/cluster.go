package pgserver

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Cluster is a throwaway PostgreSQL cluster: initdb into a temporary
// directory, its own free port on 127.0.0.1, fsync off. Tests restart and
// kill it without disturbing any other server. Run as root, every pg command
// runs as the postgres user, who owns the directory (PostgreSQL refuses to
// run as root).
//
// Every other user of the machine can reach 127.0.0.1, so the cluster does
// not trust connections: each one, over TCP or the Unix socket, must give the
// superuser's password (SCRAM), a random one made for this cluster and known
// only to this process (through [Cluster.URL]). It never appears on a command
// line: initdb reads it from a file that only the cluster's owner can read,
// removed at once. The Unix socket lies in the data directory, which only its
// owner can enter (0700).
type Cluster struct {
	Bin  string // directory holding initdb, pg_ctl and postgres
	Dir  string // data directory, which holds the Unix socket too
	Port int

	password string // the superuser's, random
	runAs    string // "postgres" when running as root, else ""
	conf     string // ClusterOptions.Conf
}

// ClusterOptions change the cluster [StartClusterWith] starts.
type ClusterOptions struct {
	// Ports are the ports to try, in order; the first one free on 127.0.0.1
	// is taken. Empty: a free port the system picks.
	Ports []int
	// Conf is appended to postgresql.conf after the throwaway settings
	// (fsync = off, shared_buffers = 16MB, …), so its lines win: a benchmark
	// that wants production durability sets fsync = on here.
	Conf string
}

// StartCluster creates and starts a cluster from the binaries [FindBinaries]
// finds. Call [Cluster.Stop] when done; should the process end first, a
// watchdog process stops the cluster and removes its directory.
func StartCluster() (*Cluster, error) { return StartClusterWith(ClusterOptions{}) }

// StartClusterWith is [StartCluster] on one of opts.Ports, with opts.Conf.
func StartClusterWith(opts ClusterOptions) (*Cluster, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgdedup-cluster-")
	if err != nil {
		return nil, err
	}
	port, err := freePort(opts.Ports)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &Cluster{Bin: bin, Dir: dir, Port: port, password: rand.Text(), conf: opts.Conf}
	if err := c.start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start() error {
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		c.runAs = "postgres"
		u, err := user.Lookup(c.runAs)
		if err != nil {
			return fmt.Errorf("pgserver: running as root, PostgreSQL needs the postgres user: %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		if err := os.Chown(c.Dir, uid, gid); err != nil {
			return err
		}
	}
	if err := c.initdb(uid, gid); err != nil {
		return err
	}
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n"+
		"unix_socket_permissions = 0700\npassword_encryption = 'scram-sha-256'\n"+
		"max_connections = 100\nshared_buffers = 16MB\nfsync = off\nfull_page_writes = off\n", c.Port, c.Dir) + c.conf + "\n"
	// Appending keeps the file's owner. fsync = off only risks data on an OS
	// crash; pg_ctl restart, even -m immediate, is not one.
	f, err := os.OpenFile(filepath.Join(c.Dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return err
	}
	if err := c.watch(); err != nil {
		return err
	}
	return c.pg("pg_ctl", "-D", c.Dir, "-l", filepath.Join(c.Dir, "server.log"), "-w", "-t", "60", "start")
}

// initdb creates the cluster with SCRAM authentication for every connection
// and c.password for the superuser, passed in a file of the cluster owner's
// (uid and gid, or -1 for this process's) that no one else can read.
func (c *Cluster) initdb(uid, gid int) error {
	pw, err := os.CreateTemp("", "pgdedup-cluster-pw-") // 0600
	if err != nil {
		return err
	}
	defer os.Remove(pw.Name())
	_, err = pw.WriteString(c.password + "\n")
	if cerr := pw.Close(); err == nil {
		err = cerr
	}
	if err == nil && uid >= 0 {
		err = os.Chown(pw.Name(), uid, gid)
	}
	if err != nil {
		return err
	}
	return c.pg("initdb", "-D", c.Dir, "-U", "postgres", "--pwfile", pw.Name(), "-A", "scram-sha-256",
		"-E", "UTF8", "--no-locale", "--no-sync")
}

// URL is the connection URL of the cluster's postgres database, as its
// superuser, with the password.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", c.password, c.Port)
}

// Restart runs pg_ctl restart with the given shutdown mode ("smart", "fast"
// or "immediate") and waits until the server accepts connections again.
func (c *Cluster) Restart(mode string) error {
	return c.pg("pg_ctl", "-D", c.Dir, "-l", filepath.Join(c.Dir, "server.log"), "-m", mode, "-w", "-t", "60", "restart")
}

// Stop stops the server at once and removes its directory.
func (c *Cluster) Stop() error {
	err := c.pg("pg_ctl", "-D", c.Dir, "-m", "immediate", "-w", "stop")
	return errors.Join(err, os.RemoveAll(c.Dir))
}

// command is one of the cluster's binaries, run as the postgres user when root.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	if c.runAs != "" {
		return exec.Command("runuser", append([]string{"-u", c.runAs, "--", filepath.Join(c.Bin, name)}, args...)...)
	}
	return exec.Command(filepath.Join(c.Bin, name), args...)
}

// pg runs one of the cluster's binaries and reports its output on failure.
func (c *Cluster) pg(name string, args ...string) error {
	cmd := c.command(name, args...)
	cmd.Dir = os.TempDir()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.Dir, "server.log"))
		return fmt.Errorf("pgserver: %s %s: %w\n%s\nserver.log:\n%s", name, strings.Join(args, " "), err, out.Bytes(), tail(log, 2000))
	}
	return nil
}

// binDirs are the directories FindBinaries looks in after PGDEDUP_PG_BIN and
// the PATH: Debian and Ubuntu, Red Hat's PGDG packages, Homebrew.
var binDirs = []string{
	"/usr/lib/postgresql/*/bin",
	"/usr/pgsql-*/bin",
	"/opt/homebrew/opt/postgresql@*/bin",
	"/usr/local/opt/postgresql@*/bin",
	"/opt/homebrew/bin",
	"/usr/local/bin",
}

// FindBinaries returns the directory holding initdb and pg_ctl: PGDEDUP_PG_BIN
// if set, else the directory of initdb on the PATH, else the newest of the
// usual installation directories (/usr/lib/postgresql/N/bin on Debian and
// Ubuntu, /usr/pgsql-N/bin, Homebrew's).
func FindBinaries() (string, error) {
	if dir := os.Getenv("PGDEDUP_PG_BIN"); dir != "" {
		if !hasBinaries(dir) {
			return "", fmt.Errorf("PGDEDUP_PG_BIN=%s holds no initdb and pg_ctl", dir)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil && hasBinaries(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	for _, pattern := range binDirs {
		found, _ := filepath.Glob(pattern)
		slices.SortFunc(found, func(a, b string) int { return version(a) - version(b) })
		for i := len(found) - 1; i >= 0; i-- {
			if hasBinaries(found[i]) {
				return found[i], nil
			}
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, pg_ctl) on the PATH, in " +
		strings.Join(binDirs, ", ") + " or in PGDEDUP_PG_BIN")
}

func hasBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.IsDir() {
			return false
		}
	}
	return true
}

// version extracts N from /usr/lib/postgresql/N/bin, /usr/pgsql-N/bin or
// …/postgresql@N/bin; 0 when there is none.
func version(dir string) int {
	name := filepath.Base(filepath.Dir(dir))
	if i := strings.LastIndexAny(name, "-@"); i >= 0 {
		name = name[i+1:]
	}
	n, _ := strconv.Atoi(name)
	return n
}

// freePort returns the first of ports free on 127.0.0.1, or with none
// given, one the system picks.
func freePort(ports []int) (int, error) {
	if len(ports) == 0 {
		ports = []int{0}
	}
	for _, p := range ports {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port, nil
	}
	return 0, fmt.Errorf("pgserver: none of the ports %v is free on 127.0.0.1", ports)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
