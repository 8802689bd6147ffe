#!/usr/bin/env bash
# bench/vs-copy-peers.sh: fatpipe copy against GridFTP (globus-url-copy),
# xrdcp, an rsync daemon and scp, with local cp -r as the physical reference.
#
# Two network namespaces joined by a veth pair (198.18.0.1/24 server side,
# 198.18.0.2/24 client side, RFC 2544 benchmarking range). Every server runs
# in the server namespace, every client in the client namespace; both see
# the same file system, so each tool pushes the same source tree into its
# own destination directory. Page cache is warm (the source is read once
# before the first run), as in issue 4's reference figures.
#
# Datasets: one big file of pseudo-random data (BIG_MB, default 4096 MiB)
# and SMALL_FILES files of SMALL_SIZE bytes (default 20,000 x 16 KiB) in
# nested directories. Each tool gets its best parallel/pipelining options:
#   fatpipe  -P $STREAMS, chunks shared by all streams, small files batched,
#            big files written with O_DIRECT (its default)
#   fatpipe-buffered  the same with --buffered (page-cache writes)
#   GridFTP  globus-url-copy -p $STREAMS (big), -cc $INFLIGHT -pp (small), -fast
#   xrdcp    --streams $STREAMS (big), --parallel $INFLIGHT (small)
#   rsync    daemon, -a -W (whole files; rsync has no parallelism)
#   scp      aes128-gcm, one connection (scp has no parallelism)
#   cp -r    local copy, the physical limit of this disk/page cache
#
# Durable copy (DURABLE=1, the default): `dd if=/dev/zero bs=4M
# oflag=direct` of BIG_MB against `fatpipe copy --sync` of the big file
# pushed and pulled into the same file system (the copy reports done only
# once its data is on disk), alternating, RUNS runs; prints each one's
# median rate and fatpipe/dd (target >= 0.9). The source is the warm
# page cache, so only the destination's writes are measured.
#
# Every copy is verified (cmp for the big file, diff -r for the tree) and a
# copy that differs is reported BAD and left out of the medians. Tools
# alternate within each run, rotating the order, so drift hits all alike;
# RUNS runs, medians and ratios printed. Peak RSS: the client's from
# /usr/bin/time, the fatpipe server's VmHWM (restarted per dataset).
#
# Needs root (namespaces). Installs its apt packages if missing. Cleans up
# namespaces and servers (by PID) on any exit.
#
# Settings (environment):
#   RUNS=3 BIG_MB=4096 SMALL_FILES=20000 SMALL_SIZE=16384 STREAMS=4 INFLIGHT=8
#   TOOLS="cp fatpipe gridftp xrdcp rsync scp"  DATASETS="big small"  DURABLE=1
#   FATPIPE=path/to/fatpipe (default: build with cargo --release)
#   FATPIPE_B=path/to/other/fatpipe  a second build (e.g. the one before a
#                             change): the durable copy also runs its push
#                             and pull (its own server, same export),
#                             alternating with the first, and prints the
#                             ratios b/first
set -euo pipefail

RUNS=${RUNS:-3}
BIG_MB=${BIG_MB:-4096}
SMALL_FILES=${SMALL_FILES:-20000}
SMALL_SIZE=${SMALL_SIZE:-16384}
STREAMS=${STREAMS:-4}
INFLIGHT=${INFLIGHT:-8}
TOOLS=${TOOLS-"cp fatpipe fatpipe-buffered gridftp xrdcp rsync scp"}
DATASETS=${DATASETS-"big small"}
DURABLE=${DURABLE:-1}

SERVER_IP=198.18.0.1
CLIENT_IP=198.18.0.2
NS_S="fpcopy-s-$$"
NS_C="fpcopy-c-$$"
VETH_S="fpc$$s"
VETH_C="fpc$$c"
PORT_FATPIPE=5301
PORT_FATPIPE_B=5302
PORT_GRIDFTP=2811
PORT_XROOTD=1094
PORT_RSYNC=8730
PORT_SSH=2222

BENCH=vs-copy-peers
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d /var/tmp/fatpipe-vs-copy.XXXXXX)
chmod 755 "$work"

cleanup() {
    stop_servers
    ip netns del "$NS_S" 2>/dev/null || true
    ip netns del "$NS_C" 2>/dev/null || true
    rm -rf "/etc/netns/$NS_S" "/etc/netns/$NS_C" "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces"

install_peers() {
    # Only the peers in TOOLS (TOOLS= DATASETS= SMALL_FILES=0 runs the durable
    # section alone).
    local need=(jq:jq /usr/bin/time:time python3:python3) t
    for t in $TOOLS; do
        case $t in
            gridftp) need+=(globus-url-copy:globus-gass-copy-progs globus-gridftp-server:globus-gridftp-server-progs) ;;
            xrdcp) need+=(xrdcp:xrootd-client xrootd:xrootd-server) ;;
            rsync) need+=(rsync:rsync) ;;
            scp) need+=(/usr/sbin/sshd:openssh-server scp:openssh-client) ;;
        esac
    done
    install_missing "${need[@]}"
}

setup_net() {
    # Per-namespace /etc/hosts (ip netns exec bind-mounts these): the
    # GridFTP server looks its own address and host name up, and there is
    # no DNS here.
    local ns
    for ns in "$NS_S" "$NS_C"; do
        mkdir -p "/etc/netns/$ns"
        printf '127.0.0.1 localhost\n%s fpbench-server %s\n%s fpbench-client\n' \
            "$SERVER_IP" "$(hostname)" "$CLIENT_IP" >"/etc/netns/$ns/hosts"
        : >"/etc/netns/$ns/resolv.conf"
    done
    setup_veth "$NS_S" "$NS_C" "$VETH_S" "$VETH_C" "$SERVER_IP" "$CLIENT_IP"
}

make_data() {
    mkdir -p "$work/src"
    echo "making datasets: ${BIG_MB} MiB file, $SMALL_FILES x $SMALL_SIZE B files"
    python3 - "$work/src" "$BIG_MB" "$SMALL_FILES" "$SMALL_SIZE" <<'EOF'
import os, sys
root, big_mb, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
block = os.urandom(64 << 20)
with open(os.path.join(root, "big.bin"), "wb") as f:
    left = big_mb << 20
    i = 0
    while left > 0:
        b = block[i % 4096:] + block[:i % 4096]  # no two blocks alike
        f.write(b[:min(left, len(b))])
        left -= min(left, len(b))
        i += 1
seed = os.urandom(size + 4096)
for k in range(n):
    d = os.path.join(root, "small", "d%02d" % (k // 1000), "e%d" % (k // 100 % 10))
    if k % 100 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % k), "wb") as f:
        f.write(seed[k % 4096:k % 4096 + size])
EOF
    # Warm the page cache, as in the reference figures.
    cat "$work/src/big.bin" >/dev/null
    if [ -d "$work/src/small" ]; then find "$work/src/small" -type f -exec cat {} + >/dev/null; fi
}

# start NAME PORT CMD...: a server in the server namespace (see lib.sh);
# returns 1 (after printing its log's tail) if it does not listen.
start() { start_server "$NS_S" "$@"; }

# Destinations are world-writable: some servers drop to an unprivileged user.
dest() { mkdir -p "$work/dst/$1" && chmod 1777 "$work/dst/$1" && echo "$work/dst/$1"; }

start_fatpipe() {
    (umask 077 && echo "fatpipe-bench-key-$$" >"$work/key")
    start fatpipe $PORT_FATPIPE "$FATPIPE" server --bind $SERVER_IP --port $PORT_FATPIPE \
        --key-file "$work/key" --export "dst=$(dest fatpipe)" --export "dstb=$(dest fatpipe-buffered)" \
        --export "dur=$(dest durable)" --export "src=$work/src" -q
}

# The second build's server (FATPIPE_B), on the same durable export.
start_fatpipe_b() {
    [ -f "$work/key" ] || (umask 077 && echo "fatpipe-bench-key-$$" >"$work/key")
    start fatpipe-b $PORT_FATPIPE_B "$FATPIPE_B" server --bind $SERVER_IP --port $PORT_FATPIPE_B \
        --key-file "$work/key" --export "dur=$(dest durable)" --export "src=$work/src" -q
}

start_servers() {
    local t failed=()
    for t in $TOOLS; do
        case $t in
            cp) dest cp >/dev/null ;;
            fatpipe) start_fatpipe || failed+=("$t") ;;
            fatpipe-buffered)
                # Same server as fatpipe (started with it, or now).
                dest fatpipe-buffered >/dev/null
                [ -n "${SERVER_PID[fatpipe]:-}" ] || start_fatpipe || failed+=("$t") ;;
            gridftp)
                # Anonymous mode: no certificates; -s forks per connection in the
                # foreground (non-forked root servers take one connection). It maps anonymous
                # users to nobody, hence the world-writable destination.
                dest gridftp >/dev/null
                # It resolves its own host name, which fails inside the namespace.
                start gridftp $PORT_GRIDFTP env GLOBUS_HOSTNAME=$SERVER_IP globus-gridftp-server -aa -anonymous-user nobody \
                    -p $PORT_GRIDFTP -control-interface $SERVER_IP -data-interface $SERVER_IP \
                    -s -log-level error || failed+=("$t") ;;
            xrdcp)
                dest xrdcp >/dev/null
                mkdir -p "$work/xrd" && chmod 1777 "$work/xrd"
                cat >"$work/xrootd.cfg" <<EOF
xrd.port $PORT_XROOTD
all.export $work/dst/xrdcp
EOF
                start xrdcp $PORT_XROOTD xrootd -c "$work/xrootd.cfg" -l "$work/xrd/xrootd.log" \
                    -n fpbench -R nobody -a "$work/xrd/admin" || failed+=("$t") ;;
            rsync)
                cat >"$work/rsyncd.conf" <<EOF
uid = root
gid = root
use chroot = no
pid file = $work/rsyncd.pid
[dst]
    path = $(dest rsync)
    read only = false
EOF
                start rsync $PORT_RSYNC rsync --daemon --no-detach --config="$work/rsyncd.conf" \
                    --address=$SERVER_IP --port=$PORT_RSYNC || failed+=("$t") ;;
            scp)
                dest scp >/dev/null
                mkdir -p /run/sshd
                ssh-keygen -q -t ed25519 -N '' -f "$work/hostkey" <<<y >/dev/null
                ssh-keygen -q -t ed25519 -N '' -f "$work/clientkey" <<<y >/dev/null
                cp "$work/clientkey.pub" "$work/authorized_keys"
                cat >"$work/sshd_config" <<EOF
ListenAddress $SERVER_IP
Port $PORT_SSH
HostKey $work/hostkey
PermitRootLogin prohibit-password
AuthorizedKeysFile $work/authorized_keys
StrictModes no
UsePAM no
PidFile none
Subsystem sftp internal-sftp
EOF
                start scp $PORT_SSH /usr/sbin/sshd -D -e -f "$work/sshd_config" || failed+=("$t") ;;
            *) die "unknown tool $t" ;;
        esac
    done
    if [ ${#failed[@]} -gt 0 ]; then
        echo "could not start: ${failed[*]} (left out)"
        local keep=() x
        for x in $TOOLS; do
            case " ${failed[*]} " in *" $x "*) ;; *) keep+=("$x") ;; esac
        done
        TOOLS="${keep[*]}"
    fi
}

# client_cmd TOOL DATASET RUN: the command that copies DATASET into TOOL's
# destination for this run (run in the client namespace, except cp).
client_cmd() {
    local tool=$1 ds=$2 run=$3 src d
    d="$work/dst/$tool/$ds-$run"
    case $ds in big) src="$work/src/big.bin" ;; small) src="$work/src/small" ;; esac
    case $tool in
        cp) echo cp -r "$src" "$d/" ;;
        fatpipe) echo "$FATPIPE" copy --port $PORT_FATPIPE --key-file "$work/key" -P "$STREAMS" -r -q \
            "$src" "$SERVER_IP:dst/$ds-$run/" ;;
        fatpipe-buffered) echo "$FATPIPE" copy --port $PORT_FATPIPE --key-file "$work/key" -P "$STREAMS" -r -q \
            --buffered "$src" "$SERVER_IP:dstb/$ds-$run/" ;;
        gridftp)
            case $ds in
                big) echo globus-url-copy -fast -p "$STREAMS" -tcp-bs 4194304 "file://$src" \
                    "ftp://$SERVER_IP:$PORT_GRIDFTP$d/big.bin" ;;
                small) echo globus-url-copy -fast -r -cd -cc "$INFLIGHT" -pp "file://$src/" \
                    "ftp://$SERVER_IP:$PORT_GRIDFTP$d/small/" ;;
            esac ;;
        xrdcp)
            case $ds in
                big) echo xrdcp -s -f --streams "$STREAMS" "$src" "root://$SERVER_IP:$PORT_XROOTD/$d/big.bin" ;;
                small) echo xrdcp -s -f -r --parallel "$INFLIGHT" "$src" "root://$SERVER_IP:$PORT_XROOTD/$d/" ;;
            esac ;;
        rsync) echo rsync -a -W "$src" "rsync://$SERVER_IP:$PORT_RSYNC/dst/$ds-$run/" ;;
        scp) echo scp -q -r -P $PORT_SSH -i "$work/clientkey" -o StrictHostKeyChecking=no \
            -o UserKnownHostsFile=/dev/null -c aes128-gcm@openssh.com "$src" "root@$SERVER_IP:$d/" ;;
    esac
}

verify() { # verify TOOL DATASET RUN
    local d="$work/dst/$1/$2-$3"
    case $2 in
        big) cmp -s "$work/src/big.bin" "$d/big.bin" ;;
        small) diff -rq "$work/src/small" "$d/small" >/dev/null ;;
    esac
}

# run_one TOOL DATASET RUN: prints "seconds client_rss_kib" or "FAIL ..."/"BAD".
# Each run writes into a fresh directory. Small-file trees are kept until
# the end: deleting 20,000 files right before the next run would make ext4
# search for inodes not recently freed, a cost of the benchmark, not of
# any tool. Big files are deleted (space) - one inode does not matter.
run_one() {
    local tool=$1 ds=$2 run=$3 out="$work/out-$1-$2-$3"
    local -a cmd
    read -r -a cmd <<<"$(client_cmd "$tool" "$ds" "$run")"
    rm -rf "$work/dst/$tool/big-"*
    mkdir -p "$work/dst/$tool/$ds-$run"
    chmod 1777 "$work/dst/$tool/$ds-$run"
    sync
    local -a wrap=(/usr/bin/time -f '%e %M' -o "$out.time")
    if [ "$tool" != cp ]; then
        wrap=(ip netns exec "$NS_C" "${wrap[@]}")
    fi
    if ! "${wrap[@]}" "${cmd[@]}" >"$out" 2>"$out.err"; then
        echo "FAIL $(tail -1 "$out.err" | tr -s ' \n' ' ' | cut -c1-100)"
        return
    fi
    if ! verify "$tool" "$ds" "$run"; then
        echo "BAD (copy differs from source)"
        return
    fi
    # Big copies go at once, so they do not push the source out of the cache.
    [ "$ds" = big ] && rm -rf "$work/dst/$tool/big-$run"
    tail -1 "$out.time"
}

# durable_one dd|push|pull|push-b|pull-b RUN: prints the seconds dd or a `copy --sync` of
# the big file into $work/dst/durable took (the fatpipe server's `dur`
# export; a pull writes there from the client side), or "FAIL ..."/"BAD".
durable_one() {
    local what=$1 run=$2 d="$work/dst/durable" out="$work/out-durable-$1-$2" t0 t1
    local -a cmd
    local -a copy=(ip netns exec "$NS_C" "$FATPIPE" copy --port $PORT_FATPIPE --key-file "$work/key" -P "$STREAMS" -q --sync)
    case $what in
        *-b) copy=(ip netns exec "$NS_C" "$FATPIPE_B" copy --port $PORT_FATPIPE_B --key-file "$work/key" -P "$STREAMS" -q --sync)
            what=${what%-b} ;;
    esac
    case $what in
        dd) cmd=(dd if=/dev/zero of="$d/x" bs=4M count=$((BIG_MB / 4)) oflag=direct status=none) ;;
        push) cmd=("${copy[@]}" "$work/src/big.bin" "$SERVER_IP:dur/") ;;
        pull) cmd=("${copy[@]}" "$SERVER_IP:src/big.bin" "$d/") ;;
    esac
    rm -rf "${d:?}"/* "$d"/.fatpipe-*
    sync
    t0=$(date +%s.%N)
    if ! "${cmd[@]}" >"$out" 2>"$out.err"; then
        echo "FAIL $(tail -1 "$out.err" | tr -s ' \n' ' ' | cut -c1-100)"
        return
    fi
    t1=$(date +%s.%N)
    if [ "$what" != dd ] && ! cmp -s "$work/src/big.bin" "$d/big.bin"; then
        echo "BAD (copy differs from source)"
        return
    fi
    rm -rf "${d:?}"/*
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}

# durable: dd oflag=direct against fatpipe copy --sync push and pull, the
# order rotating per run; medians and fatpipe/dd.
durable() {
    local kinds=(dd push pull) run i k r load
    [ -n "${SERVER_PID[fatpipe]:-}" ] || start_fatpipe || die "fatpipe server did not start"
    if [ -n "${FATPIPE_B:-}" ]; then
        [ -x "$FATPIPE_B" ] || die "FATPIPE_B=$FATPIPE_B is not executable"
        start_fatpipe_b || die "the FATPIPE_B server did not start"
        kinds+=(push-b pull-b)
    fi
    read -r load _ </proc/loadavg
    echo
    echo "durable copy: dd bs=4M oflag=direct vs fatpipe copy --sync -P $STREAMS, ${BIG_MB} MiB into $(df --output=source,fstype "$work" | tail -1 | tr -s ' '), load before: $load"
    for run in $(seq "$RUNS"); do
        for i in "${!kinds[@]}"; do
            k=${kinds[$(((i + run - 1) % ${#kinds[@]}))]}
            r=$(durable_one "$k" "$run")
            echo "  durable run $run $k: $r"
            echo "durable|$k|$r" >>"$work/res"
        done
    done
    local dd push pull ddmb=$((BIG_MB / 4 * 4))
    dd=$(awk -v s="$(col durable dd 1)" -v mb="$ddmb" 'BEGIN { if (s == "n/a" || s == 0) print "n/a"; else printf "%.2f", mb * 1048576 / s / 1e9 }')
    push=$(rate big "$(col durable push 1)")
    pull=$(rate big "$(col durable pull 1)")
    echo "durable: dd $dd GB/s, push $push GB/s, pull $pull GB/s (medians of $RUNS); push/dd = $(ratio "$push" "$dd"), pull/dd = $(ratio "$pull" "$dd") (target >= 0.9)"
    if [ -n "${FATPIPE_B:-}" ]; then
        local pushb pullb
        pushb=$(rate big "$(col durable push-b 1)")
        pullb=$(rate big "$(col durable pull-b 1)")
        echo "durable, FATPIPE_B: push $pushb GB/s, pull $pullb GB/s; push/push-b = $(ratio "$push" "$pushb"), pull/pull-b = $(ratio "$pull" "$pullb") (first build over FATPIPE_B)"
    fi
    read -r load _ </proc/loadavg
    echo "load after: $load"
}

col() { # col DATASET TOOL FIELD -> median of that field over good runs
    awk -F'|' -v d="$1" -v t="$2" '$1 == d && $2 == t && $3 ~ /^[0-9]/ { print $3 }' "$work/res" |
        awk -v f="$3" '{ print $f }' | median %.3f
}

rate() { # rate DATASET SECONDS -> GB/s (big) or files/s (small)
    awk -v d="$1" -v s="$2" -v mb="$BIG_MB" -v n="$SMALL_FILES" 'BEGIN {
        if (s == "n/a" || s == 0) { print "n/a"; exit }
        if (d == "big") printf "%.2f", mb * 1048576 / s / 1e9; else printf "%.0f", n / s }'
}

main() {
    install_peers
    build_fatpipe
    setup_net
    make_data
    start_servers
    read -r load _ </proc/loadavg
    echo "fatpipe copy vs peers: veth between namespaces, $STREAMS streams, $INFLIGHT files in flight, $RUNS runs, $(nproc) CPUs, kernel $(uname -r), load before: $load"
    local tools=($TOOLS) ds run i k tool r
    declare -A srv_rss=()
    for ds in $DATASETS; do
        # A fresh fatpipe server per dataset, so its VmHWM is this dataset's.
        if [ -n "${SERVER_PID[fatpipe]:-}" ]; then
            stop_server fatpipe
            start_fatpipe || die "fatpipe server did not restart"
        fi
        for run in $(seq "$RUNS"); do
            for i in "${!tools[@]}"; do
                k=$(((i + run - 1) % ${#tools[@]}))
                tool=${tools[$k]}
                r=$(run_one "$tool" "$ds" "$run")
                echo "  $ds run $run $tool: $r"
                echo "$ds|$tool|$r" >>"$work/res"
            done
        done
        if [ -n "${SERVER_PID[fatpipe]:-}" ]; then
            srv_rss[$ds]=$(awk '/VmHWM/ { print $2 }' "/proc/${SERVER_PID[fatpipe]}/status")
        fi
    done

    echo
    printf '%-6s %-16s %10s %12s %14s %14s   %s\n' data tool seconds "rate" "client RSS" "server RSS" "runs (s)"
    for ds in $DATASETS; do
        for tool in "${tools[@]}"; do
            local s unit srss=""
            s=$(col "$ds" "$tool" 1)
            unit=$([ "$ds" = big ] && echo GB/s || echo files/s)
            case $tool in fatpipe*) srss="$((${srv_rss[$ds]:-0} / 1024)) MiB" ;; esac
            printf '%-6s %-16s %10s %12s %14s %14s   %s\n' "$ds" "$tool" "$s" "$(rate "$ds" "$s") $unit" \
                "$(awk -v k="$(col "$ds" "$tool" 2)" 'BEGIN { if (k == "n/a") print "n/a"; else printf "%d MiB", k / 1024 }')" \
                "$srss" \
                "$(awk -F'|' -v d="$ds" -v t="$tool" '$1 == d && $2 == t { split($3, a, " "); printf "%s ", a[1] }' "$work/res")"
        done
    done

    echo
    for ds in $DATASETS; do
        local fp best=$NA best_tool=- cpr peer
        fp=$(rate "$ds" "$(col "$ds" fatpipe 1)")
        local fpd
        fpd=$(rate "$ds" "$(col "$ds" fatpipe-buffered 1)")
        for peer in "${tools[@]}"; do
            case $peer in fatpipe* | cp) continue ;; esac
            local pr
            pr=$(rate "$ds" "$(col "$ds" "$peer" 1)")
            [ "$pr" = "$NA" ] && continue
            if [ "$best" = "$NA" ] || awk -v a="$pr" -v b="$best" 'BEGIN { exit !(a > b) }'; then
                best=$pr best_tool=$peer
            fi
        done
        cpr=$(rate "$ds" "$(col "$ds" cp 1)")
        case $ds in
            big) echo "big file: fatpipe/best peer ($best_tool) = $(ratio "$fp" "$best") (target >= 1.2), fatpipe/cp = $(ratio "$fp" "$cpr") (target ~0.95); with --buffered: $(ratio "$fpd" "$best") and $(ratio "$fpd" "$cpr")" ;;
            small) echo "small files: fatpipe/best peer ($best_tool) = $(ratio "$fp" "$best") (target >= 2.0), fatpipe $fp files/s (target >= 4000), fatpipe/cp = $(ratio "$fp" "$cpr")" ;;
        esac
    done
    echo "fatpipe RSS target: <= 64 MiB plus buffers ($STREAMS streams x (256 KiB piece + socket buffers))"
    read -r load _ </proc/loadavg
    echo "load after: $load (other work on this machine skews results; rerun when idle)"
    [ "$DURABLE" = 1 ] && durable
    return 0
}

main "$@"
