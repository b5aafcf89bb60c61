#!/usr/bin/env bash
# Start (installing if missing) the services the tests need. Sourced by .ci/run;
# each function is idempotent and fails loudly if its service cannot answer.
set -euo pipefail

apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
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
