package pgserver_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/internal/pgserver"
)

// deadURL is a server URL on a port of 127.0.0.1 that nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", port)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// With no variable set and nothing on the usual port, the choice falls
// through to a throwaway cluster, which answers and is gone once released.
func TestChooseFallsThroughToThrowawayCluster(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	url, name, release, err := pgserver.Choose(ctx, "hint",
		pgserver.Env("PGDEDUP_TEST_NEVER_SET"), pgserver.Server(deadURL(t)), pgserver.Throwaway())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(name, "throwaway") {
		t.Errorf("chose %q, want the throwaway cluster", name)
	}
	if err := pgserver.Ping(ctx, url); err != nil {
		t.Fatalf("the throwaway cluster does not answer: %v", err)
	}
	release()
	if err := pgserver.Ping(ctx, url); err == nil {
		t.Errorf("the throwaway cluster still answers after release")
	}
}

// When nothing works, one error names every candidate and ends with the hint.
func TestChooseNamesEveryCandidate(t *testing.T) {
	t.Setenv("PGDEDUP_PG_BIN", t.TempDir()) // no binaries there
	dead := deadURL(t)
	_, _, _, err := pgserver.Choose(ctxT(t), "Start one with `docker compose up -d`.",
		pgserver.Env("PGDEDUP_TEST_NEVER_SET"), pgserver.Server(dead), pgserver.Throwaway())
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"PGDEDUP_TEST_NEVER_SET: not set", dead, "throwaway cluster", "PGDEDUP_PG_BIN",
		"docker compose up -d"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%s", want, err)
		}
	}
}

// A variable that is set is the user's choice: if its server does not answer,
// Choose fails saying so and tries nothing else.
func TestChooseKeepsToASetVariable(t *testing.T) {
	dead := deadURL(t)
	t.Setenv("PGDEDUP_TEST_DB", dead)
	tried := false
	_, _, _, err := pgserver.Choose(ctxT(t), "hint", pgserver.Env("PGDEDUP_TEST_DB"),
		pgserver.Candidate{Name: "next", Open: func(context.Context) (string, func(), error) {
			tried = true
			return "", nil, fmt.Errorf("unused")
		}})
	if err == nil || !strings.Contains(err.Error(), "PGDEDUP_TEST_DB does not answer") || tried {
		t.Errorf("err = %v, next tried = %v; want PGDEDUP_TEST_DB does not answer, nothing else tried", err, tried)
	}
}

// A process that ends without stopping its cluster leaves nothing behind:
// the watchdog stops the server and removes its directory.
func TestClusterWatchdogCleansUpAfterExit(t *testing.T) {
	if os.Getenv("PGDEDUP_CLUSTER_HELPER") == "1" {
		c, err := pgserver.StartCluster()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(c.Dir, c.URL())
		os.Exit(0) // without Stop
	}
	t.Parallel()
	ctx := ctxT(t)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestClusterWatchdogCleansUpAfterExit$")
	cmd.Env = append(os.Environ(), "PGDEDUP_CLUSTER_HELPER=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	dir, url, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	if !ok {
		t.Fatalf("helper printed %q", out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, statErr := os.Stat(dir)
		pingErr := pgserver.Ping(ctx, url)
		if os.IsNotExist(statErr) && pingErr != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after its process ended, the cluster in %s is still there (stat: %v, ping: %v)", dir, statErr, pingErr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
