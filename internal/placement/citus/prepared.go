package citus

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdedup/pgdedup/internal/shape"
)

// On a table Citus distributes, a claim whose transaction wrote to more
// than one node commits in two phases. The coordinator has every node
// PREPARE, commits its own part and sends COMMIT PREPARED. Only then does it
// release its locks, among them the claim's advisory lock, which sealing
// waits for. COMMIT PREPARED may fail, when a node restarts or a
// connection is cut. The coordinator commits all the same. The node keeps
// the claim's rows prepared, invisible, until Citus's recovery commits
// them, within citus.recover_2pc_interval (a minute by default). Sealing
// the claim's partition before then would let a redelivery look the ID up
// in the sealed partition, miss it, and be processed a second time. A
// transaction that wrote to one node commits it before the coordinator's
// own commit.
//
// So sealing waits for more once the claims' advisory locks are all free.
// It lists the transactions prepared on every node of the cluster that hold
// a lock on a shard of the table or of its partitions. Shards are named
// after them, so the parent's name, cut as partition names cut it, is
// their prefix. It waits for them to end. That wait is bounded as for the
// lockers, and a later run tries again. By then every claim that chose a
// partition before the switch has prepared on each node it wrote to,
// keeping its locks. pg_locks shows them under the virtual transaction
// holding its xid. So it is listed unless it has already ended. A claim
// ends on every node before the partition is sealed. A node that does not
// answer holds sealing up too, since nothing says its prepared
// transactions have ended. Other distributed transactions are not waited
// for. A busy cluster has some prepared for a moment all the time.

// WaitPrepared lists the prepared transactions holding a lock on the
// table's shards on every node of the Citus cluster. It waits up to d for
// all of them to end, polling. It returns those still open when it gave up,
// described for ErrCleanupStarved. A node it could not ask counts as one.
// schema and name are the table's, unquoted.
func (Partitioned) WaitPrepared(ctx context.Context, db shape.DB, table, schema, name string, d time.Duration) (open []string, err error) {
	listed, down, err := preparedOnNodes(ctx, db, table, schema, name)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; len(listed)+len(down) > 0; pause = min(2*pause, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			return append(listed, down...), nil
		}
		select {
		case <-ctx.Done():
			return append(listed, down...), ctx.Err()
		case <-time.After(pause):
		}
		var now []string
		if now, down, err = preparedOnNodes(ctx, db, table, schema, name); err != nil {
			return nil, err
		}
		// Only those listed first and still there count. A transaction
		// prepared since began after the lockers ended. So it is no claim
		// that sealing waits for.
		listed = slices.DeleteFunc(listed, func(p string) bool { return !slices.Contains(now, p) })
	}
	return nil, nil
}

// preparedOnNodes returns the prepared transactions holding a lock on a
// shard of the table, or of its partitions, on every node. Each is
// described as "prepared transaction GID on node N". down describes each
// node the coordinator could not ask. A shard is recognised by its name as
// unquoted regclass text, since shards may be hidden from pg_class queries.
func preparedOnNodes(ctx context.Context, db shape.DB, table, schema, name string) (prepared, down []string, err error) {
	prefix := name
	if len(prefix) > 30 {
		prefix = prefix[:30] // as partitionName cuts it
	}
	like := func(p string) string { return strings.NewReplacer(`\`, `\\`, `"`, ``).Replace(p) + "%" }
	rows, _ := db.Query(ctx, `SELECT nodeid, success, result FROM pg_catalog.run_command_on_all_nodes(pg_catalog.format(
'SELECT coalesce(pg_catalog.json_agg(DISTINCT p.gid), ''[]'') FROM pg_catalog.pg_prepared_xacts p
JOIN pg_catalog.pg_locks x ON x.locktype OPERATOR(pg_catalog.=) ''transactionid'' AND x.transactionid OPERATOR(pg_catalog.=) p.transaction AND x.pid IS NULL
JOIN pg_catalog.pg_locks l ON l.virtualtransaction OPERATOR(pg_catalog.=) x.virtualtransaction
WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database() AND l.locktype OPERATOR(pg_catalog.=) ''relation''
AND pg_catalog.replace(l.relation::pg_catalog.regclass::pg_catalog.text, ''"'', '''') LIKE ANY (ARRAY[%L, %L])', $1::text, $2::text))`,
		like(schema+"."+prefix), like(prefix))
	var node int32
	var ok bool
	var result string
	_, err = pgx.ForEachRow(rows, []any{&node, &ok, &result}, func() error {
		var gids []string
		if !ok || json.Unmarshal([]byte(result), &gids) != nil {
			down = append(down, fmt.Sprintf("node %d did not answer: %s", node, result))
			return nil
		}
		for _, gid := range gids {
			prepared = append(prepared, fmt.Sprintf("prepared transaction %q on node %d", gid, node))
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("pgdedup: partitions of %s: list prepared transactions: %w", table, shape.WithDetail(err))
	}
	return prepared, down, nil
}

// PreparedStarved is the error of sealing held up by prepared transactions,
// due since due.
func (Partitioned) PreparedStarved(table string, due time.Time, prepared []string) error {
	return fmt.Errorf("%w: sealing the partitions of %s, due since %s, is held up by %s, which may hold a claim "+
		"that two-phase commit has not finished on that node: Citus's recovery ends them (recover_prepared_transactions()); "+
		"until they end, each claim inserts into one more partition per span",
		shape.ErrCleanupStarved, table, due.UTC().Format(time.RFC3339), strings.Join(prepared, ", "))
}
