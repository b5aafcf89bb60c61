package pgdedupotel

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgdedup/pgdedup"
)

// ScopeName is the instrumentation scope of the meter and tracer.
const ScopeName = "github.com/pgdedup/pgdedup/contrib/pgdedupotel"

// Attribute keys this package sets. The consumer and operation keys are the
// semantic conventions' own.
const (
	AttrConsumer   = attribute.Key("messaging.consumer.group.name") // pgdedup.Config.Consumer
	AttrOperation  = attribute.Key("messaging.operation.name")      // process, process_batch
	AttrOutcome    = attribute.Key("pgdedup.outcome")               // processed, duplicate, in_flight, and on spans also error
	AttrErrorType  = attribute.Key("error.type")                    // SQLSTATE, connection, canceled, timeout, cleanup_starved or _OTHER
	AttrMessageID  = attribute.Key("messaging.message.id")          // spans of Process only
	AttrBatchCount = attribute.Key("messaging.batch.message_count") // spans of ProcessBatch only
	AttrFreshCount = attribute.Key("pgdedup.fresh_count")           // how many IDs were new, on spans of ProcessBatch only
)

// Config says where measurements and spans go. The zero value uses the global
// providers.
type Config struct {
	// MeterProvider creates the meter of OnEvent. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// TracerProvider creates the tracer of Trace. Defaults to
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider

	// Attributes are added to every measurement and span, such as
	// messaging.system ("rabbitmq", "kafka"), which the conventions require
	// and pgdedup cannot know. Keep them low-cardinality. Defaults to none.
	Attributes []attribute.KeyValue
}

// durationBuckets are the boundaries the conventions recommend for messaging
// durations, in seconds.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

type metrics struct {
	attrs           []attribute.KeyValue
	messages        metric.Int64Counter
	processDuration metric.Float64Histogram
	retries         metric.Int64Counter
	cleanupDeleted  metric.Int64Counter
	cleanupDuration metric.Float64Histogram
}

// OnEvent returns a function for [pgdedup.Config.OnEvent] that records each
// event as the metrics listed in the package documentation. It is safe for
// concurrent use and does not block. One function may serve several Stores,
// because each event carries its Store's consumer.
func OnEvent(cfg Config) (func(context.Context, pgdedup.Event), error) {
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	m := &metrics{attrs: cfg.Attributes}
	var err, e error
	m.messages, e = meter.Int64Counter("pgdedup.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages that reached a claim, by outcome: processed (committed), duplicate (skipped), in_flight (given up after LockTimeout)."))
	err = errors.Join(err, e)
	m.processDuration, e = meter.Float64Histogram("messaging.process.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a processing transaction that committed: BEGIN and claim, fn, COMMIT."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	m.retries, e = meter.Int64Counter("pgdedup.retries", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts of Process or ProcessBatch that failed transiently and were retried."))
	err = errors.Join(err, e)
	m.cleanupDeleted, e = meter.Int64Counter("pgdedup.cleanup.deleted", metric.WithUnit("{row}"),
		metric.WithDescription("Expired rows deleted by Cleanup, of every consumer; attributed to the Store that ran it."))
	err = errors.Join(err, e)
	m.cleanupDuration, e = meter.Float64Histogram("pgdedup.cleanup.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of Cleanup runs."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	return m.record, nil
}

func (m *metrics) record(ctx context.Context, e pgdedup.Event) {
	consumer := AttrConsumer.String(e.Consumer)
	switch e.Kind {
	case pgdedup.EventProcessed:
		m.messages.Add(ctx, e.Count, m.with(consumer, AttrOutcome.String("processed")))
		op := "process"
		if e.MessageID == "" { // batches carry no single ID
			op = "process_batch"
		}
		m.processDuration.Record(ctx, e.Duration.Seconds(), m.with(consumer, AttrOperation.String(op)))
	case pgdedup.EventDuplicate:
		m.messages.Add(ctx, e.Count, m.with(consumer, AttrOutcome.String("duplicate")))
	case pgdedup.EventInFlight:
		m.messages.Add(ctx, e.Count, m.with(consumer, AttrOutcome.String("in_flight")))
	case pgdedup.EventRetry:
		m.retries.Add(ctx, 1, m.with(consumer, AttrErrorType.String(errorType(e.Err))))
		// Inside a span of Trace (or any), the retry shows on the timeline.
		trace.SpanFromContext(ctx).AddEvent("pgdedup.retry", trace.WithAttributes(
			attribute.Int("pgdedup.attempt", e.Attempt), AttrErrorType.String(errorType(e.Err))))
	case pgdedup.EventCleanup:
		m.cleanupDeleted.Add(ctx, e.Count, m.with(consumer))
		if e.Err != nil {
			m.cleanupDuration.Record(ctx, e.Duration.Seconds(), m.with(consumer, AttrErrorType.String(errorType(e.Err))))
		} else {
			m.cleanupDuration.Record(ctx, e.Duration.Seconds(), m.with(consumer))
		}
	}
}

func (m *metrics) with(kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append(kv, m.attrs...)...)
}

// errorType is the low-cardinality error.type of err. It is the SQLSTATE when
// Postgres sent one, else a class.
func errorType(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, pgdedup.ErrInFlight):
		return "in_flight"
	case errors.Is(err, pgdedup.ErrInvalidMessageID):
		return "invalid_message_id"
	case errors.Is(err, pgdedup.ErrCleanupStarved):
		return "cleanup_starved"
	case errors.As(err, &pgErr):
		return pgErr.Code
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case pgdedup.IsTransient(err):
		return "connection"
	}
	return "_OTHER"
}
