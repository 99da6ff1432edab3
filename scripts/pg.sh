#!/usr/bin/env bash
# Start (or reuse) a throw-away PostgreSQL server for the test suite and print its SQLAlchemy URL.
#
# Idempotent: the first run initdb's a cluster under ./var/pg (owned by the `postgres` system user,
# because the server refuses to run as root), later runs find it already running and only print
# the URL.  The server listens on 127.0.0.1 only, with trust authentication: it holds test data
# and nothing else.  Stop it with `scripts/pg.sh stop`.
#
#   export TXMSG_TEST_PG_URL=$(scripts/pg.sh)      # -> postgresql+psycopg://postgres@127.0.0.1:25432/txmsg_test
#
# Environment: TXMSG_PG_PORT (default: 25432, or the next free port up to 25452 when something else
# listens there), TXMSG_PG_DIR (default ./var/pg), TXMSG_PG_DB (txmsg_test).
set -euo pipefail
cd "$(dirname "$0")/.."

# below 32768: outside Linux's ephemeral port range, so no client socket can be holding it
PORT=${TXMSG_PG_PORT:-25432}
BASE=${TXMSG_PG_DIR:-$PWD/var/pg}
DB=${TXMSG_PG_DB:-txmsg_test}
DATA=$BASE/data
LOG=$BASE/server.log

say() { echo "[pg] $*" >&2; }

BIN=""
for d in /usr/lib/postgresql/*/bin; do
  [ -x "$d/initdb" ] && BIN=$d
done
if [ -z "$BIN" ]; then
  say "no PostgreSQL server found under /usr/lib/postgresql/*/bin; install it with: apt-get install postgresql"
  exit 2
fi

# Run a command as the postgres user when we are root (initdb/postgres refuse root), else as ourselves.
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# The postgres user must be able to reach $BASE: every parent needs o+x.  A checkout under a 0700
# directory (root's home, a mktemp -d) does not give it: use a directory of its own under /tmp for
# this checkout instead (the same one for start and stop), unless the user chose one.
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$BASE"
  if ! as_pg test -x "$BASE"; then
    if [ -n "${TXMSG_PG_DIR:-}" ]; then
      say "the postgres user cannot reach TXMSG_PG_DIR=$BASE (a parent directory lacks o+x); choose another"
      exit 1
    fi
    BASE=${TMPDIR:-/tmp}/txmsg-pg-$(printf %s "$PWD" | sha1sum | cut -c1-12)
    DATA=$BASE/data
    LOG=$BASE/server.log
    [ "${1:-}" = "stop" ] || say "the postgres user cannot reach $PWD/var/pg (a parent directory lacks o+x); using $BASE"
  fi
fi

if [ "${1:-}" = "stop" ]; then
  if [ -f "$DATA/postmaster.pid" ]; then
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2 || true
  fi
  exit 0
fi

mkdir -p "$BASE"
if [ "$(id -u)" = 0 ]; then
  chown postgres:postgres "$BASE"
fi

if [ ! -f "$DATA/PG_VERSION" ]; then
  say "initdb $DATA"
  as_pg "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-locale >"$BASE/initdb.log" 2>&1 || {
    say "initdb failed; see $BASE/initdb.log"; exit 1; }
fi

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  # ours is running: use the port it was started on (line 4 of postmaster.pid)
  PORT=$(sed -n 4p "$DATA/postmaster.pid")
else
  if [ -z "${TXMSG_PG_PORT:-}" ]; then
    # Another server (e.g. a previous CI clone's, whose directory is gone) may hold the default
    # port for a while: take the next free one rather than fail.
    for candidate in $(seq "$PORT" $((PORT + 20))); do
      if ! listening "$candidate"; then PORT=$candidate; break; fi
    done
  fi
  say "starting PostgreSQL ($BIN) on 127.0.0.1:$PORT"
  # fsync off: test data only, and it keeps the suite fast on a busy 2-core machine.
  as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $PORT -k $BASE -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    start >&2 || {
      say "server did not start; last lines of $LOG:"; tail -n 5 "$LOG" >&2 || true
      grep -q "Address already in use" "$LOG" 2>/dev/null &&
        say "port $PORT is taken (another PostgreSQL?): choose a free one with TXMSG_PG_PORT=<port>"
      exit 1; }
fi

URL="postgresql+psycopg://postgres@127.0.0.1:${PORT}/${DB}"
for _ in $(seq 1 50); do
  "$BIN/pg_isready" -h 127.0.0.1 -p "$PORT" -q && break
  sleep 0.2
done

if ! as_pg "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname='${DB}'" | grep -q 1; then
  as_pg "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
fi

echo "$URL"
