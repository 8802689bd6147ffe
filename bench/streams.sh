#!/usr/bin/env bash
# bench/streams.sh: 1,024 streams on a small host (issue 34). For each
# direction (client sends, -R, --bidir), `fatpipe test -P 1024` against a
# `fatpipe server`, then `-P 64` in the same run, and prints:
#
#   - threads of each process (the `Threads:` line of /proc/PID/status,
#     the most seen while data flows, sampled every 0.2 s) against the
#     bound 4 x cores + 16, and the most seen at all (peak: with the
#     setup's short-lived dialing and handshake threads);
#   - the per-stream spread from the JSON: streams that moved nothing,
#     the smallest stream over the mean (every stream should be >= 0.25);
#   - the aggregate of -P 1024 over that of -P 64 (should be >= 0.9).
#
# Then a copy (COPY_STREAMS=256, push of a COPY_MB file into the server's
# export) against one of COPY_BASE=64 streams: threads of each process
# while data flows (from the moment the server attached every data
# connection: each received its acknowledgement, past the set-up's
# dialing and attach threads), each connection's acknowledged bytes from ss (every one
# should move >= 0.25 x the mean), and the rate over that of -P 64.
#
# On loopback always; also over a veth pair between two network
# namespaces (198.18.0.1/24 server, 198.18.0.2/24 client) when root.
# Exits non-zero if a bound is missed (CHECK=0: print only).
#
# Settings (environment):
#   DURATION=5 STREAMS=1024 BASE=64 MODES="send -R --bidir" NETS="lo veth"
#   COPY_STREAMS=256 COPY_BASE=64 COPY_MB=2048 (COPY_STREAMS=0: no copy)
#   FATPIPE=path/to/fatpipe (default: build with cargo --release)
#   KEEP=1 (keep the JSON and logs)
set -euo pipefail

DURATION=${DURATION:-5}
STREAMS=${STREAMS:-1024}
BASE=${BASE:-64}
MODES=${MODES:-"send -R --bidir"}
COPY_STREAMS=${COPY_STREAMS:-256}
COPY_BASE=${COPY_BASE:-64}
COPY_MB=${COPY_MB:-2048}
NETS=${NETS:-"lo veth"}
CHECK=${CHECK:-1}
PORT=5311

NS_S="fpstreams-s-$$"
NS_C="fpstreams-c-$$"
VETH_S="fps$$s"
VETH_C="fps$$c"

BENCH=streams
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d /tmp/fatpipe-streams.XXXXXX)
failed=0

cleanup() {
    stop_servers
    ip netns del "$NS_S" 2>/dev/null || true
    ip netns del "$NS_C" 2>/dev/null || true
    drop_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

install_missing jq:jq
build_fatpipe
cores=$(nproc)
bound=$((4 * cores + 16))

# threads PID: the process's thread count now (0 once it is gone).
threads() {
    awk '/^Threads:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0
}

# run_test NET MODE P: one test; prints "client_threads server_threads
# aggregate_bps streams zero min_over_mean client_peak server_peak": the
# most threads seen while data flowed (from the first interval line on),
# the receivers' aggregate (with --bidir both directions' sums added),
# and the most threads seen at all (the setup's dialing and handshake
# threads are short-lived and not the data plane's).
run_test() {
    local net=$1 mode=$2 p=$3 ns=() ip=127.0.0.1 flags=()
    if [ "$net" = veth ]; then
        ns=(ip netns exec "$NS_C")
        ip=198.18.0.1
    fi
    [ "$mode" = send ] || flags=("$mode")
    local out="$work/$net-$p-${mode#--}.jsonl"
    "${ns[@]}" "$FATPIPE" test "$ip:$PORT" -P "$p" -t "$DURATION" -i 1 --json-stream \
        "${flags[@]}" >"$out" 2>"$out.err" &
    local cpid=$! spid=${SERVER_PID[$net]} cmax=0 smax=0 cpeak=0 speak=0 c s
    while kill -0 "$cpid" 2>/dev/null; do
        c=$(threads "$cpid")
        s=$(threads "$spid")
        c=${c:-0} s=${s:-0}
        [ "$c" -gt "$cpeak" ] && cpeak=$c
        [ "$s" -gt "$speak" ] && speak=$s
        if grep -q '^{"event":"interval"' "$out" 2>/dev/null && ! grep -q '^{"event":"end"' "$out"; then
            [ "$c" -gt "$cmax" ] && cmax=$c
            [ "$s" -gt "$smax" ] && smax=$s
        fi
        sleep 0.2
    done
    if ! wait "$cpid"; then
        echo "$BENCH: $net $mode -P $p failed: $(tail -n 3 "$out.err")" >&2
        echo "$cmax $smax n/a 0 n/a n/a $cpeak $speak"
        return
    fi
    grep '^{"event":"end"' "$out" | jq -r --arg c "$cmax" --arg s "$smax" \
        --arg cp "$cpeak" --arg sp "$speak" '
        .data as $e
        | [$e.streams[] | .bytes] as $b
        | ($b | add / length) as $mean
        | [$c, $s, ([$e.sums[] | .bits_per_second] | add),
           ($b | length), ([$b[] | select(. == 0)] | length),
           (($b | min) / (if $mean > 0 then $mean else 1 end)), $cp, $sp]
        | map(tostring) | join(" ")'
}

setup_net() {
    local net=$1
    mkdir -p "$work/export"
    if [ "$net" = veth ]; then
        setup_veth "$NS_S" "$NS_C" "$VETH_S" "$VETH_C" 198.18.0.1 198.18.0.2 1500
        start_server "$NS_S" veth "$PORT" \
            "$FATPIPE" server --bind 198.18.0.1 --port "$PORT" --quiet \
            --export "data=$work/export:public"
    else
        start_server "" lo "$PORT" \
            "$FATPIPE" server --bind 127.0.0.1 --port "$PORT" --quiet \
            --export "data=$work/export:public"
    fi
}

# run_copy NET P: one push of $work/copy.bin with P streams; prints
# "client_threads server_threads rate_bps conns min_over_mean
# client_peak server_peak": threads the most seen once every data
# connection was attached (ss: it received bytes), each connection's most acknowledged
# bytes (the P largest: the copy-control connection moves little).
run_copy() {
    local net=$1 p=$2 ns=() ip=127.0.0.1
    if [ "$net" = veth ]; then
        ns=(ip netns exec "$NS_C")
        ip=198.18.0.1
    fi
    rm -f "$work/export/copy.bin"
    local out="$work/copy-$net-$p.json" acked="$work/copy-$net-$p.acked"
    : >"$acked"
    "${ns[@]}" "$FATPIPE" copy --port "$PORT" --json -P "$p" --chunk-size 256K \
        "$work/copy.bin" "$ip:data/" >"$out" 2>"$out.err" &
    local cpid=$! spid=${SERVER_PID[$net]} cmax=0 smax=0 cpeak=0 speak=0 c s snap flowing=0
    while kill -0 "$cpid" 2>/dev/null; do
        c=$(threads "$cpid")
        s=$(threads "$spid")
        c=${c:-0} s=${s:-0}
        [ "$c" -gt "$cpeak" ] && cpeak=$c
        [ "$s" -gt "$speak" ] && speak=$s
        # "local acked received" per connection.
        snap=$("${ns[@]}" ss -Htin state established "( dport = :$PORT )" |
            awk '/bytes_acked:/ { a = 0; r = 0
                     for (i = 1; i <= NF; i++) {
                         if ($i ~ /^bytes_acked:/) { split($i, x, ":"); a = x[2] }
                         if ($i ~ /^bytes_received:/) { split($i, x, ":"); r = x[2] }
                     }
                     print l, a, r; next }
                 { for (i = 1; i <= NF; i++) if ($i ~ /:[0-9]+$/ && $i !~ /:'"$PORT"'$/) l = $i }')
        printf '%s\n' "$snap" >>"$acked"
        if [ $flowing -eq 1 ]; then
            [ "$c" -gt "$cmax" ] && cmax=$c
            [ "$s" -gt "$smax" ] && smax=$s
        fi
        # Flowing once the server attached every data connection: each
        # has received its DataAck (the only bytes a data connection of a
        # push receives), so the set-up's attach threads are ending;
        # counted from the next sample on.
        if [ $flowing -eq 0 ] && [ "$(printf '%s\n' "$snap" | awk '$3 > 0' | wc -l)" -gt "$p" ]; then
            flowing=1
        fi
        sleep 0.1
    done
    if ! wait "$cpid"; then
        echo "$BENCH: copy $net -P $p failed: $(tail -n 3 "$out.err")" >&2
        echo "$cmax $smax n/a 0 n/a $cpeak $speak"
        return
    fi
    local rate spread n
    rate=$(jq -r '.rate' "$out")
    read -r n spread <<<"$(awk '{ if ($2 > m[$1]) m[$1] = $2 } END { for (k in m) print m[k] }' "$acked" |
        sort -n | tail -n "$p" |
        awk '{ v[NR] = $1; s += $1 } END { if (NR == 0) { print 0, "n/a"; exit } printf "%d %.3f\n", NR, v[1] / (s / NR) }')"
    echo "${cmax:-0} ${smax:-0} $rate $n $spread $cpeak $speak"
}

fmt='%-5s %-7s %6s %8s %8s %9s %9s %8s %5s %8s %8s\n'
printf "$fmt" net mode streams thr_cli thr_srv peak_cli peak_srv Gbit/s zero min/mean vs_P$BASE
for net in $NETS; do
    if [ "$net" = veth ] && [ "$(id -u)" -ne 0 ]; then
        echo "veth: skipped (needs root for network namespaces)"
        continue
    fi
    setup_net "$net"
    for mode in $MODES; do
        read -r bc bs base _ _ _ bcp bsp <<<"$(run_test "$net" "$mode" "$BASE")"
        read -r c s agg n zero spread cp sp <<<"$(run_test "$net" "$mode" "$STREAMS")"
        gbit=$(awk -v a="$agg" 'BEGIN { if (a + 0 > 0) printf "%.2f", a / 1e9; else print "n/a" }')
        bgbit=$(awk -v a="$base" 'BEGIN { if (a + 0 > 0) printf "%.2f", a / 1e9; else print "n/a" }')
        vs=$(ratio "$agg" "$base")
        printf "$fmt" "$net" "$mode" "$BASE" "$bc" "$bs" "$bcp" "$bsp" "$bgbit" "" "" ""
        printf "$fmt" "$net" "$mode" "$n" "$c" "$s" "$cp" "$sp" "$gbit" "$zero" \
            "$(awk -v x="$spread" 'BEGIN { if (x ~ /^[0-9.e+-]+$/) printf "%.2f", x; else print x }')" "$vs"
        ok=1
        [ "$n" = "$STREAMS" ] || ok=0
        [ "${c:-999}" -le "$bound" ] && [ "${s:-999}" -le "$bound" ] || ok=0
        awk -v x="$spread" 'BEGIN { exit !(x + 0 >= 0.25) }' || ok=0
        awk -v x="$vs" 'BEGIN { exit !(x + 0 >= 0.9) }' || ok=0
        if [ $ok -eq 0 ]; then
            echo "  ^ misses a bound (threads <= $bound, every stream >= 0.25 x mean, >= 0.9 x -P $BASE)"
            failed=1
        fi
    done
    if [ "$COPY_STREAMS" -gt 0 ]; then
        [ -f "$work/copy.bin" ] || head -c $((COPY_MB << 20)) /dev/urandom >"$work/copy.bin"
        read -r bc bs base _ _ bcp bsp <<<"$(run_copy "$net" "$COPY_BASE")"
        read -r c s agg n spread cp sp <<<"$(run_copy "$net" "$COPY_STREAMS")"
        gbit=$(awk -v a="$agg" 'BEGIN { if (a + 0 > 0) printf "%.2f", a / 1e9; else print "n/a" }')
        bgbit=$(awk -v a="$base" 'BEGIN { if (a + 0 > 0) printf "%.2f", a / 1e9; else print "n/a" }')
        vs=$(ratio "$agg" "$base")
        printf "$fmt" "$net" copy "$COPY_BASE" "$bc" "$bs" "$bcp" "$bsp" "$bgbit" "" "" ""
        printf "$fmt" "$net" copy "$n" "$c" "$s" "$cp" "$sp" "$gbit" "" "$spread" "$vs"
        ok=1
        [ "$n" = "$COPY_STREAMS" ] || ok=0
        [ "${c:-999}" -le "$bound" ] && [ "${s:-999}" -le "$bound" ] || ok=0
        awk -v x="$spread" 'BEGIN { exit !(x + 0 >= 0.25) }' || ok=0
        awk -v x="$vs" 'BEGIN { exit !(x + 0 >= 0.9) }' || ok=0
        if [ $ok -eq 0 ]; then
            echo "  ^ misses a bound (threads <= $bound, every stream >= 0.25 x mean, >= 0.9 x -P $COPY_BASE)"
            failed=1
        fi
    fi
    stop_servers
done
echo "cores: $cores, thread bound: $bound"
[ "$CHECK" = 0 ] || exit $failed
