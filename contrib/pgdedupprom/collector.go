// Package pgdedupprom exports what `pgdedup stats` reads to Prometheus. It
// reads rows per consumer, expired rows, the oldest row and the table's size
// from [pgdedup.Store.Stats]. With them a stuck cleanup can be alerted on. The
// duplicate rate comes from the messages counters of pgdedupotel (see
// docs/integrations.md in the repository for both). alerts.yml beside this
// file holds alerting rules over both, dashboard.json a Grafana dashboard.
//
//	store, _ := pgdedup.New(pool, pgdedup.Config{Consumer: "billing"})
//	prometheus.MustRegister(pgdedupprom.NewCollector(store, pgdedupprom.Options{}))
//
// Each metric has the label table, the dedup table as in Config.Table.
//
//	pgdedup_stats_up                               1 if the last read of the stats succeeded, else 0 (and no other series)
//	pgdedup_rows{consumer}                         rows held
//	pgdedup_expired_rows{consumer}                 rows past expires_at, which the next cleanup deletes
//	pgdedup_oldest_processed_timestamp_seconds{consumer}   the oldest row's processed_at, Unix time
//	pgdedup_next_expiry_timestamp_seconds{consumer}        the earliest expires_at still ahead (absent when all have expired)
//	pgdedup_table_size_bytes                       heap, TOAST and maps (pg_table_size)
//	pgdedup_indexes_size_bytes                     all indexes (pg_indexes_size)
//	pgdedup_index_size_bytes{index,method}         each index
//	pgdedup_dead_tuples                            rows deleted and not yet reclaimed by vacuum (n_dead_tup)
//	pgdedup_last_vacuum_timestamp_seconds          last manual vacuum, Unix time (absent if never)
//	pgdedup_last_autovacuum_timestamp_seconds      last autovacuum, Unix time (absent if never)
//	pgdedup_partition_runway_seconds               seconds until claims find no partition (partitioned layout only)
//
// On a Citus-distributed table the sizes are the shards' total. The dead
// tuples read 0 and the vacuum and per-index series are absent. Stats leaves
// them empty because the shards are vacuumed on the workers.
package pgdedupprom

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgdedup/pgdedup"
)

// Options tune a [Collector]. The zero value reads the stats at most once a
// minute ([DefaultMaxAge]), with a 10 s timeout.
type Options struct {
	// Timeout bounds one read of the stats. Defaults to 10s.
	Timeout time.Duration

	// MaxAge lets a scrape reuse a read younger than this instead of counting
	// the table again, so the values lag by up to MaxAge. A negative MaxAge
	// reads on every scrape. Defaults to [DefaultMaxAge].
	MaxAge time.Duration

	// Logger receives a warning for each failed read. Defaults to discarding.
	Logger *slog.Logger
}

const defaultTimeout = 10 * time.Second

// DefaultMaxAge is [Options.MaxAge] when left zero. The table is read once a
// minute, however often and by however many servers it is scraped. Stats
// reads every row in one sequential scan, which takes seconds on tens of
// millions, and every Prometheus server that scrapes the service (two, in a
// highly available pair) would start one. The alerts this collector serves
// (expired rows piling up over many minutes, a table growing over hours) do
// not notice a minute's lag.
const DefaultMaxAge = time.Minute

// Collector is a [prometheus.Collector] of a Store's table stats. It is safe
// for concurrent use. Scrapes read one at a time, and with Options.MaxAge a
// scrape that waited for another's read reuses it.
type Collector struct {
	store *pgdedup.Store
	opts  Options

	up, rows, expired, oldest, nextExpiry, tableBytes, indexBytes *prometheus.Desc
	indexSize, deadTuples, lastVacuum, lastAutovacuum, runway     *prometheus.Desc

	mu     sync.Mutex // held during a read, so concurrent scrapes wait for it
	last   pgdedup.Stats
	lastAt time.Time
	ok     bool
}

// NewCollector returns a Collector of store's table, which covers every
// consumer in it (not only the Store's). Register it once per table.
func NewCollector(store *pgdedup.Store, opts Options) *Collector {
	if opts.Timeout <= 0 {
		opts.Timeout = defaultTimeout
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = DefaultMaxAge
	}
	table := prometheus.Labels{"table": strings.ReplaceAll(store.Table(), `"`, "")} // Config.Table names are plain identifiers, with no quotes inside
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("pgdedup_"+name, help, labels, table)
	}
	return &Collector{
		store:          store,
		opts:           opts,
		up:             desc("stats_up", "1 if the last read of the dedup table's stats succeeded, else 0."),
		rows:           desc("rows", "Rows in the dedup table, per consumer.", "consumer"),
		expired:        desc("expired_rows", "Rows past their expires_at, per consumer: the next cleanup deletes them.", "consumer"),
		oldest:         desc("oldest_processed_timestamp_seconds", "processed_at of the consumer's oldest row, Unix time.", "consumer"),
		nextExpiry:     desc("next_expiry_timestamp_seconds", "Earliest expires_at still ahead among the consumer's rows, Unix time.", "consumer"),
		tableBytes:     desc("table_size_bytes", "Size of the dedup table: heap, TOAST and maps (pg_table_size)."),
		indexBytes:     desc("indexes_size_bytes", "Size of the dedup table's indexes (pg_indexes_size)."),
		indexSize:      desc("index_size_bytes", "Size of one index of the dedup table.", "index", "method"),
		deadTuples:     desc("dead_tuples", "Rows deleted from the dedup table and not yet reclaimed by vacuum (pg_stat_user_tables.n_dead_tup, an estimate)."),
		lastVacuum:     desc("last_vacuum_timestamp_seconds", "When the dedup table was last vacuumed by hand, Unix time."),
		lastAutovacuum: desc("last_autovacuum_timestamp_seconds", "When autovacuum last vacuumed the dedup table, Unix time."),
		runway: desc("partition_runway_seconds", "Partitioned layout: seconds until claims find no partition, "+
			"from now to the end of the last partition Cleanup created. It falls when the cleaner stops."),
	}
}

// Describe sends the descriptors of every metric the Collector can send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.rows, c.expired, c.oldest, c.nextExpiry, c.tableBytes, c.indexBytes,
		c.indexSize, c.deadTuples, c.lastVacuum, c.lastAutovacuum, c.runway} {
		ch <- d
	}
}

// Collect reads the stats (or reuses a read younger than Options.MaxAge) and
// sends them. A failed read sends pgdedup_stats_up 0 and nothing else, so the
// scrape itself succeeds and the failure can be alerted on.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.read()
	if !ok {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for _, cs := range st.Consumers {
		ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, float64(cs.Rows), cs.Consumer)
		ch <- prometheus.MustNewConstMetric(c.expired, prometheus.GaugeValue, float64(cs.ExpiredRows), cs.Consumer)
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, unix(cs.OldestProcessedAt), cs.Consumer)
		if cs.NextExpiry != nil {
			ch <- prometheus.MustNewConstMetric(c.nextExpiry, prometheus.GaugeValue, unix(*cs.NextExpiry), cs.Consumer)
		}
	}
	if st.PartitionRunway != nil {
		// From now, not from the read's time, so a reused read stays right.
		end := st.Now.Add(*st.PartitionRunway)
		ch <- prometheus.MustNewConstMetric(c.runway, prometheus.GaugeValue, max(time.Until(end), 0).Seconds())
	}
	ch <- prometheus.MustNewConstMetric(c.tableBytes, prometheus.GaugeValue, float64(st.TableBytes))
	ch <- prometheus.MustNewConstMetric(c.indexBytes, prometheus.GaugeValue, float64(st.IndexBytes))
	for _, ix := range st.Indexes {
		ch <- prometheus.MustNewConstMetric(c.indexSize, prometheus.GaugeValue, float64(ix.Bytes), ix.Name, ix.Method)
	}
	ch <- prometheus.MustNewConstMetric(c.deadTuples, prometheus.GaugeValue, float64(st.DeadTuples))
	if st.LastVacuum != nil {
		ch <- prometheus.MustNewConstMetric(c.lastVacuum, prometheus.GaugeValue, unix(*st.LastVacuum))
	}
	if st.LastAutovacuum != nil {
		ch <- prometheus.MustNewConstMetric(c.lastAutovacuum, prometheus.GaugeValue, unix(*st.LastAutovacuum))
	}
}

func (c *Collector) read() (pgdedup.Stats, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok && c.opts.MaxAge > 0 && time.Since(c.lastAt) < c.opts.MaxAge {
		return c.last, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	st, err := c.store.Stats(ctx)
	c.last, c.lastAt, c.ok = st, time.Now(), err == nil
	if err != nil && c.opts.Logger != nil {
		c.opts.Logger.Warn("pgdedupprom: read stats", "table", c.store.Table(), "error", err)
	}
	return st, err == nil
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
