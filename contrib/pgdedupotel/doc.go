// Package pgdedupotel reports what pgdedup does to OpenTelemetry. [OnEvent]
// turns [pgdedup.Config.OnEvent] into metrics, and [Trace] puts a span around
// each Process and ProcessBatch call.
//
//	onEvent, err := pgdedupotel.OnEvent(pgdedupotel.Config{})
//	store, err := pgdedup.New(pool, pgdedup.Config{Consumer: "billing", OnEvent: onEvent})
//	traced := pgdedupotel.Trace(store, pgdedupotel.Config{})
//	processed, err := traced.Process(ctx, msg.ID, fn) // in a span "pgdedup.Process"
//
// # Metrics
//
// Every measurement carries messaging.consumer.group.name, the Store's
// [pgdedup.Config.Consumer], plus [Config.Attributes].
//
//	name                        instrument          unit        attributes
//	pgdedup.messages            Int64Counter        {message}   pgdedup.outcome (processed, duplicate, in_flight)
//	messaging.process.duration  Float64Histogram    s           messaging.operation.name (process, process_batch)
//	pgdedup.retries             Int64Counter        {attempt}   error.type (the SQLSTATE, or connection)
//	pgdedup.cleanup.deleted     Int64Counter        {row}
//	pgdedup.cleanup.duration    Float64Histogram    s           error.type when the run failed (cleanup_starved for ErrCleanupStarved)
//
// The duplicate ratio is pgdedup.messages with outcome duplicate over all
// outcomes. The pattern's rule of thumb is that above 50% something upstream
// is wrong (a producer retrying too eagerly, a consumer too slow to ack).
// Names follow the OpenTelemetry semantic conventions for messaging where one
// applies. docs/integrations.md in the repository says where and why they
// deviate.
package pgdedupotel
