package faults

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
)

// TestRESP checks the RESP client on the replies the Redis recipes rely on:
// SET NX succeeding then finding the key, GET of a missing key, DEL.
func TestRESP(t *testing.T) {
	addr, prefix := redisFor(t, []string{"k"})
	c, err := DialRESP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := prefix + "k"
	for _, step := range []struct {
		args []string
		want any
	}{
		{[]string{"GET", key}, nil},
		{[]string{"SET", key, "1", "NX", "EX", "60"}, "OK"},
		{[]string{"SET", key, "1", "NX", "EX", "60"}, nil},
		{[]string{"GET", key}, "1"},
		{[]string{"DEL", key}, int64(1)},
		{[]string{"GET", key}, nil},
	} {
		got, err := c.Do(step.args...)
		if err != nil || got != step.want {
			t.Errorf("%v = %#v, %v; want %#v", step.args, got, err, step.want)
		}
	}
	if _, err := c.Do("NOSUCHCOMMAND"); err == nil {
		t.Error("an unknown command returned no error")
	}
}

// redisFor returns the Redis address (PGDEDUP_REDIS_ADDR, default
// 127.0.0.1:6379) and a key prefix of the test's own; the keys of ids are
// deleted when the test ends. Without Redis the test fails in CI and is
// skipped elsewhere.
func redisFor(t *testing.T, ids []string) (addr, prefix string) {
	t.Helper()
	addr = os.Getenv("PGDEDUP_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c, err := DialRESP(addr)
	if err == nil {
		_, err = c.Do("PING")
	}
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no Redis for the SET NX comparison (set PGDEDUP_REDIS_ADDR): %v", err)
		}
		t.Fatalf("no Redis for the SET NX comparison: %v", err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	prefix = "pgdedup-faults-" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		defer c.Close()
		for i := 0; i < len(ids); i += 500 {
			keys := []string{"DEL"}
			for _, id := range ids[i:min(i+500, len(ids))] {
				keys = append(keys, prefix+id)
			}
			if _, err := c.Do(keys...); err != nil {
				t.Errorf("redis cleanup: %v", err)
				return
			}
		}
	})
	return addr, prefix
}
