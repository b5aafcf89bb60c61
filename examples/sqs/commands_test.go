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
	t.Setenv("AWS_LAMBDA_RUNTIME_API", "")
	nowhere := []string{"-database-url", "postgres://nobody@127.0.0.1:1/x", "-endpoint", "http://127.0.0.1:1", "-queue-url", "http://127.0.0.1:1/q"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: sqs"},
		{[]string{"eat"}, 2, `unknown command "eat"`},
		{[]string{"consume", "-batch", "x"}, 2, "invalid value"},
		{append([]string{"consume", "-batch", "11"}, nowhere...), 1, "-batch must be between 1 and 10"},
		{append([]string{"consume", "-pollers", "0"}, nowhere...), 1, "-pollers must be at least 1"},
		{append([]string{"consume", "-wait", "21s"}, nowhere...), 1, "-wait must be between 0 and 20s"},
		{append([]string{"consume", "-key-attribute", ""}, nowhere...), 1, "-key-attribute must not be empty"},
		{append([]string{"consume", "-log-level", "loud"}, nowhere...), 1, "want debug, info, warn or error"},
		{[]string{"create-queue", "-endpoint", "http://127.0.0.1:1", "-max-receive-count", "0"}, 1, "-max-receive-count must be between 1 and 1000"},
		{[]string{"send", "-endpoint", "http://127.0.0.1:1", "-duplicates", "2"}, 1, "-duplicates must be between 0 and 1"},
		{[]string{"lambda", "-database-url", "postgres://nobody@127.0.0.1:1/x"}, 1, "AWS_LAMBDA_RUNTIME_API is not set"},
		{[]string{"migrate", "extra"}, 2, "unexpected arguments"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("run %q = %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}
