#!/usr/bin/env bash
# bench/cpu.sh: CPU per byte of one paced stream (issue 34: "no CPU added
# per byte"). One TCP stream paced at RATE (default 10G, SO_MAX_PACING_RATE
# through --fq-rate) over a veth pair between two network namespaces
# (198.18.0.1/24 server, 198.18.0.2/24 client), in both directions (the
# client sends; -R: the server sends), for:
#
#   fatpipe    FATPIPE: `fatpipe test --fq-rate RATE` against `fatpipe server`
#   fatpipe-b  FATPIPE_B (when set): a second build, e.g. the previous
#              release, with its own server
#   iperf3     `iperf3 -c --fq-rate RATE` against `iperf3 -s`
#
# The tools alternate within every run (the order rotates), RUNS runs, so
# that other load on the host hits all of them alike. CPU is measured the
# same way for every tool, not taken from the tools: the client's
# user+system time from /usr/bin/time, the server's from /proc/PID/stat
# before and after, both as % of one core over the client's wall time
# (iperf3's convention). Prints every run, then the medians per direction
# and tool (rate, client and server CPU, and which end sends), and the
# ratios fatpipe/fatpipe-b and fatpipe/iperf3 of each end's CPU % and of
# its CPU per byte (% per Gbit/s: fair when a tool misses the rate).
#
# Needs root (namespaces). Installs iperf3, jq and time with apt-get if
# missing. Cleans up namespaces and servers (by PID) on any exit.
#
# Settings (environment):
#   RUNS=5 DURATION=5 RATE=10G DIRS="send -R" MTU=1500
#   FATPIPE=path/to/fatpipe   (default: build with cargo --release)
#   FATPIPE_B=path/to/other/fatpipe (the ratio's divisor)
#   TOOLS="fatpipe fatpipe-b iperf3" (fatpipe-b only with FATPIPE_B)
#   FATPIPE_ARGS=""           (extra flags for fatpipe test)
#   NS_TAG=cpu                (in the namespaces' names, with the PID)
#   KEEP=1                    (keep every tool's raw output)
set -euo pipefail

RUNS=${RUNS:-5}
DURATION=${DURATION:-5}
RATE=${RATE:-10G}
DIRS=${DIRS:-"send -R"}
MTU=${MTU:-1500}
NS_TAG=${NS_TAG:-cpu}

SERVER_IP=198.18.0.1
CLIENT_IP=198.18.0.2
NS_S="fp-$NS_TAG-s-$$"
NS_C="fp-$NS_TAG-c-$$"
VETH_S="fpc$$s"
VETH_C="fpc$$c"
PORT_FATPIPE=5321
PORT_FATPIPE_B=5323
PORT_IPERF3=5221

BENCH=cpu
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
work=$(mktemp -d /tmp/fatpipe-cpu.XXXXXX)

cleanup() {
    stop_servers
    ip netns del "$NS_S" 2>/dev/null || true
    ip netns del "$NS_C" 2>/dev/null || true
    drop_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

install_missing iperf3:iperf3 jq:jq /usr/bin/time:time
build_fatpipe
default_tools="fatpipe iperf3"
if [ -n "${FATPIPE_B:-}" ]; then
    [ -x "$FATPIPE_B" ] || die "FATPIPE_B=$FATPIPE_B is not executable"
    default_tools="fatpipe fatpipe-b iperf3"
fi
TOOLS=${TOOLS:-$default_tools}
has() { [[ " $TOOLS " == *" $1 "* ]]; }
if has fatpipe-b && [ -z "${FATPIPE_B:-}" ]; then
    die "TOOLS has fatpipe-b but FATPIPE_B is not set"
fi
HZ=$(getconf CLK_TCK)

setup_veth "$NS_S" "$NS_C" "$VETH_S" "$VETH_C" "$SERVER_IP" "$CLIENT_IP" "$MTU"

start() { start_server "$NS_S" "$@" || die "$1 server did not start"; }
for t in $TOOLS; do
    case $t in
        fatpipe) start fatpipe $PORT_FATPIPE "$FATPIPE" server --bind $SERVER_IP --port $PORT_FATPIPE --quiet ;;
        fatpipe-b) start fatpipe-b $PORT_FATPIPE_B "$FATPIPE_B" server --bind $SERVER_IP --port $PORT_FATPIPE_B --quiet ;;
        iperf3) start iperf3 $PORT_IPERF3 iperf3 -s -B $SERVER_IP -p $PORT_IPERF3 ;;
        *) die "unknown tool $t" ;;
    esac
done

# run_client TOOL DIR OUT: one measurement; prints
# "gbps client_cpu_pct server_cpu_pct" or "FAIL reason".
run_client() {
    local tool=$1 dir=$2 out=$3
    local spid=${SERVER_PID[$tool]} t0 t1 gbps rev=()
    local -a cmd
    [ "$dir" = send ] || rev=(-R)
    case $tool in
        fatpipe | fatpipe-b)
            local bin=$FATPIPE port=$PORT_FATPIPE
            [ "$tool" = fatpipe ] || bin=$FATPIPE_B port=$PORT_FATPIPE_B
            # shellcheck disable=SC2086 # FATPIPE_ARGS is a list of flags
            cmd=("$bin" test $SERVER_IP --port "$port" -P 1 -t "${DURATION}s" --fq-rate "$RATE"
                --json "${rev[@]}" ${FATPIPE_ARGS:-}) ;;
        iperf3)
            cmd=(iperf3 -c $SERVER_IP -p $PORT_IPERF3 -P 1 -t "$DURATION" --fq-rate "$RATE" -J "${rev[@]}") ;;
    esac
    t0=$(proc_ticks "$spid")
    if ! ip netns exec "$NS_C" /usr/bin/time -f '%e %U %S' -o "$out.time" \
        "${cmd[@]}" >"$out" 2>"$out.err"; then
        echo "FAIL $(tail -1 "$out.err" | tr -s ' \n' ' ' | cut -c1-80)"
        return
    fi
    t1=$(proc_ticks "$spid")
    case $tool in
        # One stream, one direction: its one sum is the receiver's.
        fatpipe | fatpipe-b) gbps=$(jq -r '[.end.sums[] | .bits_per_second] | add / 1e9' "$out") ;;
        iperf3) gbps=$(jq -r '.end.sum_received.bits_per_second / 1e9' "$out") ;;
    esac
    is_num "${gbps:-}" || { echo "FAIL unparsable output"; return; }
    # time's last line: wall user sys (earlier lines may be warnings).
    tail -1 "$out.time" | awk -v g="$gbps" -v d="$((t1 - t0))" -v hz="$HZ" \
        '{ printf "%.2f %.1f %.1f\n", g, ($2 + $3) / $1 * 100, d / hz / $1 * 100 }'
}

read -r -a tools <<<"$TOOLS"
: >"$work/res"
for dir in $DIRS; do
    for run in $(seq "$RUNS"); do
        for i in "${!tools[@]}"; do
            # Rotate the order each run so no tool always goes first.
            k=$(((i + run - 1) % ${#tools[@]}))
            tool=${tools[$k]}
            r=$(run_client "$tool" "$dir" "$work/out-$tool-${dir#-}-$run")
            echo "$dir run $run $tool: $r (Gbit/s, client %, server %)"
            echo "$dir $tool $r" >>"$work/res"
        done
    done
done

# col DIR TOOL FIELD: median of a field (2 rate, 3 client %, 4 server %,
# 5 client % per Gbit/s, 6 server % per Gbit/s) over the successful runs.
col() {
    awk -v d="$1" -v t="$2" -v f="$3" '$1 == d && $2 == t && $3 != "FAIL" && $3 > 0 {
        v[2] = $3; v[3] = $4; v[4] = $5; v[5] = $4 / $3; v[6] = $5 / $3; print v[f] }' \
        "$work/res" | median %.2f
}

echo
echo "medians of $RUNS runs, one stream at --fq-rate $RATE over veth, CPU in % of one core:"
fmt='%-5s %-10s %7s %7s %7s %9s %9s %s\n'
printf "$fmt" dir tool Gbit/s cli% srv% cli%/Gb srv%/Gb "(sender)"
for dir in $DIRS; do
    sender=client
    [ "$dir" = send ] || sender=server
    for tool in "${tools[@]}"; do
        printf "$fmt" "$dir" "$tool" "$(col "$dir" "$tool" 2)" "$(col "$dir" "$tool" 3)" \
            "$(col "$dir" "$tool" 4)" "$(col "$dir" "$tool" 5)" "$(col "$dir" "$tool" 6)" "$sender"
    done
done

ratios() { # ratios LABEL TOOL_A TOOL_B
    local dir
    echo
    echo "$1: CPU % and CPU per byte, $2 over $3 (<= 1.00: no more CPU)"
    printf '%-5s %8s %8s %10s %10s\n' dir cli% srv% cli%/Gb srv%/Gb
    for dir in $DIRS; do
        printf '%-5s %8s %8s %10s %10s\n' "$dir" \
            "$(ratio "$(col "$dir" "$2" 3)" "$(col "$dir" "$3" 3)")" \
            "$(ratio "$(col "$dir" "$2" 4)" "$(col "$dir" "$3" 4)")" \
            "$(ratio "$(col "$dir" "$2" 5)" "$(col "$dir" "$3" 5)")" \
            "$(ratio "$(col "$dir" "$2" 6)" "$(col "$dir" "$3" 6)")"
    done
}
if has fatpipe && has fatpipe-b; then ratios "new/old" fatpipe fatpipe-b; fi
if has fatpipe && has iperf3; then ratios "fatpipe/iperf3" fatpipe iperf3; fi
