package pgdedup

import (
	"testing"
	"time"

	"github.com/pgdedup/pgdedup/internal/placement/citus"
	"github.com/pgdedup/pgdedup/internal/shape/plain"
)

// A claim without options sends the statement it sent before options
// existed, with the same three arguments, and nothing else; options change
// only the claims that use them.
func TestClaimWithoutOptionsIsUnchanged(t *testing.T) {
	s, err := New(nilDB{}, Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	const before = `INSERT INTO "processed_messages" (key, consumer, message_id, expires_at) VALUES ($3::uuid, $1, $2, now() + interval '172800000000 microseconds')
ON CONFLICT DO NOTHING`
	for _, l := range []shaped{newShaped(plain.New(s.env(), s.messages.sql)), newShaped(citus.NewPlain(s.env(), s.messages.sql))} {
		sts := l.claimOne(&idClaim{store: s, id: "m"})
		if len(sts) != 1 || sts[0].sql != before || len(sts[0].args) != 3 || sts[0].row != nil {
			t.Errorf("%T: a claim without options sends %d statements, the first %q with %d arguments", l, len(sts), sts[0].sql, len(sts[0].args))
		}
	}
	withFP := newShaped(plain.New(s.env(), s.messages.sql)).claimOne(&idClaim{store: s, id: "m", opts: callOptions{fingerprint: []byte{1}, retention: time.Hour}})
	if len(withFP) != 2 || len(withFP[0].args) != 5 {
		t.Errorf("a claim with a fingerprint and a retention: %d statements, %d arguments", len(withFP), len(withFP[0].args))
	}
}

// nilDB is a DB that is never called: New does not touch the database.
type nilDB struct{ DB }
