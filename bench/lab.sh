#!/usr/bin/env bash
# Benchmark of `fatpipe lab`, the user-space long-fat-network emulator.
#
#  1. Ceiling: iperf3 TCP, 1 and 4 streams, through a lab link with no delay
#     and no rate limit, against a plain veth pair between two namespaces
#     (what the kernel does without any emulator). Target: lab >= 0.9x veth.
#  2. Sustained: iperf3 TCP through a 5 Gbit/s x 93 ms lab link with
#     BDP-sized windows (the reference: what the lab carries when the
#     sender is tuned by hand). Target: >= 0.9x the rate.
#  3. Fill: `fatpipe test` with no flags (auto-tuned) over the same link,
#     FILL_RUNS runs; each run's Gbit/s and the median. Target: >= 4.5.
#     Also each run's ramp and final rate (its JSON's end.ramp): the 10 s
#     mean carries the first second's slow start, the iperf3 rows omit
#     their first 4 s (-O 4).
#  The forwarder's CPU use (percent of one core) is sampled over each run.
#
# Runs alternate between the peers; the table shows medians and ratios.
# A benchmark, not a test: it prints numbers and never fails on them.
#
# Needs root. Installs iperf3 with apt-get if missing; builds fatpipe
# (cargo build --release) unless FATPIPE is given.
# Environment: FATPIPE (binary), RUNS (default 5), SECS (default 5),
#              SUSTAINED_SECS (default 12), SUSTAINED_RUNS (default 3;
#              0 skips the sustained and fill parts), FILL_RUNS (default 3),
#              LAB, LAB5, VA, VB (names of the labs and the veth
#              namespaces, to run beside someone else's copy of this).
set -euo pipefail
BENCH=lab
. "$(dirname "$0")/lib.sh"
cd "$BENCH_ROOT"

RUNS=${RUNS:-5}
SECS=${SECS:-5}
SUSTAINED_SECS=${SUSTAINED_SECS:-12}
SUSTAINED_RUNS=${SUSTAINED_RUNS:-3}
LAB=${LAB:-fpbench}
LAB5=${LAB5:-fpbench5}
VA=${VA:-fpb-veth-a}
VB=${VB:-fpb-veth-b}
# The last /30 of 198.18.0.0/15, far from the labs' own (allocated from the bottom).
VETH_A=198.19.255.253
VETH_B=198.19.255.254
FILL_RUNS=${FILL_RUNS:-3}
PORT=5999
FP_PORT=5998

[ "$(id -u)" = 0 ] || die "needs root (namespaces, TUN)"
install_missing iperf3:iperf3 python3:python3
build_fatpipe

OLD_RMEM=$(sysctl -n net.core.rmem_max)
OLD_WMEM=$(sysctl -n net.core.wmem_max)
cleanup() {
  "$FATPIPE" lab down "$LAB" >/dev/null 2>&1 || true
  "$FATPIPE" lab down "$LAB5" >/dev/null 2>&1 || true
  for ns in "$VA" "$VB"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  sysctl -qw net.core.rmem_max="$OLD_RMEM" net.core.wmem_max="$OLD_WMEM" || true
}
trap cleanup EXIT INT TERM
cleanup

# iperf3 client in namespace $1 to $2; extra args follow. Prints Gbit/s received.
iperf() {
  local ns=$1 dst=$2; shift 2
  ip netns exec "$ns" iperf3 -c "$dst" -p "$PORT" -J "$@" 2>/dev/null |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9, 3))' 2>/dev/null ||
    echo 0
}

# CPU ticks (user+system) of the forwarder of lab $1.
ticks() { proc_ticks "$(cat "/run/fatpipe-lab/$1/pid")"; }
HZ=$(getconf CLK_TCK)

# Runs iperf on lab $1 with args; prints "Gbit/s cpu%".
lab_run() {
  local lab=$1 secs=$2; shift 2
  local t0 t1 g s0 s1
  t0=$(ticks "$lab"); s0=$(date +%s.%N)
  g=$(iperf "fp-$lab-a" "$(lab_addr "$lab")" -t "$secs" "$@")
  t1=$(ticks "$lab"); s1=$(date +%s.%N)
  echo "$g $(awk -v a="$t0" -v b="$t1" -v hz="$HZ" -v s0="$s0" -v s1="$s1" 'BEGIN{printf "%.0f", (b-a)/hz/(s1-s0)*100}')"
}

lab_addr() { ip -n "fp-$1-b" -4 -o addr show dev lab-b | awk '{split($4,a,"/"); print a[1]}'; }

echo "== setup: veth pair and lab '$LAB' (no delay, no rate limit)"
ip netns add "$VA"; ip netns add "$VB"
ip link add fpbv0 netns "$VA" type veth peer name fpbv1 netns "$VB"
ip -n "$VA" link set lo up; ip -n "$VB" link set lo up
ip -n "$VA" addr add "$VETH_A/30" dev fpbv0; ip -n "$VB" addr add "$VETH_B/30" dev fpbv1
ip -n "$VA" link set fpbv0 up; ip -n "$VB" link set fpbv1 up
"$FATPIPE" lab up "$LAB" --queue unlimited --owner $$ >/dev/null
LAB_B=$(lab_addr "$LAB")
ip netns exec "$VB" iperf3 -s -D -p "$PORT"
ip netns exec "fp-$LAB-b" iperf3 -s -D -p "$PORT"
sleep 0.5

declare -A R
STATS=""
for run in $(seq "$RUNS"); do
  for p in 1 4; do
    v=$(iperf "$VA" "$VETH_B" -t "$SECS" -P "$p")
    read -r l c < <(lab_run "$LAB" "$SECS" -P "$p")
    R[veth$p]+="$v "; R[lab$p]+="$l "; R[cpu$p]+="$c "
    echo "run $run, $p stream(s): veth $v Gbit/s, lab $l Gbit/s (forwarder ${c}% of a core)"
  done
done
"$FATPIPE" lab down "$LAB" >/dev/null

if [ "$SUSTAINED_RUNS" -gt 0 ]; then
  echo "== setup: lab '$LAB5' 5 Gbit/s x 93 ms, queue 1 BDP"
  "$FATPIPE" lab up "$LAB5" --rtt 93ms --rate 5gbit --queue 1bdp --owner $$ >/dev/null
  # The fill: what auto-tuning reaches on the link with no flags at all (the
  # default 10 s test; JSON only to read the figure), with the host's and the
  # namespaces' buffer limits as a new user has them.
  ip netns exec "fp-$LAB5-b" "$FATPIPE" server --port "$FP_PORT" --quiet >/dev/null 2>&1 &
  FP_SERVER=$!
  sleep 0.5
  FILLS=""
  for run in $(seq "$FILL_RUNS"); do
    t0=$(ticks "$LAB5"); s0=$(date +%s.%N)
    # The mean over the whole test (what the user sees), and from the same
    # run the test's own ramp (start to 90 % of the final rate) and final
    # rate (the second half's), since at 93 ms slow start takes most of the
    # first second of a 10 s test.
    read -r f fr ramp < <(ip netns exec "fp-$LAB5-a" "$FATPIPE" test "$(lab_addr "$LAB5"):$FP_PORT" --json 2>/dev/null |
      python3 -c 'import json,sys
e = json.load(sys.stdin)["end"]; r = e.get("ramp") or {}
print(round(e["sums"][0]["bits_per_second"]/1e9, 3), round((r.get("final_rate") or 0)/1e9, 3), round(r.get("secs") or 0, 2))' 2>/dev/null ||
      echo 0 0 0)
    t1=$(ticks "$LAB5"); s1=$(date +%s.%N)
    c=$(awk -v a="$t0" -v b="$t1" -v hz="$HZ" -v s0="$s0" -v s1="$s1" 'BEGIN{printf "%.0f", (b-a)/hz/(s1-s0)*100}')
    R[fill]+="$f "; R[fc]+="$c "; R[ffinal]+="$fr "; R[framp]+="$ramp "; FILLS+="${FILLS:+, }$f"
    echo "fill run $run: fatpipe test (no flags) $f Gbit/s, final rate $fr, ramp $ramp s (${c}%)"
  done
  kill "$FP_SERVER" 2>/dev/null || true
  wait "$FP_SERVER" 2>/dev/null || true
  echo "== buffers raised for 58 MB windows (iperf3 -w)"
  sysctl -qw net.core.rmem_max=268435456 net.core.wmem_max=268435456
  for end in a b; do
    ip netns exec "fp-$LAB5-$end" sysctl -qw net.ipv4.tcp_rmem="4096 131072 268435456" \
      net.ipv4.tcp_wmem="4096 131072 268435456"
  done
  ip netns exec "fp-$LAB5-b" iperf3 -s -D -p "$PORT"
  sleep 0.5
  # Window: 5 Gbit/s x 93 ms = 58 MB; iperf3 -w sets the socket buffers.
  for run in $(seq "$SUSTAINED_RUNS"); do
    read -r l c < <(lab_run "$LAB5" "$SUSTAINED_SECS" -O 4 -w 60M)
    read -r l4 c4 < <(lab_run "$LAB5" "$SUSTAINED_SECS" -O 4 -P 4 -w 16M)
    R[s1]+="$l "; R[sc1]+="$c "; R[s4]+="$l4 "; R[sc4]+="$c4 "
    echo "run $run: 1 stream $l Gbit/s (${c}%), 4 streams $l4 Gbit/s (${c4}%)"
  done
  STATS=$("$FATPIPE" lab stats "$LAB5")
fi

m() { echo "${R[$1]:-}" | tr ' ' '\n' | grep -v '^$' | median; }
echo
echo "## fatpipe lab benchmark ($(nproc) cores, $(uname -r), medians of $RUNS / $SUSTAINED_RUNS alternating runs)"
echo
echo "| test | veth Gbit/s | lab Gbit/s | lab / reference | target | forwarder CPU |"
echo "|---|---|---|---|---|---|"
for p in 1 4; do
  echo "| ceiling, $p stream(s), no delay/rate | $(m veth$p) | $(m lab$p) | $(ratio "$(m lab$p)" "$(m veth$p)") x veth | >= 0.9 | $(m cpu$p)% |"
done
if [ "$SUSTAINED_RUNS" -gt 0 ]; then
  echo "| 5 Gbit/s x 93 ms, 1 stream -w 60M | - | $(m s1) | $(ratio "$(m s1)" 5) x rate | >= 0.9 | $(m sc1)% |"
  echo "| 5 Gbit/s x 93 ms, 4 streams -w 16M | - | $(m s4) | $(ratio "$(m s4)" 5) x rate | >= 0.9 | $(m sc4)% |"
  echo "| 5 Gbit/s x 93 ms, fill: fatpipe test, no flags (runs: $FILLS) | - | $(m fill) | $(ratio "$(m fill)" 5) x rate | >= 4.5 Gbit/s | $(m fc)% |"
  echo "| the same runs' final rate (second half; ramp $(m framp) s) | - | $(m ffinal) | $(ratio "$(m ffinal)" 5) x rate | - | - |"
fi
if [ -n "$STATS" ]; then
  echo
  echo "lab stats after the sustained and fill runs:"
  echo "$STATS"
fi
