package idempotency_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/pgdedup/pgdedup/idempotency"
)

// omitBodies stores no body at all.
type omitBodies struct{}

func (omitBodies) Seal(string, int, []byte) ([]byte, error) { return nil, nil }
func (omitBodies) Open(string, int, []byte) ([]byte, error) { return nil, errors.New("never called") }

// redactAt blanks the timestamp of the charge API's answers.
type redactAt struct{}

var atField = regexp.MustCompile(`"at":"[^"]*"`)

func (redactAt) Seal(_ string, _ int, b []byte) ([]byte, error) {
	return atField.ReplaceAll(b, []byte(`"at":"redacted"`)), nil
}

func (redactAt) Open(_ string, _ int, b []byte) ([]byte, error) { return b, nil }

// sealed encrypts with AES-GCM under a key kept outside the database, the
// row's key as additional data.
type sealed struct{ aead cipher.AEAD }

func newSealed(t *testing.T) sealed {
	block, err := aes.NewCipher(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return sealed{aead}
}

func (s sealed) Seal(rowKey string, _ int, body []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, body, []byte(rowKey)), nil
}

func (s sealed) Open(rowKey string, _ int, stored []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(stored) < n {
		return nil, errors.New("too short")
	}
	return s.aead.Open(nil, stored[:n], stored[n:], []byte(rowKey))
}

// StoredBody decides what of a body stays at rest: nothing, a redacted copy,
// or ciphertext that only the application can open, and that cannot be moved
// to another key's row.
func TestStoredBodyCodec(t *testing.T) {
	t.Parallel()
	// storedBody is the body in the stored response, and whether it was
	// omitted.
	storedBody := func(t *testing.T, b *bundle) ([]byte, bool) {
		var result []byte
		if err := b.pool.QueryRow(context.Background(), `SELECT result FROM processed_messages`).Scan(&result); err != nil {
			t.Fatal(err)
		}
		_, _, body, omitted, err := idempotency.DecodeStored(result)
		if err != nil {
			t.Fatal(err)
		}
		return body, omitted
	}

	t.Run("omit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idempotency.Config{StoredBody: omitBodies{}}, nil)
		first := post(t, b.url, "k", order)
		again := post(t, b.url, "k", order)
		if first.body == "" || again.body != "" || !again.replayed() || again.header.Get(idempotency.BodyOmittedHeader) != "true" ||
			again.header.Get("Location") != first.header.Get("Location") {
			t.Fatalf("first %v\nagain %v", first, again)
		}
		if body, omitted := storedBody(t, b); len(body) != 0 || !omitted {
			t.Fatalf("stored body %q, omitted %v", body, omitted)
		}
	})
	t.Run("redact", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idempotency.Config{StoredBody: redactAt{}}, nil)
		first := post(t, b.url, "k", order)
		again := post(t, b.url, "k", order)
		body, _ := storedBody(t, b)
		if !strings.Contains(again.body, `"at":"redacted"`) || strings.Contains(first.body, "redacted") || !again.replayed() ||
			!strings.Contains(string(body), `"at":"redacted"`) {
			t.Fatalf("first %v\nagain %v", first, again)
		}
	})
	t.Run("encrypt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idempotency.Config{StoredBody: newSealed(t)}, nil)
		first := post(t, b.url, "k", order)
		if again := post(t, b.url, "k", order); again.body != first.body || !again.replayed() {
			t.Fatalf("first %v\nagain %v", first, again)
		}
		if body, _ := storedBody(t, b); len(body) == 0 || bytes.Contains(body, []byte("o-1")) {
			t.Fatalf("the stored body holds plaintext, or nothing: %q", body)
		}
		var row []byte
		if err := b.pool.QueryRow(context.Background(), `SELECT result FROM processed_messages`).Scan(&row); err != nil || bytes.Contains(row, []byte("o-1")) {
			t.Fatalf("the stored response holds plaintext: %q, %v", row, err)
		}
		// Ciphertext moved to another key's row does not open there.
		post(t, b.url, "k2", order)
		var moved []byte
		if err := b.pool.QueryRow(context.Background(), `SELECT result FROM processed_messages WHERE message_id LIKE '% k'`).Scan(&moved); err != nil {
			t.Fatal(err)
		}
		if _, err := b.pool.Exec(context.Background(), `UPDATE processed_messages SET result = $1 WHERE message_id LIKE '% k2'`, moved); err != nil {
			t.Fatal(err)
		}
		if r := post(t, b.url, "k2", order); !isProblem(r, 500) || r.replayed() || b.api.calls.Load() != 2 {
			t.Fatalf("moved ciphertext: %v", r)
		}
	})
}
