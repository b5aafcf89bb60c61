package pgdedupotel_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupotel"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// Each call is one span that says how it ended, and fn runs inside it.
func TestTraceSpansSayTheOutcome(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	cfg := pgdedupotel.Config{
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)),
		MeterProvider:  sdkmetric.NewMeterProvider(), // retries become span events through OnEvent
	}
	onEvent, err := pgdedupotel.OnEvent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pool, plain := setup(t, pgdedup.Config{Consumer: "billing", LockTimeout: 100 * time.Millisecond, OnEvent: onEvent})
	store := pgdedupotel.Trace(plain, cfg)
	ctx := ctxT(t)

	var inside trace.SpanContext
	if ok, err := store.Process(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
		inside = trace.SpanContextFromContext(ctx)
		return charge("a")(ctx, tx)
	}); !ok || err != nil {
		t.Fatalf("a: %v, %v", ok, err)
	}
	if ok, err := store.Process(ctx, "a", charge("a")); ok || err != nil {
		t.Fatalf("a again: %v, %v", ok, err)
	}
	declined := errors.New("card declined")
	if _, err := store.Process(ctx, "d", func(context.Context, pgx.Tx) error { return declined }); !errors.Is(err, declined) {
		t.Fatalf("d: %v", err)
	}
	if _, err := store.Process(ctx, "r", failOnce(charge("r"))); err != nil {
		t.Fatal(err)
	}
	held := pgdeduptest.HoldClaim(t, pool, plain, "h")
	if _, err := store.Process(ctx, "h", charge("h")); !errors.Is(err, pgdedup.ErrInFlight) {
		t.Fatalf("h: %v", err)
	}
	_ = held.Rollback(ctx)
	if fresh, err := store.ProcessBatch(ctx, []string{"a", "b", "c"}, chargeBatch); len(fresh) != 2 || err != nil {
		t.Fatalf("batch: %v, %v", fresh, err)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("panic %v, want it to reach the caller", r)
			}
		}()
		_, _ = store.Process(ctx, "p", func(context.Context, pgx.Tx) error { panic("boom") })
	}()

	spans := rec.Ended()
	type want struct {
		name, outcome, errType string
		status                 codes.Code
		events                 int
	}
	wants := []want{
		{"pgdedup.Process", "processed", "", codes.Unset, 0},
		{"pgdedup.Process", "duplicate", "", codes.Unset, 0},
		{"pgdedup.Process", "error", "_OTHER", codes.Error, 1}, // the recorded error
		{"pgdedup.Process", "processed", "", codes.Unset, 1},   // the retry
		{"pgdedup.Process", "in_flight", "in_flight", codes.Error, 1},
		{"pgdedup.ProcessBatch", "processed", "", codes.Unset, 0},
		{"pgdedup.Process", "error", "panic", codes.Error, 1}, // the SDK records the panic
	}
	if len(spans) != len(wants) {
		t.Fatalf("%d spans, want %d", len(spans), len(wants))
	}
	for i, w := range wants {
		s := spans[i]
		attrs := attribute.NewSet(s.Attributes()...)
		str := func(k attribute.Key) string { v, _ := attrs.Value(k); return v.AsString() }
		if s.Name() != w.name || str(pgdedupotel.AttrOutcome) != w.outcome || str(pgdedupotel.AttrErrorType) != w.errType ||
			s.Status().Code != w.status || len(s.Events()) != w.events || s.SpanKind() != trace.SpanKindInternal ||
			str(pgdedupotel.AttrConsumer) != "billing" {
			t.Errorf("span %d: %s %v status %v, %d events; want %+v", i, s.Name(), s.Attributes(), s.Status(), len(s.Events()), w)
		}
	}
	if spans[0].SpanContext().SpanID() != inside.SpanID() {
		t.Errorf("fn ran in span %v, want the Process span %v", inside.SpanID(), spans[0].SpanContext().SpanID())
	}
	if ev := spans[3].Events(); len(ev) == 1 && ev[0].Name != "pgdedup.retry" {
		t.Errorf("retry span event %q", ev[0].Name)
	}
	batch := attribute.NewSet(spans[5].Attributes()...)
	if n, _ := batch.Value(pgdedupotel.AttrBatchCount); n.AsInt64() != 3 {
		t.Errorf("batch size %v, want 3", n)
	}
	if n, _ := batch.Value(pgdedupotel.AttrFreshCount); n.AsInt64() != 2 {
		t.Errorf("fresh %v, want 2", n)
	}
	if got := pgdeduptest.Count(t, pool, `SELECT count(*) FROM charges`); got != 4 { // a, r, b, c
		t.Errorf("%d charges, want 4", got)
	}
}

// A payload mismatch recorded on a span shows no fingerprint, in its status,
// attributes or events. The first delivery's unkeyed SHA-256 of a small
// payload would give the payload away to whoever reads traces (issue 26 §6).
func TestTraceShowsNoFingerprint(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	_, plain := setup(t, pgdedup.Config{Consumer: "billing"})
	store := pgdedupotel.Trace(plain, pgdedupotel.Config{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))})
	ctx := ctxT(t)
	first, second := sha256.Sum256([]byte(`{"pin":"7345"}`)), sha256.Sum256([]byte(`{"pin":"7346"}`))
	if _, err := plain.Process(ctx, "pin-1", charge("pin-1"), pgdedup.WithFingerprint(first[:])); err != nil {
		t.Fatal(err)
	}
	// fn claims, in its transaction, an ID reused with another payload.
	_, err := store.Process(ctx, "outer", func(ctx context.Context, tx pgx.Tx) error {
		_, err := plain.Claim(ctx, tx, "pin-1", pgdedup.WithFingerprint(second[:]))
		return err
	})
	if !errors.Is(err, pgdedup.ErrPayloadMismatch) {
		t.Fatalf("%v, want ErrPayloadMismatch", err)
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	text := []string{s.Status().Description}
	for _, kv := range s.Attributes() {
		text = append(text, kv.Value.String())
	}
	for _, e := range s.Events() {
		for _, kv := range e.Attributes {
			text = append(text, kv.Value.String())
		}
	}
	if !strings.Contains(strings.Join(text, " "), "pin-1") {
		t.Errorf("the span does not name the ID: %q", text)
	}
	for _, h := range []string{hex.EncodeToString(first[:]), hex.EncodeToString(second[:])} {
		for i := 0; i+6 <= len(h); i++ {
			if joined := strings.ToLower(strings.Join(text, " ")); strings.Contains(joined, h[i:i+6]) {
				t.Fatalf("the span shows %q of a fingerprint: %q", h[i:i+6], text)
			}
		}
	}
}
