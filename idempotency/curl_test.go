package idempotency_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
	"github.com/pgdedup/pgdedup/internal/pgtest"
)

// TestDocsCurlExamples runs each curl command of docs/integrations.md, as
// written there, against the server that page shows, and checks the status
// (and "replayed") its comment announces. Needs curl on PATH.
func TestDocsCurlExamples(t *testing.T) {
	t.Parallel()
	curl, err := exec.LookPath("curl")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("curl is not installed; .ci/run installs it")
		}
		t.Skip("curl is not installed")
	}
	commands := docsCurlCommands(t, "../docs/integrations.md")
	if len(commands) < 6 {
		t.Fatalf("found %d curl commands in the docs, want the page's 7", len(commands))
	}
	srv, pool := ordersServer(t)
	host := strings.TrimPrefix(srv.URL, "http://")

	status := regexp.MustCompile(`^HTTP/1\.1 (\d{3})`)
	for _, c := range commands {
		line := strings.ReplaceAll(c.line, "localhost:8080", host)
		out, err := exec.Command("sh", "-c", strings.Replace(line, "curl", curl, 1)).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		m := status.FindSubmatch(out)
		replayed := strings.Contains(strings.ToLower(string(out)), "\nidempotent-replayed: true")
		if m == nil || string(m[1]) != c.status || replayed != c.replayed {
			t.Errorf("%s\nthe docs say %s (replayed %v); curl got:\n%s", c.line, c.status, c.replayed, out)
		}
		if c.status != "200" && c.status != "201" && !strings.Contains(string(out), `rel="describedby"`) {
			t.Errorf("%s: the error answer has no Link to the docs:\n%s", c.line, out)
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM orders`); n != 2 {
		t.Fatalf("%d orders, want alice's book and bob's", n)
	}
}

type curlCommand struct {
	line, status string
	replayed     bool
}

// docsCurlCommands returns the curl lines of the markdown file at path, each
// with the status its "# NNN" comment announces.
func docsCurlCommands(t *testing.T, path string) []curlCommand {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	comment := regexp.MustCompile(`\s+# (\d{3})\b(.*)$`)
	var cmds []curlCommand
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "curl ") {
			continue
		}
		m := comment.FindStringSubmatchIndex(line)
		if m == nil {
			t.Fatalf("docs: a curl line without a '# status' comment: %s", line)
		}
		cmds = append(cmds, curlCommand{
			line:     line[:m[0]],
			status:   line[m[2]:m[3]],
			replayed: strings.Contains(line[m[4]:m[5]], "replayed"),
		})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return cmds
}

// ordersServer is the orders-api of docs/integrations.md, on a test schema.
func ordersServer(t *testing.T) (*httptest.Server, *pgxpool.Pool) {
	t.Helper()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.New(db.Pool, idempotency.Config{
		Store:  pgdedup.Config{Consumer: "orders-api"},
		Scope:  func(r *http.Request) string { return userScope(r) },
		Secret: testSecret,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", requireUser(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Item string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Item == "" {
			http.Error(w, `want {"item": "..."}`, http.StatusBadRequest)
			return
		}
		var id int64
		err := idempotency.Tx(r.Context()).QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ($1) RETURNING id`, in.Item).Scan(&id)
		if err != nil {
			http.Error(w, "try again", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "item": in.Item})
	}))))
	mux.Handle("GET "+idempotency.DefaultDocsURL, mw.Docs())
	srv := httptest.NewServer(authenticate(mux))
	t.Cleanup(srv.Close)
	return srv, db.Pool
}

// requireUser answers 401 to a request without a verified user, as the docs'
// authenticate does.
func requireUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if userScope(r) == "" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// The key's forms as curl sends them, byte for byte, to a real server: the
// quoted and bare forms are one key, a malformed String gets 400 with a link
// to the docs, and the 255-byte limit counts the key without its quotes.
func TestCurlKeyForms(t *testing.T) {
	t.Parallel()
	curl, err := exec.LookPath("curl")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("curl is not installed; .ci/run installs it")
		}
		t.Skip("curl is not installed")
	}
	srv, pool := ordersServer(t)
	long := strings.Repeat("k", 255)
	for _, c := range []struct{ key, want string }{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "201"},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "201 replayed"},
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324";v=1`, "201 replayed"},
		{`"unterminated-8e03978e`, "400"},
		{`"bad\qescape"`, "400"},
		{`"8e03978e"trailing`, "400"},
		{`"a b"`, "400"},
		{`""`, "400"},
		{`"` + long + `"`, "201"},
		{long, "201 replayed"},
		{`"` + long + `k"`, "400"},
	} {
		out, err := exec.Command(curl, "-si", "-X", "POST", srv.URL+"/orders", "-H", "Idempotency-Key: "+c.key,
			"-H", "Authorization: Bearer alice-token", "-d", `{"item":"book"}`).CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		got := strings.Fields(string(out))[1]
		if strings.Contains(strings.ToLower(string(out)), "\nidempotent-replayed: true") {
			got += " replayed"
		}
		if got != c.want || c.want == "400" && !strings.Contains(string(out), "\r\nLink: </docs/idempotency-key>; rel=\"describedby\"") {
			t.Errorf("Idempotency-Key: %.60s: got %s, want %s\n%s", c.key, got, c.want, out)
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM orders`); n != 2 {
		t.Fatalf("%d orders, want 2: one per key", n)
	}
}

// The conformance table of docs/integrations.md names the tests that show each
// requirement met: they must exist.
func TestDocsNameExistingTests(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/integrations.md")
	if err != nil {
		t.Fatal(err)
	}
	var sources strings.Builder
	for _, dir := range []string{".", "..", "../examples/chi"} {
		files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			sources.Write(b)
		}
	}
	names := regexp.MustCompile("`(Test[A-Za-z0-9_]+)`").FindAllSubmatch(doc, -1)
	if len(names) < 10 {
		t.Fatalf("found %d test names in the docs", len(names))
	}
	for _, m := range names {
		if !strings.Contains(sources.String(), "func "+string(m[1])+"(") {
			t.Errorf("docs/integrations.md names %s, which no test file of idempotency/, the root package or examples/chi defines", m[1])
		}
	}
}
