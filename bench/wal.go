package main

import (
	"context"
)

// walMeter measures the WAL that a run of messages wrote.
//
// With the pg_walinspect extension (PostgreSQL 15 contrib; created inside the
// run's schema, so dropping the schema removes it) it sums the WAL records
// whose transaction wrote one of the new ledger rows: exactly the messages'
// own WAL, full-page images included, whatever other sessions write at the
// same time. Without it, it takes the difference of pg_current_wal_insert_lsn,
// which counts every session's WAL; account keeps the smallest of several
// repetitions then.
type walMeter struct {
	b        *bench
	inspect  bool   // pg_walinspect is usable
	startLSN string // where the measured run started
	lastID   int64  // the last ledger row before it
}

// newWALMeter creates pg_walinspect in the run's schema if it can.
func newWALMeter(ctx context.Context, b *bench) *walMeter {
	_, err := b.admin.Exec(ctx, "CREATE EXTENSION pg_walinspect SCHEMA "+b.schema)
	return &walMeter{b: b, inspect: err == nil}
}

// method says how the WAL was measured, for the report.
func (m *walMeter) method() string {
	if m.inspect {
		return "pg_walinspect, the messages' own transactions"
	}
	return "pg_current_wal_insert_lsn() difference, all sessions, smallest of the repetitions"
}

func (m *walMeter) start(ctx context.Context) error {
	return m.b.admin.QueryRow(ctx,
		`SELECT pg_current_wal_insert_lsn()::text, coalesce((SELECT max(id) FROM ledger), 0)`).Scan(&m.startLSN, &m.lastID)
}

// stop returns the WAL bytes written since start, and how many of them were
// full-page images (0 when not known).
func (m *walMeter) stop(ctx context.Context) (bytes, fpi int64, err error) {
	if !m.inspect {
		err = m.b.admin.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - $1::pg_lsn)::bigint`, m.startLSN).Scan(&bytes)
		return bytes, 0, err
	}
	// Nothing flushed since start (the duplicate path writes no WAL):
	// pg_walinspect refuses a range that ends where it starts.
	var flushed bool
	err = m.b.admin.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn() > $1::pg_lsn`, m.startLSN).Scan(&flushed)
	if err != nil || !flushed {
		return 0, 0, err
	}
	err = m.b.admin.QueryRow(ctx, `SELECT coalesce(sum(record_length), 0)::bigint, coalesce(sum(fpi_length), 0)::bigint
FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())
WHERE xid IN (SELECT xmin FROM ledger WHERE id > $2)`, m.startLSN, m.lastID).Scan(&bytes, &fpi)
	return bytes, fpi, err
}
