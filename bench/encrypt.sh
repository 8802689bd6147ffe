#!/usr/bin/env bash
# bench/encrypt.sh: what --encrypt costs (docs/encryption.md, issue 16).
#
# 1. veth: two network namespaces joined by a veth pair (198.18.0.1/24
#    server, 198.18.0.2/24 client). A fatpipe server with a key and an
#    export; the client pushes one file of BIG_MB MiB (pseudo-random, page
#    cache warm) plaintext and --encrypt, alternating (the order rotates
#    each run), RUNS runs each; then `fatpipe test -t TEST_S` the same way.
#    Every copy is checked with cmp; a copy that differs is BAD and left
#    out of the medians. Prints medians (Gbit/s) and encrypted/plaintext.
# 2. lab: a 1 Gbit/s x 93 ms lab link (`fatpipe lab up`); one copy of
#    LAB_MB MiB each way of plaintext and --encrypt, alternating, auto-tuned
#    (no flags), LAB_RUNS runs; medians of the goodput after the pre-flight
#    probe. The issue's targets: veth ratio >= 0.7, lab >= 0.85 Gbit/s.
#
# Needs root (namespaces, the lab). Cleans up namespaces, the lab and the
# servers (by PID) on any exit.
#
# Settings (environment):
#   RUNS=3 BIG_MB=4096 STREAMS=4 TEST_S=5 LAB_RUNS=3 LAB_MB=1024 PARTS="veth lab"
#   FATPIPE=path/to/fatpipe (default: build with cargo --release)
set -euo pipefail

RUNS=${RUNS:-3}
BIG_MB=${BIG_MB:-4096}
STREAMS=${STREAMS:-4}
TEST_S=${TEST_S:-5}
LAB_RUNS=${LAB_RUNS:-3}
LAB_MB=${LAB_MB:-1024}
PARTS=${PARTS:-"veth lab"}

SERVER_IP=198.18.0.1
CLIENT_IP=198.18.0.2
NS_S="fpenc-s-$$"
NS_C="fpenc-c-$$"
VETH_S="fpe$$s"
VETH_C="fpe$$c"
PORT=5301
LAB="fpenc$$"

BENCH=encrypt
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d /var/tmp/fatpipe-encrypt.XXXXXX)
chmod 755 "$work"

cleanup() {
    stop_servers
    ip netns del "$NS_S" 2>/dev/null || true
    ip netns del "$NS_C" 2>/dev/null || true
    [ -n "${FATPIPE:-}" ] && "$FATPIPE" lab down "$LAB" >/dev/null 2>&1 || true
    drop_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces"
install_missing jq:jq ping:iputils-ping
build_fatpipe

(umask 077 && echo "encrypt-bench-key-$$-0123456789" >"$work/key")
mkdir -p "$work/export"
head -c $((BIG_MB << 20)) /dev/urandom >"$work/big.bin"
cat "$work/big.bin" >/dev/null

# copy_gbps NS HOST MODE DEST [ARGS...]: one push of big.bin, prints its
# goodput in Gbit/s (after the pre-flight, if any), or BAD / FAIL.
copy_gbps() {
    local ns=$1 host=$2 mode=$3 dest=$4 json
    shift 4
    local enc=()
    [ "$mode" = tls ] && enc=(--encrypt)
    rm -f "$work/export/$dest"
    if ! json=$(ip netns exec "$ns" "$FATPIPE" copy --json --key-file "$work/key" "${enc[@]}" "$@" \
        "$work/big.bin" "$host:data/$dest" 2>>"$work/client.log"); then
        echo FAIL
        return
    fi
    if ! cmp -s "$work/big.bin" "$work/export/$dest"; then
        echo BAD
        return
    fi
    jq -r '(.bytes_transferred * 8 / ((.seconds - (.auto.probe_secs // 0)) | if . <= 0 then 1e-9 else . end) / 1e9)' <<<"$json"
}

# test_gbps NS HOST MODE: one `fatpipe test`, prints the received Gbit/s.
test_gbps() {
    local ns=$1 host=$2 mode=$3 enc=()
    [ "$mode" = tls ] && enc=(--encrypt)
    ip netns exec "$ns" "$FATPIPE" test --json --key-file "$work/key" "${enc[@]}" -t "$TEST_S" \
        -P "$STREAMS" --no-auto "$host" 2>>"$work/client.log" |
        jq -r '.end.sums[0].bits_per_second / 1e9' || echo FAIL
}

# alternate RUNS FN ARGS...: FN plain / FN tls alternately (order rotating),
# appending each figure to $work/FN-MODE.
alternate() {
    local runs=$1 fn=$2 i mode v
    shift 2
    for i in $(seq "$runs"); do
        local order="plain tls"
        [ $((i % 2)) -eq 0 ] && order="tls plain"
        for mode in $order; do
            v=$("$fn" "$@" "$mode")
            echo "  run $i $fn $mode: $v"
            echo "$v" >>"$work/$fn-$mode"
        done
    done
}

row() {
    local what=$1 fn=$2 p t
    p=$(median %.2f <"$work/$fn-plain")
    t=$(median %.2f <"$work/$fn-tls")
    printf '%-34s %10s %10s %8s\n' "$what" "$p" "$t" "$(ratio "$t" "$p")"
}

veth_copy() { copy_gbps "$NS_C" "$SERVER_IP" "$1" big -P "$STREAMS" --no-auto; }
veth_test() { test_gbps "$NS_C" "$SERVER_IP" "$1"; }
lab_copy() { copy_gbps "$LAB_NS" "$LAB_B" "$1" lab; }

for part in $PARTS; do
    case $part in
    veth)
        setup_veth "$NS_S" "$NS_C" "$VETH_S" "$VETH_C" "$SERVER_IP" "$CLIENT_IP"
        start_server "$NS_S" veth "$PORT" "$FATPIPE" server --port "$PORT" --key-file "$work/key" \
            --export "data=$work/export" || die "server did not start"
        echo "veth: $RUNS x $BIG_MB MiB copies (-P $STREAMS) and $TEST_S s tests, alternating"
        alternate "$RUNS" veth_copy
        alternate "$RUNS" veth_test
        stop_server veth
        ;;
    lab)
        "$FATPIPE" lab up "$LAB" --rtt 93ms --rate 1gbit --owner $$ >/dev/null
        LAB_NS="fp-$LAB-a"
        LAB_B=198.18.0.2
        start_server "fp-$LAB-b" lab "$PORT" "$FATPIPE" server --port "$PORT" --key-file "$work/key" \
            --export "data=$work/export" || die "lab server did not start"
        head -c $((LAB_MB << 20)) "$work/big.bin" >"$work/lab.bin"
        # The lab copies send lab.bin: swap it in as big.bin's stand-in.
        mv "$work/big.bin" "$work/big.full"
        mv "$work/lab.bin" "$work/big.bin"
        echo "lab: 1 Gbit/s x 93 ms, $LAB_RUNS x $LAB_MB MiB auto-tuned copies, alternating"
        alternate "$LAB_RUNS" lab_copy
        mv "$work/big.bin" "$work/lab.bin"
        mv "$work/big.full" "$work/big.bin"
        stop_server lab
        "$FATPIPE" lab down "$LAB" >/dev/null
        ;;
    *) die "unknown part '$part' (veth, lab)" ;;
    esac
done

echo
echo "load: $(uptime)"
printf '%-34s %10s %10s %8s\n' "median Gbit/s" plaintext encrypted ratio
case " $PARTS " in *" veth "*)
    row "copy ${BIG_MB} MiB, veth, -P $STREAMS" veth_copy
    row "test ${TEST_S} s, veth, -P $STREAMS" veth_test
    ;;
esac
case " $PARTS " in *" lab "*)
    row "copy ${LAB_MB} MiB, 1G x 93 ms lab" lab_copy
    ;;
esac
