package shop

import (
	"errors"
	"testing"
)

// An order that can never be charged is recognised before the database is
// touched, so the consumer rejects it instead of requeueing it forever.
func TestDecodeOrderRejectsUnusableBodies(t *testing.T) {
	for _, body := range []string{"", "not json", `{"order_id":"","amount_cents":5}`, `{"order_id":"o1","amount_cents":0}`, `{"order_id":"o1","amount_cents":"5"}`} {
		if _, err := DecodeOrder([]byte(body)); !errors.Is(err, ErrBadOrder) {
			t.Errorf("DecodeOrder(%q) = %v, want ErrBadOrder", body, err)
		}
	}
	o, err := DecodeOrder([]byte(`{"order_id":"o1","customer":"c","amount_cents":250}`))
	if err != nil || o != (Order{OrderID: "o1", Customer: "c", AmountCents: 250}) {
		t.Errorf("DecodeOrder(valid) = %+v, %v", o, err)
	}
}
