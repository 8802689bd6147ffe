#!/usr/bin/env bash
# bench/setup.sh: how long a many-stream copy takes to set up on a long
# path, and how many threads each end needs for it (issue 34: the client's
# one-thread dialer and the server's pre-authentication lanes).
#
# A lab link (`fatpipe lab up`, RATE x RTT, no loss); in namespace b one
# `fatpipe server` per build over one export, in namespace a the client.
# For each build, alternating within every run, RUNS runs of
#   push       copy -P STREAMS --no-auto of a SIZE file into the export
#   push-enc   the same with --encrypt
#   pull       copy -P STREAMS --no-auto of a SIZE file out of the export
# and prints, per build and case, medians of:
#   open   seconds from the control connection to the last data connection
#          open (the copy's timeline: data_open_at - connected_at; n/a when
#          the copy ended before its last data connection was open)
#   wall   the copy's wall clock (timeline.wall_secs)
#   thr    the client's thread peak (/proc/PID/status, sampled every 20 ms)
# then the ratios FATPIPE over FATPIPE_B. A dialer that sets up every
# connection in parallel opens them in about two round trips whatever
# STREAMS is; one that runs out of threads needs STREAMS / threads of them.
#
# Needs root (namespaces). Servers end by PID, the lab is removed, on any
# exit.
#
# Settings (environment):
#   RUNS=3 STREAMS=256 SIZE_MB=64 RTT=228 RATE=1gbit
#   FATPIPE=path/to/fatpipe   (default: build with cargo --release)
#   FATPIPE_B=path/to/other/fatpipe (optional; the ratio's divisor)
#   KEEP=1                    (keep the work directory)
set -euo pipefail

RUNS=${RUNS:-3}
STREAMS=${STREAMS:-256}
SIZE_MB=${SIZE_MB:-64}
RTT=${RTT:-228}
RATE=${RATE:-1gbit}
LAB=fps$$

BENCH=setup
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d /var/tmp/fatpipe-setup-bench.XXXXXX)
chmod 755 "$work"

cleanup() {
    stop_servers
    [ -n "${FATPIPE:-}" ] && "$FATPIPE" lab down "$LAB" >/dev/null 2>&1 || true
    drop_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces"
install_missing jq:jq
build_fatpipe

builds=(new)
declare -A BIN=([new]=$FATPIPE)
declare -A PORT=([new]=7101)
if [ -n "${FATPIPE_B:-}" ]; then
    [ -x "$FATPIPE_B" ] || die "FATPIPE_B=$FATPIPE_B is not an executable"
    builds+=(old)
    BIN[old]=$FATPIPE_B
    PORT[old]=7102
fi

mkdir -p "$work/exp" "$work/src" "$work/pull"
head -c $((SIZE_MB << 20)) /dev/urandom >"$work/src/f.bin"
cp "$work/src/f.bin" "$work/exp/g.bin"
printf 'setup-bench-key-%s\n' "$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$work/key"
chmod 600 "$work/key"

"$FATPIPE" lab up "$LAB" --rtt "${RTT}ms" --rate "$RATE" --owner $$ >/dev/null
B_IP=$("$FATPIPE" lab list --json | jq -r --arg n "$LAB" '.[] | select(.name == $n) | .b.ipv4')
[ -n "$B_IP" ] && [ "$B_IP" != null ] || die "no address for lab $LAB"
for b in "${builds[@]}"; do
    start_server "fp-$LAB-b" "$b" "${PORT[$b]}" "${BIN[$b]}" server --bind "$B_IP" \
        --port "${PORT[$b]}" --key-file "$work/key" --export "data=$work/exp" ||
        die "the $b server did not start"
done

# one BUILD CASE RUN: runs the copy, prints "open wall threads" (n/a when
# it failed).
one() {
    local b=$1 c=$2 r=$3 args=() out pid peak=0 t
    case $c in
        push) args=("$work/src/f.bin" "$B_IP:data/p$r-$b.bin") ;;
        push-enc) args=(--encrypt "$work/src/f.bin" "$B_IP:data/e$r-$b.bin") ;;
        pull) args=("$B_IP:data/g.bin" "$work/pull/$r-$b/") ;;
    esac
    [ "$c" != pull ] || mkdir -p "$work/pull/$r-$b"
    ip netns exec "fp-$LAB-a" "${BIN[$b]}" copy --port "${PORT[$b]}" --json -P "$STREAMS" --no-auto \
        --key-file "$work/key" "${args[@]}" >"$work/$b-$c-$r.json" 2>"$work/$b-$c-$r.err" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        t=$(awk '/^Threads:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
        [ -n "$t" ] && [ "$t" -gt "$peak" ] && peak=$t
        sleep 0.02
    done
    if ! wait "$pid"; then
        echo "$NA $NA $NA"
        return
    fi
    out=$(jq -r '.timeline | [(if .data_open_at and .connected_at then ((.data_open_at - .connected_at) * 100 | round) / 100 else "n/a" end), ((.wall_secs * 100 | round) / 100)] | @tsv' \
        "$work/$b-$c-$r.json" 2>/dev/null || echo "$NA $NA")
    echo "$out $peak"
    rm -f "$work/exp/p$r-$b.bin" "$work/exp/e$r-$b.bin"
    rm -rf "$work/pull/$r-$b"
}

cases=(push push-enc pull)
declare -A OPEN=() WALL=() THR=()
echo "== lab $RATE x ${RTT} ms; copy -P $STREAMS --no-auto of $SIZE_MB MiB; $RUNS alternating runs"
for r in $(seq "$RUNS"); do
    for c in "${cases[@]}"; do
        for b in "${builds[@]}"; do
            read -r o w t < <(one "$b" "$c" "$r")
            printf '  run %s %-4s %-9s open %s s, wall %s s, client threads %s\n' "$r" "$b" "$c" "$o" "$w" "$t"
            OPEN[$b,$c]+="$o"$'\n'
            WALL[$b,$c]+="$w"$'\n'
            THR[$b,$c]+="$t"$'\n'
        done
    done
done

echo
printf '%-5s %-9s %8s %8s %8s\n' build case open_s wall_s threads
declare -A MO=() MW=() MT=()
for b in "${builds[@]}"; do
    for c in "${cases[@]}"; do
        MO[$b,$c]=$(printf '%s' "${OPEN[$b,$c]}" | median '%.2f')
        MW[$b,$c]=$(printf '%s' "${WALL[$b,$c]}" | median '%.2f')
        MT[$b,$c]=$(printf '%s' "${THR[$b,$c]}" | median '%.0f')
        printf '%-5s %-9s %8s %8s %8s\n' "$b" "$c" "${MO[$b,$c]}" "${MW[$b,$c]}" "${MT[$b,$c]}"
    done
done
if [ -n "${FATPIPE_B:-}" ]; then
    echo
    printf '%-9s %10s %10s %10s   (new / old; < 1: faster, fewer)\n' case open wall threads
    for c in "${cases[@]}"; do
        printf '%-9s %10s %10s %10s\n' "$c" "$(ratio "${MO[new,$c]}" "${MO[old,$c]}")" \
            "$(ratio "${MW[new,$c]}" "${MW[old,$c]}")" "$(ratio "${MT[new,$c]}" "${MT[old,$c]}")"
    done
fi
echo "cores: $(nproc), thread bound: $((4 * $(nproc) + 16))"
