package main

import (
	"strings"
	"testing"
	"time"
)

// The header gives the command as typed, with URL passwords hidden, and says
// when the machine was shared.
func TestHeaderNamesTheCommandWithoutPasswords(t *testing.T) {
	args := redactArgs([]string{"-database-url", "postgres://app:s3cret@db:5432/app", "-citus-url=postgres://u:pw@c:9700/x", "-only", "messages,batch", "-o", "results/a b.md"})
	h := header(args, time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), 90*time.Second, "9999.00 5.00 2.00", "0.10 0.20 0.30")
	for _, want := range []string{
		"`go run -C bench . -database-url postgres://app:xxxxx@db:5432/app -citus-url=postgres://u:xxxxx@c:9700/x -only messages,batch -o 'results/a b.md'`",
		"2026-12-01 20:00 UTC", "in 1m30s", "RAM", "**9999.00 5.00 2.00**", "other work shared the machine",
	} {
		if !strings.Contains(h, want) {
			t.Errorf("header lacks %q:\n%s", want, h)
		}
	}
	if strings.Contains(h, "s3cret") || strings.Contains(h, ":pw@") {
		t.Errorf("header shows a password:\n%s", h)
	}
	if busy("0.50 0.40 0.30") != "" {
		t.Error("a quiet machine is called shared")
	}
}
