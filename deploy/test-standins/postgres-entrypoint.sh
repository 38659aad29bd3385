#!/bin/sh
# The stand-in's docker-entrypoint.sh: what the official postgres image's does for compose.yaml, nothing more. On the
# first start (an empty PGDATA) it makes the cluster with POSTGRES_USER as its superuser and POSTGRES_PASSWORD as its
# password, scram-sha-256 for every TCP client, listening on every interface of the container, and POSTGRES_DB.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?the postgres stand-in needs POSTGRES_PASSWORD, as the official image does}"
  user=${POSTGRES_USER:-postgres}
  db=${POSTGRES_DB:-$user}
  pwfile=$(mktemp)
  printf '%s' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo 'host all all all scram-sha-256' >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -q -c "CREATE DATABASE \"$db\""
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  echo "postgres stand-in: made the cluster in $PGDATA (superuser $user, database $db)"
fi
exec "$@"
