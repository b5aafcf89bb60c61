package pgdedupotel

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgdedup/pgdedup"
)

// Store is a [pgdedup.Store] whose Process and ProcessBatch each run in a span.
// Every other method is the embedded Store's. fn runs inside the span, so the
// spans of its own queries (from a pgx tracer, for instance) are its children.
type Store struct {
	*pgdedup.Store
	tracer trace.Tracer
	attrs  []attribute.KeyValue
}

// Trace returns s with spans around Process and ProcessBatch, created by
// cfg.TracerProvider. The span of Process is named "pgdedup.Process", of kind
// internal (it runs inside the broker's own process span, if any). Its
// pgdedup.outcome says how the call ended, as processed, duplicate, in_flight
// or error. On an error its status is Error, with error.type and the error
// recorded. ProcessBatch's span, "pgdedup.ProcessBatch", also carries the
// batch size and how many IDs were fresh. A retried attempt shows as a span
// event when the Store's OnEvent comes from [OnEvent].
func Trace(s *pgdedup.Store, cfg Config) *Store {
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	attrs := append([]attribute.KeyValue{AttrConsumer.String(s.Consumer())}, cfg.Attributes...)
	return &Store{Store: s, tracer: tp.Tracer(ScopeName), attrs: attrs}
}

// Process is [pgdedup.Store.Process] in a span.
func (s *Store) Process(ctx context.Context, messageID string, fn func(ctx context.Context, tx pgx.Tx) error) (processed bool, err error) {
	ctx, span := s.start(ctx, "pgdedup.Process", AttrMessageID.String(messageID))
	defer func() { end(span, recover(), err, outcome(processed, err)) }()
	return s.Store.Process(ctx, messageID, fn)
}

// ProcessBatch is [pgdedup.Store.ProcessBatch] in a span.
func (s *Store) ProcessBatch(ctx context.Context, messageIDs []string, fn func(ctx context.Context, tx pgx.Tx, fresh []string) error) (fresh []string, err error) {
	ctx, span := s.start(ctx, "pgdedup.ProcessBatch", AttrBatchCount.Int(len(messageIDs)))
	defer func() {
		span.SetAttributes(AttrFreshCount.Int(len(fresh)))
		end(span, recover(), err, outcome(len(fresh) > 0, err))
	}()
	return s.Store.ProcessBatch(ctx, messageIDs, fn)
}

func (s *Store) start(ctx context.Context, name string, kv attribute.KeyValue) (context.Context, trace.Span) {
	return s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(s.attrs...), trace.WithAttributes(kv))
}

func outcome(processed bool, err error) string {
	switch {
	case err != nil && errorType(err) == "in_flight":
		return "in_flight"
	case err != nil:
		return "error"
	case processed:
		return "processed"
	}
	return "duplicate"
}

// end ends span with the call's outcome. A panic from fn is marked on the
// span, which is ended, and continues.
func end(span trace.Span, panicked any, err error, outcome string) {
	defer span.End()
	if panicked != nil {
		span.SetAttributes(AttrOutcome.String("error"), AttrErrorType.String("panic"))
		span.SetStatus(codes.Error, fmt.Sprint("panic: ", panicked))
		panic(panicked) // span.End runs first, deferred
	}
	span.SetAttributes(AttrOutcome.String(outcome))
	if err != nil {
		span.SetAttributes(AttrErrorType.String(errorType(err)))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}
