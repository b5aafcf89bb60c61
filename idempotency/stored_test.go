package idempotency

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// A stored response reads back as it was written; a stored response of an
// unknown version, or damaged anywhere, is an error naming the format, never
// a panic or a wrong answer.
func TestStoredFormat(t *testing.T) {
	t.Parallel()
	for _, resp := range []*response{
		{status: 201, header: http.Header{"Location": {"/charges/1"}, "Content-Type": {"application/json"}, "Cache-Control": {"no-cache", "private"}}, body: []byte(`{"id":1}`)},
		{status: 204, header: http.Header{}, body: []byte{}},
		{status: 200, header: http.Header{"Etag": {`"x"`}}, body: []byte{}, omitted: true},
		{status: 400, header: http.Header{"X-Empty": {}}, body: bytes.Repeat([]byte{0, 0xff}, 300)},
	} {
		b := encodeStored(resp)
		got, err := decodeStored(b)
		if err != nil {
			t.Fatalf("%+v: %v", resp, err)
		}
		if got.status != resp.status || got.omitted != resp.omitted || !bytes.Equal(got.body, resp.body) || got.body == nil ||
			!reflect.DeepEqual(got.header, resp.header) {
			t.Errorf("wrote %+v\nread %+v", resp, got)
		}
		for n := range len(b) {
			if got, err := decodeStored(b[:n]); err == nil && (got.status != resp.status || len(got.body) >= len(resp.body) && len(resp.body) > 0) {
				t.Errorf("%d of %d bytes read as %+v", n, len(b), got)
			}
		}
	}
	for _, b := range [][]byte{nil, {2, 0, 0, 200}, {1, 2, 0, 200}, {1, 0, 0, 42}, {1, 1, 0, 200, 0, 'x'}, {1, 0, 0, 200, 0xff}} {
		if _, err := decodeStored(b); !errors.Is(err, errStoredFormat) {
			t.Errorf("%x: %v, want errStoredFormat", b, err)
		}
	}
	if _, err := decodeStored([]byte{9, 0, 0, 200, 0}); err == nil || !strings.Contains(err.Error(), "format version 9") {
		t.Errorf("a later version's format: %v", err)
	}
}

func FuzzDecodeStored(f *testing.F) {
	f.Add(encodeStored(&response{status: 201, header: http.Header{"Location": {"/x"}}, body: []byte("body")}))
	f.Add([]byte{1, 0, 0, 200, 1, 2, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := decodeStored(b)
		if err != nil {
			return
		}
		again, err := decodeStored(encodeStored(resp))
		if err != nil || again.status != resp.status || !bytes.Equal(again.body, resp.body) || !reflect.DeepEqual(again.header, resp.header) {
			t.Fatalf("%x: read %+v, re-encoded and read %+v, %v", b, resp, again, err)
		}
	})
}
