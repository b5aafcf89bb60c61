package cli

import (
	"strings"
	"testing"
)

// The redactor is the CLI's own guard, under whatever pgx and goose already
// redact. Each message here carries the password the way a library error
// could, and none may come out with it.
func TestRedact(t *testing.T) {
	for _, tc := range []struct{ url, password, msg string }{
		{"postgres://app:hunter2@db/app", "hunter2", `parse "postgres://app:hunter2@db:x/app": invalid port`},
		{"postgres://app:hunter2@db/app", "hunter2", "auth failed for password hunter2"},
		{"postgresql://app:p%40ss%2Fw0rd@db/app", "p@ss/w0rd", "password p@ss/w0rd rejected"},
		{"postgresql://app:p%40ss%2Fw0rd@db/app", "p%40ss%2Fw0rd", "in postgresql://app:p%40ss%2Fw0rd@db/app"},
		{"postgres://app:pa:ss@word@db/app", "pa:ss@word", "cannot parse postgres://app:pa:ss@word@db/app"},
		{"host=db user=app password=hunter2", "hunter2", "cannot parse host=db user=app password=hunter2 port=x"},
		{"host=db password='hunter 2'", "hunter 2", "bad: password='hunter 2' and hunter 2"},
		{"host=db", "pw-from-elsewhere", "see postgres://u:pw-from-elsewhere@h/d and password=pw-from-elsewhere"},
	} {
		var r redactor
		r.addURL(tc.url)
		got := r.redact(tc.msg)
		if strings.Contains(got, tc.password) {
			t.Errorf("redact(%q) with URL %q = %q: the password is still there", tc.msg, tc.url, got)
		}
		if !strings.Contains(got, mask) {
			t.Errorf("redact(%q) = %q: nothing masked", tc.msg, got)
		}
	}
}

func TestRedactPGPASSWORD(t *testing.T) {
	t.Setenv("PGPASSWORD", "from-the-env")
	var r redactor
	r.addURL("postgres://app@db/app")
	if got := r.redact("failed for from-the-env"); strings.Contains(got, "from-the-env") {
		t.Errorf("PGPASSWORD printed: %q", got)
	}
}
