package idempotency

import (
	"strings"
	"testing"
)

// FuzzParseKeyHeader checks the hand-written RFC 8941 parser: it never panics,
// an accepted key obeys the key rules, and a key serialized as a String
// (RFC 8941 §4.1.6) parses back to itself.
func FuzzParseKeyHeader(f *testing.F) {
	for _, s := range []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `abc`, `"a\"b\\c"`, `"k";a=1;b="x";c=:aGk=:;d=?1;e=-1.5;f=@1;g=%"%c3%a9";h=t/k`,
		`"open`, `"x"y`, `"k";v=1.`, `"k";v=-`, `"k"; `, `"k";`, `"k";*`, `""`, `"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		key, err := parseKeyHeader(value, 255)
		if err != nil {
			return
		}
		if validateKey(key, 255) != nil {
			t.Fatalf("%q gave the key %q, which breaks the key rules", value, key)
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := parseKeyHeader(quoted, 255); err != nil || again != key {
			t.Fatalf("%q: key %q serialized as %s parses to %q, %v", value, key, quoted, again, err)
		}
	})
}
