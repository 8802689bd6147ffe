# bench/lib.sh: helpers shared by the bench scripts. Source it, do not run it:
#
#     BENCH=vs-iperf                      # prefix of error messages
#     . "$(dirname "$0")/lib.sh"
#
# Defines: die, install_missing, build_fatpipe, median, ratio, is_num,
# start_server/stop_server/stop_servers (servers in a network namespace,
# ended by PID), setup_veth (two namespaces joined by a veth pair),
# proc_ticks, drop_work.
#
# Missing values: median prints "n/a" when it has no number, and ratio
# prints "n/a" when either side is not a number (or the divisor is not
# positive), so a tool that failed every run shows as n/a in every column
# that depends on it instead of as 0 or as an awk error.
#
# Variables it reads: BENCH (message prefix, default the script's name),
# FATPIPE (binary; build_fatpipe builds one when unset), work (a scratch
# directory, for server logs), KEEP=1 (drop_work keeps $work).
# Variables it sets: BENCH_ROOT (the repository), SERVER_PID (name -> PID).

BENCH=${BENCH:-$(basename "$0" .sh)}
BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NA=n/a
declare -A SERVER_PID=()

# die MESSAGE: one line on stderr, exit 2.
die() {
    echo "$BENCH: $*" >&2
    exit 2
}

# install_missing CMD:PACKAGE...: apt-get installs the packages whose
# command is not found.
install_missing() {
    local need=() pair cmd pkg
    for pair in "$@"; do
        cmd=${pair%%:*} pkg=${pair#*:}
        command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
    done
    if [ ${#need[@]} -gt 0 ]; then
        echo "installing: ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
}

# build_fatpipe: uses $FATPIPE if set (it must be executable), else builds
# the release binary with cargo and sets FATPIPE to it.
build_fatpipe() {
    if [ -n "${FATPIPE:-}" ]; then
        [ -x "$FATPIPE" ] || die "FATPIPE=$FATPIPE is not executable"
        return 0
    fi
    (cd "$BENCH_ROOT" && cargo build --release --quiet --bin fatpipe) || die "cargo build failed"
    FATPIPE="${CARGO_TARGET_DIR:-$BENCH_ROOT/target}/release/fatpipe"
    [ -x "$FATPIPE" ] || die "build did not produce $FATPIPE"
}

# is_num X: true when X is a number (awk syntax: 12, -1.5, 3e9).
is_num() {
    [[ $1 =~ ^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]]
}

# median [FMT]: median of the numbers on stdin, the first field of each
# line; lines whose first field is not a number (empty, nan, FAIL, n/a) are
# ignored. No numbers: "n/a". An odd count prints the middle value as read;
# an even count the mean of the two middle values with printf FMT (default
# %g).
median() {
    awk '$1 ~ /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/ { print $1 }' | sort -g |
        awk -v fmt="${1:-%g}" -v na="$NA" '{ v[NR] = $1 }
            END {
                if (NR == 0) print na
                else if (NR % 2) printf fmt "\n", v[(NR + 1) / 2]
                else printf fmt "\n", (v[NR / 2] + v[NR / 2 + 1]) / 2
            }'
}

# ratio A B [FMT]: A/B with printf FMT (default %.2f); "n/a" when A or B
# is not a number or B <= 0.
ratio() {
    if is_num "$1" && is_num "$2"; then
        awk -v a="$1" -v b="$2" -v fmt="${3:-%.2f}" -v na="$NA" \
            'BEGIN { if (b > 0) printf fmt "\n", a / b; else print na }'
    else
        echo "$NA"
    fi
}

# start_server NETNS NAME PORT CMD...: runs CMD in network namespace NETNS
# (an empty NETNS: the current one) (output in $work/server-NAME.log), records its PID in SERVER_PID[NAME]
# (`ip netns exec` execs, so $! is the server itself) and waits up to 10 s
# until TCP PORT listens. On failure prints the log's tail and returns 1.
start_server() {
    local ns=$1 name=$2 port=$3 i in_ns=()
    shift 3
    [ -z "$ns" ] || in_ns=(ip netns exec "$ns")
    "${in_ns[@]}" "$@" >"$work/server-$name.log" 2>&1 &
    SERVER_PID[$name]=$!
    for i in $(seq 100); do
        if "${in_ns[@]}" ss -Hltn "sport = :$port" | grep -q .; then
            return 0
        fi
        kill -0 "${SERVER_PID[$name]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "--- $name server log:" >&2
    tail -20 "$work/server-$name.log" >&2
    return 1
}

# stop_server NAME: ends that server by PID and reaps it.
stop_server() {
    local pid=${SERVER_PID[$1]:-}
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "SERVER_PID[$1]"
}

# stop_servers: ends every server start_server started.
stop_servers() {
    local name
    for name in "${!SERVER_PID[@]}"; do
        stop_server "$name"
    done
}

# setup_veth NS_A NS_B VETH_A VETH_B IP_A IP_B [MTU]: two fresh network
# namespaces joined by a veth pair, addresses IP_A/24 and IP_B/24, MTU
# (default 1500); checks with one ping that the pair passes traffic.
setup_veth() {
    local ns_a=$1 ns_b=$2 va=$3 vb=$4 ip_a=$5 ip_b=$6 mtu=${7:-1500}
    ip netns add "$ns_a"
    ip netns add "$ns_b"
    ip link add "$va" type veth peer name "$vb"
    ip link set "$va" netns "$ns_a"
    ip link set "$vb" netns "$ns_b"
    ip -n "$ns_a" addr add "$ip_a/24" dev "$va"
    ip -n "$ns_b" addr add "$ip_b/24" dev "$vb"
    ip -n "$ns_a" link set "$va" mtu "$mtu" up
    ip -n "$ns_b" link set "$vb" mtu "$mtu" up
    ip -n "$ns_a" link set lo up
    ip -n "$ns_b" link set lo up
    ip netns exec "$ns_b" ping -c 1 -W 2 "$ip_a" >/dev/null || die "veth link does not pass traffic"
}

# proc_ticks PID: CPU ticks (user+system, all threads) of a process so far.
proc_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

# drop_work: removes $work, or with KEEP=1 keeps it and says where.
drop_work() {
    [ -n "${work:-}" ] && [ -d "$work" ] || return 0
    if [ "${KEEP:-0}" = 1 ]; then
        echo "raw outputs kept in $work"
    else
        rm -rf "$work"
    fi
}
