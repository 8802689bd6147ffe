#!/usr/bin/env bash
# A private, throwaway PostgreSQL server for the archive tests and bench.
#
#   scripts/pg-test-server.sh start DIR [PORT]
#       initdb into DIR (new or empty), start the server on 127.0.0.1:PORT
#       (default 54329; no other address, unix socket inside DIR), create
#       role `fatpipe` (random password) and database `fatpipe_test`, and
#       print the URL for FATPIPE_TEST_POSTGRES on stdout.
#   scripts/pg-test-server.sh stop DIR
#       stop that server (pg_ctl stop, which signals the PID in its
#       postmaster.pid) and remove DIR.
#
# PostgreSQL refuses to run as root, so as root the server runs as the
# `postgres` system user (from Debian's package), or `nobody` without one;
# otherwise as the calling user. Binaries are looked up in PG_BIN, then
# /usr/lib/postgresql/*/bin (newest), then PATH.
set -euo pipefail

die() {
    echo "pg-test-server: $*" >&2
    exit 2
}

find_bin() {
    local d
    if [ -n "${PG_BIN:-}" ]; then
        echo "$PG_BIN"
        return
    fi
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
    done
    command -v pg_ctl >/dev/null 2>&1 && { dirname "$(command -v pg_ctl)"; return; }
    die "no PostgreSQL server binaries (apt-get install postgresql, or set PG_BIN)"
}

# as_owner CMD...: runs CMD as the user that owns the server.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u "$OWNER" -- "$@"
    else
        "$@"
    fi
}

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: $0 start DIR [PORT] | stop DIR"
BIN=$(find_bin)
OWNER=$(id -un)
if [ "$(id -u)" = 0 ]; then
    if id postgres >/dev/null 2>&1; then OWNER=postgres; else OWNER=nobody; fi
fi

case "$cmd" in
start)
    port=${3:-54329}
    mkdir -p "$dir"
    [ -z "$(ls -A "$dir")" ] || die "$dir is not empty"
    dir=$(cd "$dir" && pwd)
    [ "$(id -u)" = 0 ] && chown "$OWNER" "$dir"
    chmod 700 "$dir"
    password=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
    printf '%s\n' "$password" >"$dir/superuser.pw"
    [ "$(id -u)" = 0 ] && chown "$OWNER" "$dir/superuser.pw"
    # Local (socket) connections are trusted so this script can set up
    # roles; TCP, which the tests use, needs the password.
    as_owner "$BIN/initdb" -D "$dir/data" -U postgres --pwfile="$dir/superuser.pw" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 ||
        { tail -20 "$dir/initdb.log" >&2; die "initdb failed"; }
    mkdir -p "$dir/sock"
    [ "$(id -u)" = 0 ] && chown "$OWNER" "$dir/sock"
    as_owner "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
        -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir/sock" \
        start >/dev/null ||
        { tail -20 "$dir/server.log" >&2; die "server did not start on port $port"; }
    as_owner "$BIN/psql" -q -v ON_ERROR_STOP=1 -h "$dir/sock" -p "$port" -U postgres -d postgres \
        -c "CREATE ROLE fatpipe LOGIN PASSWORD '$password'" \
        -c "CREATE DATABASE fatpipe_test OWNER fatpipe" >/dev/null ||
        die "could not create the test role and database"
    echo "postgres://fatpipe:$password@127.0.0.1:$port/fatpipe_test"
    ;;
stop)
    [ -d "$dir" ] || exit 0
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$BIN/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null ||
            echo "pg-test-server: pg_ctl stop failed; see $dir/server.log" >&2
    fi
    # Only remove what looks like this script's work.
    if [ -f "$dir/data/PG_VERSION" ] || [ -z "$(ls -A "$dir")" ]; then
        rm -rf "$dir"
    else
        die "$dir does not look like a test server's directory; left in place"
    fi
    ;;
*)
    die "usage: $0 start DIR [PORT] | stop DIR"
    ;;
esac
