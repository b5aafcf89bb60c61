package pgdedup_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pgdedup/pgdedup"
)

func TestWithRetention(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Retention: time.Hour})
	ctx := ctxT(t)
	if _, err := b.store.Process(ctx, "long", charge("long"), pgdedup.WithRetention(14*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Process(ctx, "usual", charge("usual")); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]time.Duration{"long": 14 * 24 * time.Hour, "usual": time.Hour} {
		rec, ok, err := b.store.Lookup(ctx, id)
		if err != nil || !ok || rec.ExpiresAt.Sub(rec.ProcessedAt) != want {
			t.Errorf("%s: %+v, %v, %v; want it to expire %s after it was processed", id, rec, ok, err, want)
		}
	}
	for _, d := range []time.Duration{time.Millisecond, -time.Hour} {
		if _, err := b.store.Process(ctx, "bad", charge("bad"), pgdedup.WithRetention(d)); !errors.Is(err, pgdedup.ErrInvalidOption) {
			t.Errorf("WithRetention(%s): %v, want ErrInvalidOption", d, err)
		}
	}
	margined, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "billing", LateMargin: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := margined.Process(ctx, "bad", charge("bad"), pgdedup.WithRetention(time.Minute)); !errors.Is(err, pgdedup.ErrInvalidOption) {
		t.Errorf("WithRetention not above LateMargin: %v, want ErrInvalidOption", err)
	}
	if recorded(t, b.pool, "billing", "bad") {
		t.Error("bad recorded")
	}
}

func TestLateMessageGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, pgdedup.Config{Retention: 10 * time.Hour, LateMargin: time.Hour})
	ctx := ctxT(t)
	now := time.Now()
	// Retention 10h minus LateMargin 1h: a message sent 9h ago is the last
	// one the guard lets through.
	if _, err := b.store.Process(ctx, "recent", charge("recent"), pgdedup.WithSentAt(now.Add(-8*time.Hour))); err != nil {
		t.Errorf("sent 8h ago: %v", err)
	}
	_, err := b.store.Process(ctx, "late", charge("late"), pgdedup.WithSentAt(now.Add(-9*time.Hour-time.Minute)))
	if !errors.Is(err, pgdedup.ErrTooLate) {
		t.Errorf("sent 9h01m ago: %v, want ErrTooLate", err)
	}
	if recorded(t, b.pool, "billing", "late") {
		t.Error("a late message was recorded")
	}
	// A longer per-message retention moves the guard.
	if _, err := b.store.Process(ctx, "late", charge("late"), pgdedup.WithSentAt(now.Add(-9*time.Hour-time.Minute)), pgdedup.WithRetention(24*time.Hour)); err != nil {
		t.Errorf("sent 9h01m ago with WithRetention(24h): %v", err)
	}
	// The default margin is a tenth of the Retention in force.
	plain, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "emails", Retention: 10 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Process(ctx, "m", charge("m"), pgdedup.WithSentAt(now.Add(-9*time.Hour-time.Minute))); !errors.Is(err, pgdedup.ErrTooLate) {
		t.Errorf("default margin, sent 9h01m ago: %v, want ErrTooLate", err)
	}
	if _, err := pgdedup.New(b.pool, pgdedup.Config{Consumer: "x", Retention: time.Hour, LateMargin: time.Hour}); err == nil {
		t.Error("New accepted LateMargin equal to Retention")
	}
}
