package idempotency_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/idempotency"
)

// Each error answer's type is a section of the page Docs serves, and its Link
// points to that page (draft §2.7); the page documents the Config in force.
func TestErrorsPointToTheDocsPage(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{MaxKeyLen: 40, MaxRequestBody: 64, Store: pgdedup.Config{Retention: 72 * time.Hour}}, nil)

	if r := post(t, b.url, "k", order); r.status != 201 {
		t.Fatal(r)
	}
	answers := map[string]reply{
		"missing-key":    post(t, b.url, "", order),
		"invalid-key":    post(t, b.url, `"open`, order),
		"key-reused":     post(t, b.url, "k", `{"order":"o-2","amount":1}`),
		"body-too-large": post(t, b.url, "k2", strings.Repeat(" ", 65)),
	}
	page := get(t, strings.TrimSuffix(b.url, "/charges")+idempotency.DefaultDocsURL)
	if page.status != 200 || !strings.HasPrefix(page.header.Get("Content-Type"), "text/html") {
		t.Fatalf("docs page: %v", page)
	}
	for anchor, r := range answers {
		var p struct{ Type, Title string }
		if err := json.Unmarshal([]byte(r.body), &p); err != nil {
			t.Fatalf("%s: %v: %v", anchor, r, err)
		}
		if p.Type != idempotency.DefaultDocsURL+"#"+anchor || !strings.HasPrefix(p.Title, "Idempotency-Key") ||
			r.header.Get("Content-Language") != "en" || !isProblem(r, r.status) {
			t.Errorf("%s: type %q, title %q: %v", anchor, p.Type, p.Title, r)
		}
		if !strings.Contains(page.body, `id="`+anchor+`"`) {
			t.Errorf("the docs page has no section %q", anchor)
		}
	}
	for _, fact := range []string{"1 to 40 printable ASCII", "72 hours", "over 64 bytes"} {
		if !strings.Contains(page.body, fact) {
			t.Errorf("the docs page does not say %q:\n%s", fact, page.body)
		}
	}
}

// A DocsURL of your own, such as an absolute URL of your API's documentation,
// is used as it is.
func TestCustomDocsURL(t *testing.T) {
	t.Parallel()
	const docs = "https://api.example.com/docs/retries?v=2"
	b := setup(t, idempotency.Config{DocsURL: docs}, nil)

	r := post(t, b.url, "", order)
	if r.status != 400 || !strings.Contains(r.body, `"type":"https://api.example.com/docs/retries?v=2#missing-key"`) ||
		r.header.Get("Link") != `<`+docs+`>; rel="describedby"; type="text/html"` {
		t.Fatalf("%v", r)
	}
	for _, bad := range []string{"/docs#keys", "/docs#", "/my docs", `/docs"`, "/docs>", "/caf\u00e9"} {
		if _, err := idempotency.New(b.pool, idempotency.Config{DocsURL: bad}); err == nil {
			t.Errorf("DocsURL %q accepted", bad)
		}
	}
}

func get(t *testing.T, url string) reply {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(body)}
}
