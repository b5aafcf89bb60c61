package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{nil, 2, "usage: kafka"},
		{[]string{"help"}, 0, "usage: kafka"},
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{"consume", "-max-poll-records", "0"}, 1, "-max-poll-records must be at least 1"},
		{[]string{"consume", "-brokers", " , "}, 1, "-brokers must name at least one broker"},
		{[]string{"consume", "-session-timeout", "1ms"}, 1, "-session-timeout must be at least 100ms"},
		{[]string{"consume", "-bogus"}, 2, "flag provided but not defined"},
		{[]string{"consume", "-fail-rate", "1"}, 1, "-fail-rate must be between 0 and 0.9"},
		{[]string{"consume", "-rebalance-timeout", "10ms"}, 1, "-rebalance-timeout must be at least 1s"},
		{[]string{"compare", "-records", "1"}, 1, "-records must be at least 10"},
		{[]string{"produce", "-duplicates", "2"}, 1, "-duplicates must be between 0 and 1"},
		{[]string{"produce", "-orders", "0"}, 1, "-orders must be at least 1"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String()+stderr.String(), c.says) {
			t.Errorf("kafka %v: exit %d, output %q; want exit %d saying %q", c.args, code, stdout.String()+stderr.String(), c.code, c.says)
		}
	}
}
