package idempotency_test

import (
	"strings"
	"testing"

	"github.com/pgdedup/pgdedup/idempotency"
)

// The draft's form, a quoted RFC 8941 String, and the bare form are one key:
// a client that switches between them retries, it does not order twice.
func TestQuotedAndBareKeyAreOneKey(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{GlobalScope: true}, nil) // message IDs are the keys alone

	for _, forms := range [][]string{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `8e03978e-40d5-43e8-bc93-6894a57f9324`},
		{`b-1`, `"b-1"`},                       // bare first, then quoted
		{`"say\"hi\""`, `say"hi"`},             // \" is a quote in the key
		{`"back\\slash"`, `back\slash`},        // \\ is a backslash
		{`"k-2"`, `"k-2";v=1`, `"k-2";a;b=?0`}, // parameters are parsed and ignored
	} {
		first := post(t, b.url, forms[0], order)
		if first.status != 201 || first.replayed() {
			t.Fatalf("%s: %v", forms[0], first)
		}
		for _, f := range forms[1:] {
			if again := post(t, b.url, f, order); again.body != first.body || !again.replayed() {
				t.Errorf("%s after %s: %v, want the replay of %v", f, forms[0], again, first)
			}
		}
	}
	if n, calls := charges(t, b.pool), b.api.calls.Load(); n != 5 || calls != 5 {
		t.Fatalf("%d charges, %d handler calls; want 5 and 5, one per key", n, calls)
	}
	var stored []string
	rows, err := b.pool.Query(t.Context(), `SELECT message_id FROM processed_messages ORDER BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, id)
	}
	want := []string{`8e03978e-40d5-43e8-bc93-6894a57f9324`, `b-1`, `back\slash`, `k-2`, `say"hi"`}
	if strings.Join(stored, " ") != strings.Join(want, " ") {
		t.Fatalf("stored keys %q, want the Strings' values %q", stored, want)
	}
}

// Every Parameter value RFC 8941 and RFC 9651 define is parsed past; the key
// stays the String's value.
func TestKeyParametersOfEveryType(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)

	first := post(t, b.url, `"p"`, order)
	for _, v := range []string{
		`"p";i=-42`, `"p";d=3.141`, `"p";s="x\"y"`, `"p";t=*tok:en/1`, `"p";b=:cHJldGVuZCB0aGlzIGlzIGJpbmFyeQ==:`,
		`"p";yes;no=?0`, `"p";date=@1659578233`, `"p";ds=%"caf%c3%a9"`, `"p"; sp=1; *x.y_z-1=2`, `"p" `,
	} {
		if r := post(t, b.url, v, order); r.body != first.body || !r.replayed() {
			t.Errorf("%s: %v", v, r)
		}
	}
	if n := charges(t, b.pool); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// A value that is neither a valid String Item nor a bare key gets 400, like a
// missing key, and nothing runs or is recorded.
func TestMalformedKeyGets400(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil)

	for _, v := range []string{
		`"unterminated-8e03978e`,
		`"bad\qescape"`,
		`"8e03978e"trailing`,
		`"a" "b"`,
		`"a", "b"`,      // a List, not an Item
		`"ends-in\`,     // a lone backslash
		`""`,            // empty
		`"a b"`,         // a space: this middleware's keys have none
		"\"tab\there\"", // not printable ASCII
		`"clé"`,         // nor is this
		`"k";Upper=1`,   // parameter names are lowercase
		`"k";=1`,        // and not empty
		`"k";v=`,        // a parameter's value must be there
		`"k";v="open`,   // and well formed
		`"k";v=1.2345`,  // a Decimal has at most 3 fractional digits
		`"k";v=1234567890123456`,
		`"k";v=?2`,
		`"k";v=:not base64!:`,
		`"k";v=%"caf%C3%A9"`, // Display String escapes are lowercase
		`"k";v=$`,
		`clé`, // bare keys are visible ASCII too
		`a b`,
	} {
		if r := post(t, b.url, v, order); !isProblem(r, 400) || !strings.Contains(r.body, "#invalid-key") {
			t.Errorf("%s: %v", v, r)
		}
	}
	if calls, n := b.api.calls.Load(), keys(t, b.pool); calls != 0 || n != 0 {
		t.Fatalf("%d handler calls, %d keys recorded; want none", calls, n)
	}
}

// MaxKeyLen counts the key, not the quotes or escapes around it.
func TestKeyLengthCountsTheValue(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{}, nil) // MaxKeyLen 255

	long := strings.Repeat("k", 254) + `"`
	if r := post(t, b.url, `"`+strings.Repeat("k", 254)+`\""`, order); r.status != 201 {
		t.Fatalf("255-byte key quoted, with an escape (258 bytes sent): %v", r)
	}
	if r := post(t, b.url, long, order); !r.replayed() {
		t.Fatalf("the same 255-byte key bare: %v", r)
	}
	if r := post(t, b.url, `"`+strings.Repeat("k", 256)+`"`, order); !isProblem(r, 400) {
		t.Fatalf("256-byte key quoted: %v", r)
	}
	if r := post(t, b.url, strings.Repeat("k", 256), order); !isProblem(r, 400) {
		t.Fatalf("256-byte key bare: %v", r)
	}
	if n := charges(t, b.pool); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}
