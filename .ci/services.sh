#!/usr/bin/env bash
# Start (installing if missing) the services the tests need. Sourced by .ci/run;
# each function is idempotent and fails loudly if its service cannot answer.
set -euo pipefail

apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then apt-get -o DPkg::Lock::Timeout=600 update -qq; apt_updated=1; fi
  # The Citus build (.ci/run) may hold dpkg's lock meanwhile: wait for it.
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >/dev/null
}

wait_for() { # name, command...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "ci: $name does not answer" >&2
  return 1
}

start_postgres() {
  if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    echo "ci: installing PostgreSQL"
    apt_install postgresql postgresql-contrib
  fi
  local ver
  ver=$(ls /etc/postgresql | sort -V | tail -n1)
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "ci: starting PostgreSQL $ver"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  fi
  wait_for PostgreSQL pg_isready -q -h 127.0.0.1 -p 5432
  # Trust auth for local TCP, as on the dev machines; the test database exists.
  if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc 'select 1' >/dev/null 2>&1; then
    local hba="/etc/postgresql/$ver/main/pg_hba.conf"
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all all trust' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
    wait_for "PostgreSQL (trust)" psql -h 127.0.0.1 -U postgres -d postgres -tAc 'select 1'
  fi
  psql -h 127.0.0.1 -U postgres -d postgres -tAc "select 1 from pg_database where datname='test'" | grep -q 1 ||
    psql -h 127.0.0.1 -U postgres -d postgres -c 'create database test' >/dev/null
}

start_redis() {
  command -v redis-server >/dev/null || apt_install redis-server
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
  fi
  wait_for Redis redis-cli -h 127.0.0.1 -p 6379 ping
}

start_rabbitmq() {
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  if ! rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
    rabbitmq-server -detached
  fi
  wait_for RabbitMQ rabbitmq-diagnostics -q check_port_connectivity
}

# NATS with JetStream on 127.0.0.1:4222, for examples/nats. The server's INFO
# line says whether JetStream is on; a server without it is an error, not
# something to restart behind the back of whoever started it.
NATS_DIR=${NATS_DIR:-/tmp/pgdedup-ci-nats}
nats_info() { timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/4222 && head -n1 <&3'; }
start_nats() {
  command -v nats-server >/dev/null || apt_install nats-server
  if ! nats_info >/dev/null 2>&1; then
    mkdir -p "$NATS_DIR"
    echo "ci: starting nats-server -js on 127.0.0.1:4222 (store $NATS_DIR)"
    setsid nats-server -a 127.0.0.1 -p 4222 -js -sd "$NATS_DIR" -l "$NATS_DIR/nats-server.log" </dev/null >/dev/null 2>&1 &
  fi
  wait_for NATS nats_info
  nats_info | grep -q '"jetstream":true' || { echo "ci: the NATS server on 127.0.0.1:4222 has JetStream off (start it with -js)" >&2; return 1; }
}

# PgBouncer in transaction pooling mode on 127.0.0.1:6432, in front of the
# Postgres on 127.0.0.1:5432, for the second test pass (see .ci/run).
# Any role may log in: auth_type=trust, and roles missing from the auth file are
# looked up with auth_query as postgres, so the per-test roles pgtest creates
# (TEST_PGBOUNCER=1) connect without a reload. Idle server connections close
# after 10 s and at most 50 are open, because every test role gets its own pool
# and the shared Postgres allows 100.
PGBOUNCER_DIR=${PGBOUNCER_DIR:-/tmp/pgdedup-ci-pgbouncer}
start_pgbouncer() {
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || apt_install pgbouncer
  if pg_isready -q -h 127.0.0.1 -p 6432; then return 0; fi
  mkdir -p "$PGBOUNCER_DIR"
  cat >"$PGBOUNCER_DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 6432
unix_socket_dir =
pool_mode = transaction
auth_type = trust
auth_file = $PGBOUNCER_DIR/userlist.txt
auth_user = postgres
auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename = \$1
admin_users = postgres
max_client_conn = 1000
default_pool_size = 20
max_db_connections = 50
server_idle_timeout = 10
logfile = $PGBOUNCER_DIR/pgbouncer.log
pidfile = $PGBOUNCER_DIR/pgbouncer.pid
INI
  echo '"postgres" ""' >"$PGBOUNCER_DIR/userlist.txt"
  echo "ci: starting PgBouncer (transaction pooling) on 127.0.0.1:6432"
  if [ "$(id -u)" = 0 ]; then # PgBouncer refuses to run as root
    chown -R postgres "$PGBOUNCER_DIR"
    /usr/sbin/pgbouncer -d -u postgres "$PGBOUNCER_DIR/pgbouncer.ini"
  else
    /usr/sbin/pgbouncer -d "$PGBOUNCER_DIR/pgbouncer.ini"
  fi
  wait_for PgBouncer psql -h 127.0.0.1 -p 6432 -U postgres -d test -tAc 'select 1'
}

stop_pgbouncer() {
  local pid
  pid=$(cat "$PGBOUNCER_DIR/pgbouncer.pid" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null || true
}
