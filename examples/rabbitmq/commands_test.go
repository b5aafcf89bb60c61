package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Bad input is refused with a clear message before anything connects: the
// URLs below point nowhere, so a connection attempt would fail differently.
func TestBadUsageIsRefusedBeforeConnecting(t *testing.T) {
	nowhere := []string{"-database-url", "postgres://nobody@127.0.0.1:1/x", "-amqp-url", "amqp://guest:guest@127.0.0.1:1/"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: rabbitmq"},
		{[]string{"eat"}, 2, `unknown command "eat"`},
		{[]string{"consume", "-prefetch", "x"}, 2, "invalid value"},
		{append([]string{"consume", "-prefetch", "0"}, nowhere...), 1, "-prefetch must be between 1 and 65535"},
		{append([]string{"consume", "-workers", "0"}, nowhere...), 1, "-workers must be at least 1"},
		{append([]string{"consume", "-log-level", "loud"}, nowhere...), 1, "want debug, info, warn or error"},
		{[]string{"publish", "-amqp-url", "amqp://guest:guest@127.0.0.1:1/", "-duplicates", "2"}, 1, "-duplicates must be between 0 and 1"},
		{[]string{"publish", "-orders", "0"}, 1, "-orders must be at least 1"},
		{[]string{"migrate", "extra"}, 2, "unexpected arguments"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("run %q = %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}
