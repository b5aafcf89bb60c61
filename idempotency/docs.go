package idempotency

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Docs returns a handler serving the page Config.DocsURL names, written from
// the middleware's Config. The page gives the key's syntax and length, how
// long a key is kept (Store.Retention), what makes two requests the same, and
// a section for each error answer, whose fragment is that answer's problem
// type. The draft (§2.5, §2.3) asks a server to publish exactly this. Mount it
// where DocsURL points.
//
//	mux.Handle("GET "+idempotency.DefaultDocsURL, mw.Docs())
func (m *Middleware) Docs() http.Handler {
	var b bytes.Buffer
	err := docsPage.Execute(&b, docsData{
		Header:         m.cfg.Header,
		MaxKeyLen:      m.cfg.MaxKeyLen,
		Retention:      formatDuration(m.store.Retention()),
		Scoped:         !m.cfg.GlobalScope,
		ClientErrors:   m.clientErrorsText(),
		Optional:       m.cfg.Optional,
		CustomFP:       m.customFingerprint,
		InFlightWait:   formatDuration(m.cfg.InFlightWait),
		MaxRequestBody: m.cfg.MaxRequestBody,
		ReplayHeaders:  strings.Join(m.cfg.ReplayHeaders, ", "),
		Replayed:       ReplayedHeader,
		Omitted:        BodyOmittedHeader,
	})
	if err != nil {
		panic(err) // the template and its data are fixed: a bug
	}
	page := b.Bytes()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Language", "en")
		_, _ = w.Write(page)
	})
}

type docsData struct {
	Header, Retention, InFlightWait, ReplayHeaders, Replayed, Omitted, ClientErrors string
	MaxKeyLen                                                                       int
	MaxRequestBody                                                                  int64
	Scoped, Optional, CustomFP                                                      bool
}

// validateDocsURL accepts a URI reference that can go in a Link header's <>
// as it is and that has no fragment, since the problem types add theirs.
func validateDocsURL(s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '<' || c == '>' || c == '"' {
			return errors.New("use printable ASCII without spaces, quotes or angle brackets (percent-encode others)")
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Fragment != "" || strings.HasSuffix(s, "#") {
		return errors.New("remove the fragment: each problem type adds its own")
	}
	return nil
}

// clientErrorsText says which 4xx answers are kept, for the docs page.
func (m *Middleware) clientErrorsText() string {
	var notKept []string
	for _, s := range m.cfg.NotKept {
		notKept = append(notKept, fmt.Sprint(s))
	}
	never := ""
	if len(notKept) > 0 {
		never = " Answers with the status " + strings.Join(notKept, ", ") + " are never kept: retry them with the same key once the cause is fixed."
	}
	switch m.cfg.ClientErrors {
	case ForgetClientErrors:
		return "Answers with a 4xx status are not kept and leave no effect: the key stays free, so you can correct the request and send it again with the same key."
	case CommitClientErrors:
		return "Answers with a 4xx status are kept and replayed like any other." + never
	}
	return "Answers with a 4xx status leave no effect and are kept: a retry gets the same answer, and a corrected request needs a new key." + never
}

func formatDuration(d time.Duration) string {
	if d > 0 && d%time.Hour == 0 {
		return fmt.Sprintf("%d hours", d/time.Hour)
	}
	return d.String()
}

var docsPage = template.Must(template.New("docs").Parse(`<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>{{.Header}}</title></head>
<body>
<h1>{{.Header}}</h1>
<p>This API makes a retried request safe: send a key of your choosing in the
<code>{{.Header}}</code> header, the same key when you retry the same request, and a
new key for each new request. The first request with a key is processed; a retry
gets the first answer again, byte for byte, with <code>{{.Replayed}}: true</code>,
and is not processed again. This follows the IETF draft
<a href="https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/">The Idempotency-Key HTTP Header Field</a>.</p>

<h2 id="key-format">The key</h2>
<p>A Structured Field String (RFC 8941), as the draft defines it:
<code>{{.Header}}: "8e03978e-40d5-43e8-bc93-6894a57f9324"</code>. The bare form without
quotes, <code>{{.Header}}: 8e03978e-40d5-43e8-bc93-6894a57f9324</code>, is the same key.
The key is 1 to {{.MaxKeyLen}} printable ASCII characters, not counting the quotes, and
holds no spaces. Use a UUID or another random value: a key you reuse for another
request is refused.{{if .Scoped}} Keys are kept apart per client: two clients choosing
the same key never see each other's answers.{{end}}</p>

<h2 id="retention">How long a key is kept</h2>
<p>A key and its answer are kept for {{.Retention}} after the first request, then
deleted; a request with a deleted key is processed as a new one. Answers with a 5xx
status are not kept and leave no effect: retry them with the same key.
{{.ClientErrors}} Replayed answers keep the status, the body and these headers:
{{.ReplayHeaders}}. An answer whose body was not kept is replayed without its body,
with <code>{{.Omitted}}: true</code>.</p>

<h2 id="same-request">What makes a retry the same request</h2>
<p>The method, the path and {{if .CustomFP}}the fields of the request this API
compares{{else}}the query and the body{{end}}: a request with a used key and anything
else different is refused.</p>

<h2 id="missing-key">400: {{.Header}} is missing</h2>
<p>{{if .Optional}}This API accepts requests without a key, but then cannot replay
their answer.{{else}}Every request here needs the header. Add it and send the request
again.{{end}}</p>

<h2 id="invalid-key">400: {{.Header}} is invalid</h2>
<p>The header is not a key as described above, or it was sent more than once.
Nothing was processed. Fix the header and send the request again.</p>

<h2 id="key-in-flight">409: a request is outstanding for this key</h2>
<p>The first request with this key is still being processed{{if ne .InFlightWait "0s"}}
after waiting {{.InFlightWait}} for it{{end}}. Retry later with the same key, without
changing anything: you will get its answer. The answer carries
<code>Retry-After</code>.</p>

<h2 id="body-too-large">413: the request body is too large</h2>
<p>The body is over {{.MaxRequestBody}} bytes, the most read with a key. Nothing was
processed.</p>

<h2 id="key-reused">422: {{.Header}} is already used</h2>
<p>This key was used for a different request. Nothing was processed. Use a new key
for a new request; to get the first request's answer, send that request again.</p>

<h2 id="busy">503: the server is busy</h2>
<p>The server had no capacity for the request and did not process it. Retry later,
with the same key; the answer carries <code>Retry-After</code>.</p>
</body>
</html>
`))
