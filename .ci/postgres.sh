#!/usr/bin/env bash
# Start a throw-away PostgreSQL server on 127.0.0.1 for envsched's store tests, idempotently.
#
# Run as root (CI). Installs Debian's `postgresql` package if no server binaries are present, initialises a
# cluster in $ENVSCHED_PG_DIR (default /tmp/envsched-pg), starts it on 127.0.0.1:$ENVSCHED_PG_PORT (default
# 55439) if it is not running yet, creates the database $ENVSCHED_PG_DB (default envsched_test), and prints
# its URL as the last line of stdout (all other output goes to stderr):
#
#   export ENVSCHED_TEST_POSTGRES_URL="$(bash .ci/postgres.sh)"
#
# When sourced (`. .ci/postgres.sh`) it exports ENVSCHED_TEST_POSTGRES_URL itself.
# Stop it with: runuser -u postgres -- "$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)/pg_ctl" -D "$ENVSCHED_PG_DIR/data" stop
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  # sourced: run in a child shell (so the caller's shell options stay as they are) and export the URL
  ENVSCHED_TEST_POSTGRES_URL="$(bash "${BASH_SOURCE[0]}" | tail -1)" || return 1
  export ENVSCHED_TEST_POSTGRES_URL
  echo "ENVSCHED_TEST_POSTGRES_URL=$ENVSCHED_TEST_POSTGRES_URL" >&2
  return 0
fi
set -euo pipefail

_envsched_pg_main() {
  local dir="${ENVSCHED_PG_DIR:-/tmp/envsched-pg}"
  local port="${ENVSCHED_PG_PORT:-55439}"
  local db="${ENVSCHED_PG_DB:-envsched_test}"
  local user=postgres

  if [ "$(id -u)" -ne 0 ]; then
    echo "postgres.sh: run me as root (I install packages and start the server as user postgres)" >&2
    return 1
  fi
  local bindir
  bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)"
  if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
    echo "postgres.sh: installing Debian's postgresql package" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends postgresql >&2
    bindir="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
  fi
  id -u "$user" >/dev/null 2>&1 || useradd --system --home-dir "$dir" --shell /bin/false "$user"

  mkdir -p "$dir"
  chown "$user" "$dir"
  chmod 700 "$dir"
  if [ ! -s "$dir/data/PG_VERSION" ]; then
    echo "postgres.sh: initialising a cluster in $dir/data" >&2
    rm -rf "$dir/data"
    runuser -u "$user" -- "$bindir/initdb" -D "$dir/data" -U "$user" --auth=trust --encoding=UTF8 \
      --locale=C.UTF-8 >&2 || runuser -u "$user" -- "$bindir/initdb" -D "$dir/data" -U "$user" \
      --auth=trust --encoding=UTF8 --no-locale >&2
  fi
  mkdir -p "$dir/sock"
  chown "$user" "$dir/sock"
  if ! runuser -u "$user" -- "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    echo "postgres.sh: starting the server on 127.0.0.1:$port" >&2
    runuser -u "$user" -- "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $dir/sock -c fsync=on -c max_connections=100" start >&2
  fi
  local tries=0
  until "$bindir/pg_isready" -h 127.0.0.1 -p "$port" -q; do
    tries=$((tries + 1))
    if [ "$tries" -gt 60 ]; then
      echo "postgres.sh: the server did not become ready; log:" >&2
      tail -20 "$dir/server.log" >&2 || true
      return 1
    fi
    sleep 0.5
  done
  if ! "$bindir/psql" -h 127.0.0.1 -p "$port" -U "$user" -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
    "$bindir/createdb" -h 127.0.0.1 -p "$port" -U "$user" "$db" >&2
  fi
  ENVSCHED_TEST_POSTGRES_URL="postgresql+psycopg://$user@127.0.0.1:$port/$db"
  export ENVSCHED_TEST_POSTGRES_URL
  echo "$ENVSCHED_TEST_POSTGRES_URL"
}

_envsched_pg_main
