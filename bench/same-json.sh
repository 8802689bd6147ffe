#!/usr/bin/env bash
# bench/same-json.sh OLD NEW: do two fatpipe builds write the same JSON?
#
# A refactoring must not change what users and their scripts read. This
# runs the same commands with two binaries (each against its own server on
# loopback) and compares the *shape* of every JSON document: each leaf's
# path and type, and the text of short lower-case words (enum values such
# as "tcp", "up", "cubic", "push"), not the measured numbers, times or
# host names. It prints "same" per command, or the difference and exits 1.
#
# Commands: test (auto-tuned), test --no-auto -P 2, test -R, test --bidir,
# test -u, copy push and pull of a small tree, path, and tune --rate/--rtt.
# Loopback only; the servers are ended by PID; scratch files go to a
# temporary directory that is removed on exit (KEEP=1 keeps it).
#
#   bench/same-json.sh /tmp/fatpipe-before target/release/fatpipe
set -euo pipefail

BENCH=same-json
. "$(dirname "$0")/lib.sh"

[ $# -eq 2 ] || die "usage: bench/same-json.sh OLD_BINARY NEW_BINARY"
OLD=$1 NEW=$2
[ -x "$OLD" ] || die "$OLD is not executable"
[ -x "$NEW" ] || die "$NEW is not executable"
command -v jq >/dev/null 2>&1 || install_missing jq:jq

work=$(mktemp -d /tmp/fatpipe-same-json.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    drop_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shape FILE: one line per JSON leaf: its path (array indices as []), its
# type, and the value when it is a short lower-case word. Sorted, unique.
shape() {
    jq -r '
      paths(scalars) as $p
      | getpath($p) as $v
      | ($p | map(if type == "number" then "[]" else tostring end) | join(".")) as $k
      | if ($v | type) == "string" and ($v | test("^[a-z_0-9]{1,16}$")) and ($v | test("^[a-z]"))
        then "\($k) string \($v)"
        else "\($k) \($v | type)"
        end' "$1" | sort -u
}

# start BIN NAME: a server of BIN on a free loopback port with an export;
# sets PORT_<NAME>.
start() {
    local bin=$1 name=$2 log="$work/$2.server.log"
    mkdir -p "$work/$name/export"
    "$bin" server --bind 127.0.0.1 --port 0 --export "data=$work/$name/export:public" >"$log" 2>&1 &
    pids+=($!)
    for _ in $(seq 50); do
        if grep -qo '127.0.0.1:[0-9]*' "$log"; then break; fi
        sleep 0.1
    done
    local port
    port=$(grep -o '127.0.0.1:[0-9]*' "$log" | head -n 1 | cut -d: -f2)
    [ -n "$port" ] || die "$bin server did not start: $(head -n 3 "$log")"
    printf -v "PORT_$name" '%s' "$port"
}

start "$OLD" old
start "$NEW" new

mkdir -p "$work/src/tree/sub"
head -c 3000000 /dev/urandom >"$work/src/tree/big"
for i in 1 2 3; do echo "file $i" >"$work/src/tree/sub/f$i"; done

# run NAME ARGS...: runs ARGS with each binary (HOST and PORT substituted),
# stores each JSON document, compares their shapes.
status=0
run() {
    local name=$1 which bin port
    shift
    for which in old new; do
        if [ $which = old ]; then bin=$OLD port=$PORT_old; else bin=$NEW port=$PORT_new; fi
        local args=() a
        for a in "$@"; do
            a=${a//@PORT@/$port}
            a=${a//@DIR@/$work/$which}
            args+=("$a")
        done
        if ! "$bin" "${args[@]}" >"$work/$name.$which.json" 2>"$work/$name.$which.err"; then
            echo "$name: $which failed: $(tail -n 1 "$work/$name.$which.err")"
            status=1
            return
        fi
        shape "$work/$name.$which.json" >"$work/$name.$which.shape"
    done
    if diff -u "$work/$name.old.shape" "$work/$name.new.shape" >"$work/$name.diff"; then
        printf '%-12s same (%s leaves)\n' "$name" "$(wc -l <"$work/$name.new.shape")"
    else
        echo "$name: the JSON differs:"
        sed 1,2d "$work/$name.diff"
        status=1
    fi
}

run test-auto   test 127.0.0.1 -p @PORT@ -t 2 --json
run test-P2     test 127.0.0.1 -p @PORT@ -t 2 --no-auto -P 2 --json
run test-R      test 127.0.0.1 -p @PORT@ -t 2 -R --json
run test-bidir  test 127.0.0.1 -p @PORT@ -t 2 --bidir --json
run test-udp    test 127.0.0.1 -p @PORT@ -t 2 -u -b 100M --json
run copy-push   copy -p @PORT@ -r --json "$work/src/tree" 127.0.0.1:data/t
run copy-pull   copy -p @PORT@ -r --json 127.0.0.1:data/t @DIR@/pulled
run path        path 127.0.0.1 -p @PORT@ --json
run tune        tune --rate 10gbit --rtt 100ms --json
exit $status
