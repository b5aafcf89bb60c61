#!/usr/bin/env bash
# The Citus cluster of pgdedup's tests (sourced by .ci/run, or run as a script):
# Citus built and installed from ../shared/citus (skipped when installed, which
# is the cache on a reused machine), started by its start.sh (coordinator 9700,
# workers 9701 and 9702), then adjusted for the scale-out test:
#   - wal_level = logical on every node, which non-blocking shard moves need
#     (citus_rebalance_start with shard_transfer_mode force_logical);
#   - citus.recover_2pc_interval = 1s, so that a two-phase commit cut by a
#     worker's crash is resolved within a second of the worker's return
#     instead of a minute;
#   - a third worker on 9703, started but not in the cluster: the test adds it.
# Idempotent: a node already set up is left as it is.
#
#   .ci/citus.sh          build if missing, start, adjust
#   .ci/citus.sh stop     stop the four nodes (data kept)
set -euo pipefail

CITUS_SHARED=${CITUS_SHARED:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/shared/citus}
[[ -d $CITUS_SHARED ]] || CITUS_SHARED=/work/shared/citus
export CITUS_BASE=${CITUS_BASE:-${TMPDIR:-/tmp}/pgdedup-citus}
# Where the tests find the cluster once start_citus ran (.ci/run starts it in
# a background subshell, so the stages after it read these from here).
export TEST_CITUS_URL='postgres://postgres@127.0.0.1:9700/postgres?sslmode=disable'
export TEST_CITUS_SPARE_WORKER=127.0.0.1:9703
export TEST_CITUS_WORKER_PGDATA=$CITUS_BASE/worker1
CITUS_BIN=/usr/lib/postgresql/15/bin

citus_as_pg() { runuser -u postgres -- "$@"; }
citus_psql() { local port=$1; shift; PGOPTIONS="-c client_min_messages=warning" citus_as_pg "$CITUS_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"; }

# citus_logical PORT DIR: wal_level logical on a running node, restarting it if needed.
citus_logical() {
  local port=$1 dir=$2
  if [[ $(citus_psql "$port" -c 'SHOW wal_level') != logical ]]; then
    citus_psql "$port" -c "ALTER SYSTEM SET wal_level = logical"
    citus_as_pg "$CITUS_BIN/pg_ctl" -D "$dir" -l "$CITUS_BASE/$(basename "$dir").log" -w -t 60 restart -m fast >/dev/null
  fi
}

start_citus() {
  echo "ci: Citus (build if missing, from $CITUS_SHARED)"
  bash "$CITUS_SHARED/build.sh"
  bash "$CITUS_SHARED/start.sh" >/dev/null
  citus_logical 9701 "$CITUS_BASE/worker1"
  citus_logical 9702 "$CITUS_BASE/worker2"
  citus_logical 9700 "$CITUS_BASE/coord"
  if [[ $(citus_psql 9700 -c 'SHOW citus.recover_2pc_interval') != 1s ]]; then
    citus_psql 9700 -c "ALTER SYSTEM SET citus.recover_2pc_interval = '1s'" -c "SELECT pg_reload_conf()" >/dev/null
  fi

  # The spare worker, configured like start.sh's.
  local dir=$CITUS_BASE/worker3
  if [[ ! -f $dir/PG_VERSION ]]; then
    rm -rf "$dir"
    citus_as_pg "$CITUS_BIN/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$CITUS_BASE/initdb-worker3.log"
    cat >>"$dir/postgresql.conf" <<EOF

# --- pgdedup test cluster: spare worker for the scale-out test ---
port = 9703
listen_addresses = '127.0.0.1'
unix_socket_directories = '$CITUS_BASE/sock'
shared_preload_libraries = 'citus'
max_connections = 300
max_prepared_transactions = 300
shared_buffers = 128MB
wal_level = logical
logging_collector = off
log_min_messages = warning
EOF
    cp "$CITUS_BASE/worker1/pg_hba.conf" "$dir/pg_hba.conf"
  fi
  if ! citus_as_pg "$CITUS_BIN/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    citus_as_pg "$CITUS_BIN/pg_ctl" -D "$dir" -l "$CITUS_BASE/worker3.log" -w -t 60 start >/dev/null
  fi
  citus_psql 9703 -c "CREATE EXTENSION IF NOT EXISTS citus"
  # A previous run that stopped half-way may have left it in the cluster.
  if [[ $(citus_psql 9700 -c "SELECT count(*) FROM pg_dist_node WHERE nodeport = 9703") != 0 ]]; then
    citus_psql 9700 -c "SELECT citus_drain_node('127.0.0.1', 9703)" -c "SELECT citus_remove_node('127.0.0.1', 9703)" >/dev/null
  fi
  # Test schemas a killed run left behind: the scale-out test's rebalance
  # would move their shards too.
  citus_psql 9700 -c "DO \$\$ DECLARE s text; BEGIN
    FOR s IN SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgdedup\_%' LOOP
      EXECUTE format('DROP SCHEMA %I CASCADE', s);
    END LOOP; END \$\$" >/dev/null
  export TEST_CITUS_URL='postgres://postgres@127.0.0.1:9700/postgres?sslmode=disable'
  export TEST_CITUS_SPARE_WORKER=127.0.0.1:9703
  export TEST_CITUS_WORKER_PGDATA=$CITUS_BASE/worker1
}

stop_citus() {
  bash "$CITUS_SHARED/stop.sh" || true
  local dir=$CITUS_BASE/worker3
  if [[ -f $dir/PG_VERSION ]] && citus_as_pg "$CITUS_BIN/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    citus_as_pg "$CITUS_BIN/pg_ctl" -D "$dir" -m fast -w -t 60 stop
  fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  case ${1:-start} in
  start) start_citus ;;
  stop) stop_citus ;;
  *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
  esac
fi
