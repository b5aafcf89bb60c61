package cli

import (
	"net/url"
	"os"
	"regexp"
	"strings"
)

// A database URL often carries a password, and the CLI runs in cron and CI
// logs, so nothing it prints may contain one. Every message is passed through
// a redactor. It masks passwords it can see in the text (URL userinfo,
// password=…) and every password it was told about, literally.

const mask = "xxxxx"

var (
	urlPassword = regexp.MustCompile(`(?i)(postgres(?:ql)?://[^:@/\s]*:)[^@\s]*@`)
	kvPassword  = regexp.MustCompile(`(?i)((?:ssl)?password\s*=\s*)('[^']*'|[^\s&]+)`)
)

// minSecretLen is the shortest password masked wherever it appears. Masking a
// one- or two-letter "password" everywhere would garble every message, and
// such a password protects nothing anyway. Shorter ones are still masked where
// they appear in a URL or as password=….
const minSecretLen = 3

type redactor struct{ secrets []string }

// addURL remembers the passwords of a connection string, whether or not it
// parses, in their written and their URL-decoded forms, and PGPASSWORD, which
// pgx reads when the URL has none.
func (r *redactor) addURL(raw string) {
	r.add(os.Getenv("PGPASSWORD"))
	for _, m := range kvPassword.FindAllStringSubmatch(raw, -1) {
		r.add(strings.Trim(m[2], "'"))
	}
	rest, ok := strings.CutPrefix(raw, "postgres://")
	if !ok {
		rest, ok = strings.CutPrefix(raw, "postgresql://")
	}
	if !ok {
		return
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return
	}
	if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
		r.add(pw)
	}
}

// add remembers secret and its URL-decoded form.
func (r *redactor) add(secret string) {
	for _, s := range []string{secret, unescape(secret)} {
		if len(s) >= minSecretLen {
			r.secrets = append(r.secrets, s)
		}
	}
}

func unescape(s string) string {
	u, err := url.PathUnescape(s)
	if err != nil {
		return s
	}
	return u
}

// redact returns s with every password it knows of or can see masked.
func (r *redactor) redact(s string) string {
	for _, secret := range r.secrets {
		s = strings.ReplaceAll(s, secret, mask)
	}
	s = urlPassword.ReplaceAllString(s, "${1}"+mask+"@")
	return kvPassword.ReplaceAllString(s, "${1}"+mask)
}
