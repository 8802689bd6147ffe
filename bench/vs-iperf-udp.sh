#!/usr/bin/env bash
# bench/vs-iperf-udp.sh: UDP at every packet size (issue 17): fatpipe test
# -u against iperf3 (-u -b 0) and iperf2 (-u -b 100G), and fatpipe's
# batching against its own --no-batch.
#
# Two network namespaces joined by a veth pair (198.18.0.1/24 server side,
# 198.18.0.2/24 client side, MTU $MTU). For each datagram length, every
# tool runs twice:
#   - as fast as it can for DURATION s: datagrams/s sent and received, and
#     the received UDP payload rate (Gbit/s);
#   - for its maximum loss-free rate: fatpipe with --find-max (short
#     trials of TRIAL s, one of CONFIRM s to confirm); iperf3 and iperf2
#     cannot search, so this script steps their -b down from what they
#     received as fast as they could (×0.85, ×0.7, … ×0.01, runs of TRIAL
#     s) and takes the first rate with no datagram lost: a lower bound at
#     that step's resolution.
# Tools alternate within every repetition; RUNS repetitions, medians
# printed, then fatpipe's ratios against the best peer and issue 17's
# targets, each marked met or MISSED.
#
# iperf2 2.1.8's UDP server crashes now and then between tests, so it is
# started afresh for every iperf2 run. Rates are UDP payload bit/s, as all
# three tools count -b.
#
# Needs root (namespaces). Installs iperf3, iperf and jq with apt-get if
# missing. Cleans up namespaces and servers (by PID) on any exit.
#
# Settings (environment):
#   RUNS=3 DURATION=3 TRIAL=1 CONFIRM=3 MTU=9000
#   LENGTHS="64 512 1472 8972 65507"  NB_LENGTHS="64" (lengths also run
#   with fatpipe --no-batch; empty: none)
#   TOOLS="fatpipe iperf3 iperf2"
#   FATPIPE=path/to/fatpipe (default: build with cargo --release)
#   FATPIPE_B=path/to/other/fatpipe  with TOOLS including fatpipe-b: a
#                             second build (e.g. before a change), with its
#                             own server, measured the same way as fatpipe,
#                             alternating; the table adds fatpipe/fatpipe-b
#   KEEP=1 (keep every tool's raw output)
set -euo pipefail

RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
TRIAL=${TRIAL:-1}
CONFIRM=${CONFIRM:-3}
MTU=${MTU:-9000}
LENGTHS=${LENGTHS:-"64 512 1472 8972 65507"}
NB_LENGTHS=${NB_LENGTHS-"64"}
TOOLS=${TOOLS:-"fatpipe iperf3 iperf2"}
STEPS="1.0 0.85 0.7 0.55 0.4 0.3 0.2 0.14 0.1 0.07 0.05 0.03 0.02 0.01"

SERVER_IP=198.18.0.1
CLIENT_IP=198.18.0.2
NS_S="fpudp-s-$$"
NS_C="fpudp-c-$$"
VETH_S="fpu$$s"
VETH_C="fpu$$c"
PORT_FATPIPE=5301
PORT_FATPIPE_B=5302
PORT_IPERF3=5201
PORT_IPERF2=5011

BENCH=vs-iperf-udp
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d /tmp/fatpipe-vs-iperf-udp.XXXXXX)

cleanup() {
    iperf2_stop
    stop_servers
    ip netns del "$NS_S" 2>/dev/null || true
    ip netns del "$NS_C" 2>/dev/null || true
    drop_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces"
for n in RUNS DURATION TRIAL CONFIRM MTU; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "$n must be a whole number above 0"
done

install_missing iperf3:iperf3 iperf:iperf jq:jq
build_fatpipe
case " $TOOLS " in
    *" fatpipe-b "*) [ -x "${FATPIPE_B:-}" ] || die "TOOLS has fatpipe-b: set FATPIPE_B to an executable" ;;
esac
# The build and port fatpipe_max and fatpipe_free use: fatpipe's, or
# fatpipe-b's while that variant runs.
fp_bin=$FATPIPE
fp_port=$PORT_FATPIPE

client() { ip netns exec "$NS_C" "$@"; }

# iperf2_server: a fresh iperf2 UDP server (see above), waited for. It is
# started from the subshells the measuring functions run in, so its PID
# goes to a file (not SERVER_PID), and the one before it is ended first.
iperf2_server() {
    iperf2_stop
    ip netns exec "$NS_S" iperf -s -u -B "$SERVER_IP" -p "$PORT_IPERF2" >>"$work/server-iperf2.log" 2>&1 &
    echo $! >"$work/iperf2.pid"
    local i
    for i in $(seq 50); do
        ip netns exec "$NS_S" ss -Hlun "sport = :$PORT_IPERF2" | grep -q . && return 0
        sleep 0.1
    done
    return 1
}

# iperf2_stop: ends the iperf2 server by the PID in its file.
iperf2_stop() {
    [ -f "$work/iperf2.pid" ] || return 0
    kill "$(cat "$work/iperf2.pid")" 2>/dev/null || true
    rm -f "$work/iperf2.pid"
}

# Each *_max prints "SENT_PPS RECV_PPS RECV_BPS" (n/a when the run failed);
# each *_at prints "LOST RECV_BPS" for one run at a fixed -b.

fatpipe_max() { # LENGTH [extra flags]
    local l=$1
    shift
    client "$fp_bin" test "$SERVER_IP" -p "$fp_port" -u -b 100g -l "$l" -t "$DURATION" "$@" --json \
        >"$work/raw" 2>>"$work/errors" || { echo "n/a n/a n/a"; return; }
    jq -r --argjson d "$DURATION" --argjson l "$l" \
        '.end.sums[0] | "\(.packets_sent / $d) \(.packets / $d) \(.packets * $l * 8 / $d)"' "$work/raw" ||
        echo "n/a n/a n/a"
}

iperf3_json() { # LENGTH RATE SECONDS
    client iperf3 -c "$SERVER_IP" -p "$PORT_IPERF3" -u -b "$2" -l "$1" -t "$3" -J >"$work/raw" 2>>"$work/errors"
}

iperf3_max() {
    iperf3_json "$1" 0 "$DURATION" || { echo "n/a n/a n/a"; return; }
    jq -r --argjson l "$1" '.end.sum | select(.seconds > 0) |
        "\(.packets / .seconds) \((.packets - .lost_packets) / .seconds) \((.packets - .lost_packets) * $l * 8 / .seconds)"' \
        "$work/raw" || echo "n/a n/a n/a"
}

iperf3_at() { # LENGTH BPS
    iperf3_json "$1" "$2" "$TRIAL" || { echo "n/a n/a"; return; }
    jq -r --argjson l "$1" '.end.sum | select(.seconds > 0) |
        "\(.lost_packets) \((.packets - .lost_packets) * $l * 8 / .seconds)"' "$work/raw" || echo "n/a n/a"
}

# iperf2's client prints "Sent N datagrams" and the server's report,
# "... LOST/TOTAL (P%)"; the interval is the server's.
iperf2_run() { # LENGTH RATE SECONDS -> "SENT LOST TOTAL SECONDS"
    iperf2_server || { echo "n/a n/a n/a n/a"; return; }
    client iperf -c "$SERVER_IP" -p "$PORT_IPERF2" -u -b "$2" -l "$1" -t "$3" >"$work/raw" 2>>"$work/errors" || true
    awk '/Sent [0-9]+ datagrams/ { for (i = 1; i <= NF; i++) if ($i == "Sent") sent = $(i + 1) }
         /Server Report/ { rep = 1; next }
         rep && /\// { for (i = 1; i <= NF; i++) {
                           if ($i ~ /^[0-9.]+-[0-9.]+$/) { split($i, t, "-"); secs = t[2] - t[1] }
                           if ($i ~ /^[0-9]+\/[0-9]+$/) { split($i, p, "/"); lost = p[1]; total = p[2] } } }
         END { if (sent != "" && total != "" && secs > 0) print sent, lost, total, secs; else print "n/a n/a n/a n/a" }' \
        "$work/raw"
}

iperf2_max() {
    local sent lost total secs
    read -r sent lost total secs < <(iperf2_run "$1" 100G "$DURATION")
    if is_num "$total"; then
        awk -v s="$sent" -v lo="$lost" -v t="$total" -v d="$secs" -v l="$1" \
            'BEGIN { print s / d, (t - lo) / d, (t - lo) * l * 8 / d }'
    else
        echo "n/a n/a n/a"
    fi
}

iperf2_at() {
    local sent lost total secs
    read -r sent lost total secs < <(iperf2_run "$1" "$2" "$TRIAL")
    if is_num "$total"; then
        awk -v lo="$lost" -v t="$total" -v d="$secs" -v l="$1" 'BEGIN { print lo, (t - lo) * l * 8 / d }'
    else
        echo "n/a n/a"
    fi
}

# peer_free TOOL LENGTH FROM_BPS: the first step of -b with no loss.
peer_free() {
    local tool=$1 l=$2 from=$3 f bps lost got
    is_num "$from" || { echo "n/a"; return; }
    for f in $STEPS; do
        bps=$(awk -v a="$from" -v f="$f" 'BEGIN { printf "%d", a * f }')
        [ "$bps" -gt 0 ] || break
        read -r lost got < <("${tool}_at" "$l" "$bps")
        if [ "$lost" = 0 ]; then
            echo "$got"
            return
        fi
    done
    echo "n/a"
}

fatpipe_free() { # LENGTH [extra flags] -> "BPS PPS"
    local l=$1
    shift
    client "$fp_bin" test "$SERVER_IP" -p "$fp_port" -u --find-max -l "$l" -t "$CONFIRM" \
        --trial "$TRIAL" "$@" --json >"$work/raw" 2>>"$work/errors" || { echo "n/a n/a"; return; }
    jq -r '.lengths[0] | if .loss_free then "\(.loss_free.payload_bps) \(.loss_free.packets_per_second)" else "n/a n/a" end' \
        "$work/raw" || echo "n/a n/a"
}

# record TOOL LENGTH FIELD VALUE: one sample.
record() { echo "$4" >>"$work/res-$1-$2-$3"; }
med() {
    if [ -f "$work/res-$1" ]; then median "${2:-%.4g}" <"$work/res-$1"; else echo "$NA"; fi
}

setup_veth "$NS_S" "$NS_C" "$VETH_S" "$VETH_C" "$SERVER_IP" "$CLIENT_IP" "$MTU"
start_server "$NS_S" fatpipe "$PORT_FATPIPE" "$FATPIPE" server --bind "$SERVER_IP" -p "$PORT_FATPIPE" -q ||
    die "fatpipe server did not start"
case " $TOOLS " in
    *" fatpipe-b "*)
        start_server "$NS_S" fatpipe-b "$PORT_FATPIPE_B" "$FATPIPE_B" server --bind "$SERVER_IP" -p "$PORT_FATPIPE_B" -q ||
            die "fatpipe-b server did not start" ;;
esac
start_server "$NS_S" iperf3 "$PORT_IPERF3" iperf3 -s -B "$SERVER_IP" -p "$PORT_IPERF3" ||
    die "iperf3 server did not start"

echo "veth MTU $MTU; lengths: $LENGTHS; $RUNS runs; ${DURATION}s flat out, find-max trials ${TRIAL}s + ${CONFIRM}s"
for run in $(seq "$RUNS"); do
    for l in $LENGTHS; do
        variants=()
        for t in $TOOLS; do variants+=("$t"); done
        case " $NB_LENGTHS " in *" $l "*) case " $TOOLS " in *" fatpipe "*) variants+=(fatpipe-nb) ;; esac ;; esac
        for v in "${variants[@]}"; do
            if [ "$v" = fatpipe-b ]; then fp_bin=$FATPIPE_B fp_port=$PORT_FATPIPE_B; else fp_bin=$FATPIPE fp_port=$PORT_FATPIPE; fi
            case $v in
                fatpipe | fatpipe-b) read -r s r b < <(fatpipe_max "$l") ;;
                fatpipe-nb) read -r s r b < <(fatpipe_max "$l" --no-batch) ;;
                *) read -r s r b < <("${v}_max" "$l") ;;
            esac
            record "$v" "$l" sent "$s"
            record "$v" "$l" recv "$r"
            record "$v" "$l" gbps "$(awk -v b="$b" 'BEGIN { if (b + 0 > 0) print b / 1e9; else print "n/a" }')"
            case $v in
                fatpipe | fatpipe-b) read -r fb fp < <(fatpipe_free "$l") ;;
                fatpipe-nb) read -r fb fp < <(fatpipe_free "$l" --no-batch) ;;
                *)
                    fb=$(peer_free "$v" "$l" "$b")
                    fp=$(awk -v b="$fb" -v l="$l" 'BEGIN { if (b + 0 > 0) print b / (l * 8); else print "n/a" }')
                    ;;
            esac
            record "$v" "$l" free "$(awk -v b="$fb" 'BEGIN { if (b + 0 > 0) print b / 1e9; else print "n/a" }')"
            record "$v" "$l" freepps "$fp"
            echo "run $run  $l B  $v: sent $s pps, received $r pps, loss-free ${fb} bit/s"
        done
    done
done

echo
echo "medians of $RUNS (veth MTU $MTU; rates are UDP payload)"
printf '%-7s %-11s %12s %12s %10s %15s %14s\n' length tool "sent pps" "recv pps" "recv Gb/s" "loss-free Gb/s" "loss-free pps"
for l in $LENGTHS; do
    for v in $TOOLS fatpipe-nb; do
        [ -f "$work/res-$v-$l-sent" ] || continue
        printf '%-7s %-11s %12s %12s %10s %15s %14s\n' "$l" "$v" "$(med "$v-$l-sent")" "$(med "$v-$l-recv")" \
            "$(med "$v-$l-gbps")" "$(med "$v-$l-free")" "$(med "$v-$l-freepps")"
    done
done

# best_peer LENGTH FIELD: the higher median of iperf3 and iperf2.
best_peer() {
    local best=$NA v m
    for v in iperf3 iperf2; do
        [ -f "$work/res-$v-$1-$2" ] || continue
        m=$(med "$v-$1-$2" %g)
        if is_num "$m" && { ! is_num "$best" || awk -v a="$m" -v b="$best" 'BEGIN { exit !(a > b) }'; }; then
            best=$m
        fi
    done
    echo "$best"
}

# target NAME VALUE GOAL: one line, met or MISSED.
target() {
    local verdict=MISSED
    is_num "$2" && awk -v a="$2" -v g="$3" 'BEGIN { exit !(a >= g) }' && verdict=met
    printf '  %-46s %8s  (target >= %s)  %s\n' "$1" "$2" "$3" "$verdict"
}

echo
echo "targets (issue 17)"
fp() { [ -f "$work/res-fatpipe-$1-$2" ] && med "fatpipe-$1-$2" %g || echo "$NA"; }
for pair in 64:10 1472:3 65507:1.0; do
    l=${pair%%:*} goal=${pair#*:}
    case " $LENGTHS " in *" $l "*) target "loss-free rate at $l B / best peer" "$(ratio "$(fp "$l" free)" "$(best_peer "$l" free)")" "$goal" ;; esac
done
case " $LENGTHS " in *" 64 "*)
    target "received pps at 64 B / best peer" "$(ratio "$(fp 64 recv)" "$(best_peer 64 recv)")" 20
    if [ -f "$work/res-fatpipe-nb-64-recv" ]; then
        target "batching: received pps at 64 B / --no-batch" "$(ratio "$(fp 64 recv)" "$(med fatpipe-nb-64-recv %g)")" 1.5
        target "batching: loss-free at 64 B / --no-batch" "$(ratio "$(fp 64 free)" "$(med fatpipe-nb-64-free %g)")" 1.5
    fi
    ;;
esac
if [[ " $TOOLS " == *" fatpipe-b "* ]]; then
    echo
    echo "fatpipe over fatpipe-b (FATPIPE_B), medians"
    for l in $LENGTHS; do
        for f in recv free; do
            printf '  %6s B  %-9s %8s\n' "$l" "$f" "$(ratio "$(fp "$l" "$f")" "$(med "fatpipe-b-$l-$f" %g)" %.3f)"
        done
    done
fi
if [ -s "$work/errors" ]; then
    echo
    echo "the tools' stderr, last lines (warnings, or why a value is n/a):"
    sort "$work/errors" | uniq -c | sort -rn | head -5
fi
