package pgdedup

import (
	"cmp"
	"fmt"
	"time"
)

// Option is a per-call option of [Store.Process], [Store.ProcessResult],
// [Store.Claim] and [Store.ClaimSQL]. Each of these calls takes
// [WithFingerprint], [WithRetention] and [WithSentAt]. Only ProcessResult
// takes [WithMaxResultBytes], and the others refuse it with
// [ErrInvalidOption]. A call without options sends the same statements as
// before options existed.
type Option func(*callOptions)

// callOptions are a call's options, once applied.
type callOptions struct {
	fingerprint  []byte        // nil for none
	retention    time.Duration // 0 for Config.Retention
	sentAt       time.Time     // zero for no late-message guard
	maxResult    int           // Config.MaxResultBytes unless maxResultSet
	maxResultSet bool
}

// callProcessResult names the one call that stores a result, and so the one
// that takes [WithMaxResultBytes].
const callProcessResult = "ProcessResult"

// MaxFingerprintLen is the longest fingerprint [WithFingerprint] accepts, in
// bytes.
const MaxFingerprintLen = 1024

// WithFingerprint stores fingerprint with the claim. A fingerprint is a
// digest of the message's payload, such as its SHA-256 (see
// [MessageIDFromContent]). Key it with an HMAC when payloads are guessable,
// such as a PIN or an amount. Otherwise whoever reads the table or a backup
// can hash every candidate and find the payload.
//
// A later delivery of the same ID whose fingerprint differs is not skipped as
// a duplicate. It returns a *[PayloadMismatchError], which matches
// [ErrPayloadMismatch], and is reported to [Config.OnEvent] as
// [EventPayloadMismatch]. The same ID with the same payload is a plain
// duplicate. A delivery without the option, or a duplicate of an ID recorded
// without one, is never a mismatch, because there is nothing to compare. A
// row past expires_at that the cleaner has not deleted yet is compared as any
// other. It needs migration 00006.
//
// fingerprint must hold 1 to [MaxFingerprintLen] bytes. An empty one, nil or
// not, returns [ErrInvalidOption] before anything is sent, since it would
// turn the comparison off unseen. To claim without a fingerprint, leave the
// option out.
func WithFingerprint(fingerprint []byte) Option {
	if fingerprint == nil {
		fingerprint = []byte{} // refused as empty, not taken for no option
	}
	return func(o *callOptions) { o.fingerprint = fingerprint }
}

// WithRetention makes the ID of this call expire after d instead of
// [Config.Retention]. Use it for a message that its broker keeps, and may
// redeliver, longer than most. d must be at least [MinRetention] and exceed
// [Config.LateMargin].
func WithRetention(d time.Duration) Option {
	return func(o *callOptions) { o.retention = d }
}

// WithSentAt gives the time the message was first sent. It turns on the
// late-message guard, and on the [LayoutPartitioned] table it bounds the
// claim: only the partitions from t less [Config.SentAtMargin] on are
// looked in and locked. The best time is one the producer sets once per ID,
// such as an event's own time or an outbox row's creation. A broker's
// timestamp, such as SQS SentTimestamp or a Kafka record's Timestamp, is
// safe if the producer's retries of one ID fall within SentAtMargin. A time
// more than SentAtMargin ahead of the consumer's clock returns
// [ErrInvalidOption]. A delivery older than the
// Retention in force minus [Config.LateMargin] returns [ErrTooLate] before
// anything is sent. By then the table may have forgotten an earlier delivery
// of the same ID, so processing it could run it twice.
//
// The age is measured on the consumer's clock (time.Now), so LateMargin must
// also cover the skew between it and the sender's clock. To process a late
// message anyway, call again without WithSentAt, perhaps with
// [WithRetention]. Or dead-letter it.
func WithSentAt(t time.Time) Option {
	return func(o *callOptions) { o.sentAt = t }
}

// WithMaxResultBytes makes n the longest result this [Store.ProcessResult]
// stores, instead of [Config.MaxResultBytes]. It suits a caller whose results
// are bounded by a limit of its own, such as the HTTP middleware's
// MaxStoredBody. A longer result fails the call with [ErrResultTooLarge],
// naming n. n must be positive. The other calls store no result, so they
// refuse the option with [ErrInvalidOption].
func WithMaxResultBytes(n int) Option {
	return func(o *callOptions) { o.maxResult, o.maxResultSet = n, true }
}

// callOptions applies opts to call and checks them against cfg, and the
// late-message guard, before anything is sent.
func (cfg Config) callOptions(call string, opts []Option) (callOptions, error) {
	var o callOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	switch {
	case o.fingerprint != nil && len(o.fingerprint) == 0:
		return o, fmt.Errorf("%w: WithFingerprint: empty fingerprint", ErrInvalidOption)
	case len(o.fingerprint) > MaxFingerprintLen:
		return o, fmt.Errorf("%w: WithFingerprint: %d bytes, longer than %d", ErrInvalidOption, len(o.fingerprint), MaxFingerprintLen)
	case o.maxResultSet && call != callProcessResult:
		return o, fmt.Errorf("%w: WithMaxResultBytes: %s stores no result, only ProcessResult does", ErrInvalidOption, call)
	case o.maxResultSet && o.maxResult <= 0:
		return o, fmt.Errorf("%w: WithMaxResultBytes(%d): must be positive", ErrInvalidOption, o.maxResult)
	case o.retention != 0 && o.retention < MinRetention:
		return o, fmt.Errorf("%w: WithRetention(%s): must be at least %s", ErrInvalidOption, o.retention, MinRetention)
	case o.retention != 0 && o.retention <= cfg.LateMargin:
		return o, fmt.Errorf("%w: WithRetention(%s): must exceed Config.LateMargin (%s)", ErrInvalidOption, o.retention, cfg.LateMargin)
	}
	if !o.sentAt.IsZero() {
		retention := cfg.Retention
		if o.retention != 0 {
			retention = o.retention
		}
		margin := cfg.LateMargin
		if margin == 0 {
			margin = retention / 10
		}
		age := time.Since(o.sentAt)
		if ahead := cmp.Or(cfg.SentAtMargin, DefaultSentAtMargin); -age > ahead {
			return o, fmt.Errorf("%w: WithSentAt(%s): %s ahead of this clock, more than Config.SentAtMargin (%s)",
				ErrInvalidOption, o.sentAt.Format(time.RFC3339Nano), (-age).Round(time.Millisecond), ahead)
		}
		if age > retention-margin {
			return o, fmt.Errorf("%w: sent %s ago (at %s), past the guard of %s (Retention %s minus LateMargin %s)",
				ErrTooLate, age.Round(time.Millisecond), o.sentAt.Format(time.RFC3339Nano), retention-margin, retention, margin)
		}
	}
	return o, nil
}
