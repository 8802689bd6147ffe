#!/usr/bin/env bash
# bench/autotune.sh: fatpipe with no flags (auto-tuning) against iperf3 on
# emulated long fat links: issue 5's whole target in one run.
#
# Target: on an emulated 1 Gbit/s link (goodput ceiling ~0.94 Gbit/s at MTU
# 1500), with no flags, >= 0.85 Gbit/s at RTT 93 ms and 228 ms, with loss
# 0, 0.01% and 0.1%, over a 60 s `fatpipe test` and over a 4 GiB
# `fatpipe copy`. Stretch: the same at 1% loss (LOSSES="... 1%"), and
# >= 4.5 Gbit/s on a 5 Gbit/s x 93 ms link (STRETCH=1).
#
# One `fatpipe lab` link per RTT (RATE, 1-BDP drop-tail queue, MTU 1500),
# the loss changed live between cells. In every cell of RTTS x LOSSES the
# contenders run one after the other, RUNS times, in an order that rotates
# each run so slow drift (other load on the host) hits all alike:
#
#   fatpipe         `fatpipe test B` with no flags, FP_DURATION seconds;
#                   the receiver's throughput
#   fatpipe-copy    `fatpipe copy FILE B:dst/` with no flags: one
#                   COPY_SIZE file of pseudo-random data (made once, removed
#                   at exit) pushed to a `fatpipe server --export` in
#                   namespace b; goodput = bytes_transferred x 8 / the
#                   wall clock of the whole command (pre-flight probe,
#                   set-up and slow start included; the JSON's `seconds`
#                   start after the probe). A run counts only if the copy verified
#                   its chunks (files_verified 1, files_failed 0) and the
#                   destination has the source's size; the destination file
#                   is removed after each run.
#   fatpipe-pull    `fatpipe copy B:src/FILE DIR/` with no flags: the same
#                   file pulled back from the copy server's second export
#                   (its source directory), counted and checked the same
#                   way (wall clock of the whole command, verified, size)
#   iperf3-default  iperf3 -c B, IPERF_DURATION seconds
#   iperf3-bdp      iperf3 -w min(1 BDP, host cap): iperf3 uses plain
#                   SO_SNDBUF/SO_RCVBUF and refuses to run when the kernel
#                   grants less than asked, so the window is the BDP or the
#                   host cap (net.core.{r,w}mem_max), whichever is smaller;
#                   the table says which, because that cap is exactly what
#                   fatpipe's planner works around with more streams
#   iperf3-8bbr     iperf3 -P 8 -C bbr, iperf3's best hand-tuned setting
#   gridftp         GridFTP: `globus-url-copy -p 8 file://FILE ftp://B/...`
#                   to a `globus-gridftp-server` in namespace b (anonymous
#                   login mapped to user nobody, plain FTP control, MODE E
#                   with 8 parallel data streams, kernel socket buffers:
#                   what `-p 8` alone gives); the same file and the same
#                   goodput rule as fatpipe-copy (wall clock of the whole
#                   command, destination size checked). GridFTP does not
#                   verify checksums here; fatpipe's copies do.
#   gridftp-pull    the same file pulled back: `globus-url-copy -p 8
#                   ftp://B/FILE file://DIR/`
#                   A GridFTP run is stopped after GRIDFTP_TIMEOUT seconds
#                   (cubic on a lossy 228 ms path moves a few Mbit/s per
#                   stream, so 2 GiB could take an hour); its goodput is
#                   then the bytes that reached the destination over that
#                   time, and the run is listed as capped.
#
# A second table gives, per cell, the copies' start-up from their JSON
# timeline (medians): first payload byte after the command started (push:
# the first byte sent; pull: the first chunk verified on this end's disk),
# and the ramp to 90 % of the final rate (ramp_secs), push and pull, the
# pull/push ratio of their goodputs (issue 18: within 5 %), and GridFTP's
# push and pull with fatpipe's ratio to each. The first table gives
# `fatpipe test`'s own ramp (end.ramp.secs: start to 90 % of its final
# rate, medians).
#
# The table shows per cell the medians (Gbit/s, receiver), the ratios
# fatpipe test / each iperf3 variant, and whether fatpipe test and fatpipe
# copy reach TARGET. With STRETCH=1 one more cell: STRETCH_RATE x
# STRETCH_RTT ms, no loss, fatpipe test against iperf3 default only,
# against STRETCH_TARGET.
#
# Needs root (namespaces). Installs iperf3 and jq with apt-get if missing.
# On any exit: removes its lab (by name, and through --owner if killed),
# ends its servers by PID, removes the copy data and raw outputs.
#
# Settings (environment):
#   RTTS="93 228" (empty: only the STRETCH cell)
#   LOSSES="0 0.01% 0.1%" (add 1% for the stretch cells)
#   RATE=1gbit  TARGET=0.85 (Gbit/s)  RUNS=3
#   FP_DURATION=60     seconds of each `fatpipe test` run (issue: 60 s)
#   IPERF_DURATION=25  seconds of each iperf3 run (issue: 25 s)
#   COPY_SIZE=4G       size of the copied file (bytes, or K/M/G/T: 1024-based)
#   DATA_DIR=/var/tmp  where the copy's source and destination live (on disk;
#                      needs twice COPY_SIZE free)
#   STRETCH=1          also run STRETCH_RATE=5gbit x STRETCH_RTT=93 ms, no
#                      loss, against STRETCH_TARGET=4.5 (Gbit/s)
#   TOOLS="fatpipe fatpipe-copy fatpipe-pull iperf3-default iperf3-bdp iperf3-8bbr"
#                      (issue 18's copy rows: TOOLS="fatpipe-copy fatpipe-pull
#                      gridftp gridftp-pull" COPY_SIZE=2G LOSSES="0.01% 0.1% 1%")
#   LAB=fpat$$         lab name
#   FATPIPE=path/to/fatpipe   (default: build with cargo --release)
#   FATPIPE_B=path/to/other/fatpipe  with TOOLS including fatpipe-b and/or
#                      fatpipe-copy-b: a second build (e.g. before a
#                      change) run the same way against its own servers,
#                      rotating with the others; a second table gives each
#                      cell's B medians and B/A ratios
#   GRIDFTP_TIMEOUT=90 seconds a GridFTP run may take (see gridftp above)
#   KEEP=1             keep every run's raw output (not the copy data)
set -euo pipefail

BENCH=autotune
. "$(dirname "$0")/lib.sh"

[ -z "${DURATION:-}" ] ||
    die "DURATION was split: set FP_DURATION (fatpipe test, default 60) and IPERF_DURATION (iperf3, default 25)"
RTTS=${RTTS-"93 228"}
LOSSES=${LOSSES:-"0 0.01% 0.1%"}
RATE=${RATE:-1gbit}
TARGET=${TARGET:-0.85}
FP_DURATION=${FP_DURATION:-60}
IPERF_DURATION=${IPERF_DURATION:-25}
RUNS=${RUNS:-3}
COPY_SIZE=${COPY_SIZE:-4G}
DATA_DIR=${DATA_DIR:-/var/tmp}
STRETCH=${STRETCH:-0}
STRETCH_RATE=${STRETCH_RATE:-5gbit}
STRETCH_RTT=${STRETCH_RTT:-93}
STRETCH_TARGET=${STRETCH_TARGET:-4.5}
GRIDFTP_TIMEOUT=${GRIDFTP_TIMEOUT:-90}
ALL_TOOLS="fatpipe fatpipe-copy fatpipe-pull iperf3-default iperf3-bdp iperf3-8bbr fatpipe-b fatpipe-copy-b gridftp gridftp-pull"
TOOLS=${TOOLS:-$ALL_TOOLS}
LAB=${LAB:-fpat$$}
PORT_FATPIPE=5301
PORT_COPY=5302
PORT_FATPIPE_B=5303
PORT_COPY_B=5304
PORT_IPERF3=5201
PORT_GRIDFTP=5305

for t in $TOOLS; do
    case " $ALL_TOOLS " in *" $t "*) ;; *) die "TOOLS: unknown contender $t (known: $ALL_TOOLS)" ;; esac
done
for v in FP_DURATION IPERF_DURATION RUNS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v=${!v}: give a whole number > 0"
done
[ -n "$RTTS" ] || [ "$STRETCH" = 1 ] || die "RTTS is empty and STRETCH is not 1: nothing to run"
COPY_BYTES=$(numfmt --from=iec "$COPY_SIZE" 2>/dev/null) || die "COPY_SIZE=$COPY_SIZE: use e.g. 4G or 256M"
[ "$COPY_BYTES" -gt 0 ] || die "COPY_SIZE=$COPY_SIZE: must be more than 0"

work=$(mktemp -d /tmp/fatpipe-autotune.XXXXXX)
data=""

cleanup() {
    stop_servers
    rm -rf "/etc/netns/fp-$LAB-a" "/etc/netns/fp-$LAB-b"
    [ -n "${FATPIPE:-}" ] && "$FATPIPE" lab down "$LAB" >/dev/null 2>&1 || true
    [ -n "$data" ] && rm -rf "$data"
    drop_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || die "needs root for the lab's namespaces"
install_missing iperf3:iperf3 jq:jq
build_fatpipe
case " $TOOLS " in
    *" fatpipe-b "* | *" fatpipe-copy-b "*)
        [ -x "${FATPIPE_B:-}" ] || die "TOOLS has a -b contender: set FATPIPE_B to an executable" ;;
esac

has_tool() { case " $TOOLS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if has_tool gridftp || has_tool gridftp-pull; then
    install_missing globus-url-copy:globus-gass-copy-progs globus-gridftp-server:globus-gridftp-server-progs
    id -u nobody >/dev/null 2>&1 || die "GridFTP's anonymous login maps to user nobody, which this host lacks"
fi

# bdp_bytes RATE_BPS RTT_MS
bdp_bytes() { awk -v r="$1" -v t="$2" 'BEGIN { printf "%d", r * t / 1000 / 8 }'; }

# rate_bps RATE: 1gbit -> 1000000000
rate_bps() {
    case $1 in
        *gbit | *G | *g) echo $((${1%%[gG]*} * 1000000000)) ;;
        *mbit | *M | *m) echo $((${1%%[mM]*} * 1000000)) ;;
        *) die "rate $1: use e.g. 1gbit or 500mbit" ;;
    esac
}

lab_exec() {
    local end=$1
    shift
    "$FATPIPE" lab exec "$LAB" "$end" -- "$@"
}

# make_copy_data: one COPY_BYTES file of AES-CTR keystream (pseudo-random:
# nothing compresses, no two chunks alike, no holes) under DATA_DIR.
make_copy_data() {
    data=$(mktemp -d "$DATA_DIR/fatpipe-autotune-data.XXXXXX")
    mkdir -p "$data/src" "$data/dst"
    SRC_FILE="$data/src/copy-$COPY_SIZE.bin"
    echo "making the copy's source: $COPY_SIZE ($COPY_BYTES bytes) of pseudo-random data in $data" >&2
    # head closes the pipe early; openssl's SIGPIPE is expected.
    (set +o pipefail
        openssl enc -aes-128-ctr -nosalt -pbkdf2 -pass pass:fatpipe-autotune </dev/zero 2>/dev/null |
            head -c "$COPY_BYTES" >"$SRC_FILE")
    [ "$(stat -c %s "$SRC_FILE")" = "$COPY_BYTES" ] || die "could not write $COPY_BYTES bytes to $SRC_FILE"
    # GridFTP's anonymous user (nobody) reads the source and writes dst.
    chmod 755 "$data" "$data/src"
    chmod 644 "$SRC_FILE"
    chown nobody "$data/dst"
}

start_servers() {
    local ns="fp-$LAB-b"
    if has_tool fatpipe; then
        start_server "$ns" fatpipe $PORT_FATPIPE "$FATPIPE" server --port $PORT_FATPIPE --quiet ||
            die "fatpipe server did not start"
    fi
    if has_tool fatpipe-copy || has_tool fatpipe-pull; then
        start_server "$ns" fatpipe-copy $PORT_COPY "$FATPIPE" server --port $PORT_COPY --quiet \
            --export "dst=$data/dst:public" --export "src=$data/src:public" ||
            die "fatpipe copy server did not start"
    fi
    if has_tool fatpipe-b; then
        start_server "$ns" fatpipe-b $PORT_FATPIPE_B "$FATPIPE_B" server --port $PORT_FATPIPE_B --quiet ||
            die "fatpipe-b server did not start"
    fi
    if has_tool fatpipe-copy-b; then
        start_server "$ns" fatpipe-copy-b $PORT_COPY_B "$FATPIPE_B" server --port $PORT_COPY_B --quiet \
            --export "dst=$data/dst:public" || die "fatpipe-copy-b server did not start"
    fi
    start_server "$ns" iperf3 $PORT_IPERF3 iperf3 -s -p $PORT_IPERF3 || die "iperf3 server did not start"
    if has_tool gridftp || has_tool gridftp-pull; then
        # Anonymous FTP (no GSI certificates to set up) mapped to nobody;
        # the server refuses to map anonymous users to root.
        start_server "$ns" gridftp $PORT_GRIDFTP globus-gridftp-server -aa -anonymous-user nobody \
            -p $PORT_GRIDFTP -control-interface "$B_IP" -data-interface "$B_IP" -d error ||
            die "globus-gridftp-server did not start"
    fi
}

# gridftp_one OUT [pull]: one GridFTP push of SRC_FILE into the server's
# dst directory (or with "pull", one pull of it into dst on this end);
# prints Gbit/s over the command's wall clock, or nan (reason in OUT.bad).
gridftp_one() {
    local out=$1 way=${2:-push} name dst
    name=$(basename "$SRC_FILE")
    dst="$data/dst/$name"
    find "$data/dst" -mindepth 1 -delete
    local t0=$EPOCHREALTIME rc=0
    if [ "$way" = pull ]; then
        lab_exec a timeout "$GRIDFTP_TIMEOUT" globus-url-copy -p 8 "ftp://$B_IP:$PORT_GRIDFTP$SRC_FILE" "file://$dst" \
            >"$out" 2>&1 || rc=$?
    else
        lab_exec a timeout "$GRIDFTP_TIMEOUT" globus-url-copy -p 8 "file://$SRC_FILE" "ftp://$B_IP:$PORT_GRIDFTP$dst" \
            >"$out" 2>&1 || rc=$?
    fi
    local wall moved
    wall=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.6f", b - a }')
    if [ "$rc" = 124 ]; then
        # Stopped at the cap: the rate is what arrived in that time (a
        # pushed file's size on the server may lag its last buffers by
        # a little; it never overstates).
        moved=$(stat -c %s "$dst" 2>/dev/null || echo 0)
        echo "  GridFTP $way capped at ${GRIDFTP_TIMEOUT} s: $moved of $COPY_BYTES bytes" >&2
        find "$data/dst" -mindepth 1 -delete
        awk -v n="$moved" -v w="$wall" 'BEGIN { printf "%.6f\n", n * 8 / w / 1e9 }'
        return 0
    fi
    if [ "$rc" != 0 ]; then
        echo "globus-url-copy exited $rc: $(grep -m1 -i error "$out" || tail -1 "$out")" >"$out.bad"
    fi
    settle_copy "$out" "$dst"
    [ -e "$out.bad" ] || awk -v n="$COPY_BYTES" -v w="$wall" 'BEGIN { printf "%.6f\n", n * 8 / w / 1e9 }'
}

# settle_copy OUT DST: unless OUT.bad already says why the run failed,
# checks that DST has COPY_BYTES (else writes OUT.bad); empties the
# destination directory; prints nan when the run is bad.
settle_copy() {
    local out=$1 dst=$2 size
    size=$(stat -c %s "$dst" 2>/dev/null || echo missing)
    if [ ! -e "$out.bad" ] && [ "$size" != "$COPY_BYTES" ]; then
        echo "destination size $size != $COPY_BYTES" >"$out.bad"
    fi
    find "$data/dst" -mindepth 1 -delete
    if [ -e "$out.bad" ]; then echo nan; fi
}

# copy_one OUT [BIN PORT [pull]]: one push of SRC_FILE (with FATPIPE to
# PORT_COPY unless given), or with "pull" one pull of it from the server's
# src export into the dst directory; prints Gbit/s, or nan if it failed or
# did not verify (the reason goes to OUT.bad).
copy_one() {
    local out=$1 bin=${2:-$FATPIPE} port=${3:-$PORT_COPY} way=${4:-push} dst
    dst="$data/dst/$(basename "$SRC_FILE")"
    # A fresh destination: no leftover (or journal) to resume from.
    find "$data/dst" -mindepth 1 -delete
    local t0=$EPOCHREALTIME rc=0
    if [ "$way" = pull ]; then
        lab_exec a "$bin" copy --port "$port" --json "$B_IP:src/$(basename "$SRC_FILE")" "$data/dst/" \
            >"$out" 2>"$out.err" || rc=$?
    else
        lab_exec a "$bin" copy --port "$port" --json "$SRC_FILE" "$B_IP:dst/" >"$out" 2>"$out.err" || rc=$?
    fi
    # The wall clock of the whole command: pre-flight probe, set-up and
    # slow start included (the JSON's seconds start after the probe).
    local wall
    wall=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.6f", b - a }')
    if [ "$rc" != 0 ]; then
        echo "copy exited non-zero: $(tail -1 "$out.err")" >"$out.bad"
    elif ! jq -e --argjson n "$COPY_BYTES" \
        '.files_verified == 1 and .files_failed == 0 and .bytes_total == $n and .bytes_transferred == $n' \
        "$out" >/dev/null 2>&1; then
        echo "copy JSON does not report one verified file of $COPY_BYTES bytes" >"$out.bad"
    fi
    settle_copy "$out" "$dst"
    [ -e "$out.bad" ] || jq -r --argjson wall "$wall" '.bytes_transferred * 8 / $wall / 1e9' "$out"
}

# run_one TOOL OUT: prints the receiver's Gbit/s (or nan)
run_one() {
    local tool=$1 out=$2
    case $tool in
        fatpipe)
            lab_exec a "$FATPIPE" test "$B_IP:$PORT_FATPIPE" -t "${FP_DURATION}s" --json >"$out" 2>"$out.err" || true
            jq -r '(.end.sums[0].bits_per_second // "nan")' "$out" 2>/dev/null || echo nan
            ;;
        fatpipe-b)
            lab_exec a "$FATPIPE_B" test "$B_IP:$PORT_FATPIPE_B" -t "${FP_DURATION}s" --json >"$out" 2>"$out.err" || true
            jq -r '(.end.sums[0].bits_per_second // "nan")' "$out" 2>/dev/null || echo nan
            ;;
        fatpipe-copy-b)
            copy_one "$out" "$FATPIPE_B" $PORT_COPY_B | awk '{ if ($1 == "nan") print "nan"; else print $1 * 1e9 }'
            ;;
        fatpipe-copy)
            copy_one "$out" | awk '{ if ($1 == "nan") print "nan"; else print $1 * 1e9 }'
            ;;
        fatpipe-pull)
            copy_one "$out" "$FATPIPE" $PORT_COPY pull | awk '{ if ($1 == "nan") print "nan"; else print $1 * 1e9 }'
            ;;
        gridftp)
            gridftp_one "$out" | awk '{ if ($1 == "nan") print "nan"; else print $1 * 1e9 }'
            ;;
        gridftp-pull)
            gridftp_one "$out" pull | awk '{ if ($1 == "nan") print "nan"; else print $1 * 1e9 }'
            ;;
        iperf3-*)
            local extra=()
            case $tool in
                iperf3-bdp) extra=(-w "$WINDOW") ;;
                iperf3-8bbr) extra=(-P 8 -C bbr) ;;
            esac
            # iperf3 3.12 exits 0 when it cannot connect: retry on the JSON's error.
            for _ in 1 2 3; do
                lab_exec a iperf3 -c "$B_IP" -p $PORT_IPERF3 -t "$IPERF_DURATION" -J "${extra[@]}" >"$out" 2>&1 || true
                jq -e '.error' "$out" >/dev/null 2>&1 || break
                sleep 1
            done
            jq -r '(.end.sum_received.bits_per_second // "nan")' "$out" 2>/dev/null || echo nan
            ;;
    esac | awk '{ if ($1 == "nan") print "nan"; else printf "%.3f\n", $1 / 1e9 }'
}

# lab_link RATE RTT_MS: (re)creates the lab link with no loss, sets B_IP,
# BDP and WINDOW, starts the servers.
lab_link() {
    local rate=$1 rtt=$2
    stop_servers
    "$FATPIPE" lab down "$LAB" >/dev/null 2>&1 || true
    "$FATPIPE" lab up "$LAB" --rtt "${rtt}ms" --rate "$rate" --seed 7 --owner $$ >/dev/null
    B_IP=$("$FATPIPE" lab list --json | jq -r --arg n "$LAB" '.[] | select(.name == $n) | .b.ipv4')
    [ -n "$B_IP" ] && [ "$B_IP" != null ] || die "no address for lab $LAB"
    if has_tool gridftp || has_tool gridftp-pull; then
        # GridFTP looks up its addresses' names; a lab namespace has no
        # route to a DNS server, so give both ends a hosts file (`ip netns
        # exec` mounts /etc/netns/NS/hosts over /etc/hosts; removed at exit).
        local a_ip ns
        a_ip=$("$FATPIPE" lab list --json | jq -r --arg n "$LAB" '.[] | select(.name == $n) | .a.ipv4')
        for ns in "fp-$LAB-a" "fp-$LAB-b"; do
            mkdir -p "/etc/netns/$ns"
            { cat /etc/hosts; echo "$a_ip $LAB-a"; echo "$B_IP $LAB-b"; } >"/etc/netns/$ns/hosts"
        done
    fi
    BDP=$(bdp_bytes "$(rate_bps "$rate")" "$rtt")
    WINDOW=$BDP
    [ "$WINDOW" -gt "$CAP" ] && WINDOW=$CAP
    start_servers
}

# mark VALUE TARGET: yes / NO / n/a (no value) / - (not run)
mark() {
    if [ "$1" = - ]; then
        echo -
    elif is_num "$1"; then
        awk -v a="$1" -v t="$2" 'BEGIN { print (a >= t) ? "yes" : "NO" }'
    else
        echo "$NA"
    fi
}

# cell RATE RTT LOSS TARGET TOOL...: RUNS rotating rounds of the tools on
# the current link, then one table row.
cell() {
    local rate=$1 rtt=$2 loss=$3 target=$4
    shift 4
    local tools=("$@") n=$# run k t f g what
    declare -A got=() first=() ramp=()
    for t in "${tools[@]}"; do got[$t]="" first[$t]="" ramp[$t]=""; done
    for run in $(seq "$RUNS"); do
        for k in $(seq 0 $((n - 1))); do
            t=${tools[$(((k + run) % n))]}
            f="$work/$rate-$rtt-${loss//%/pct}-$t-$run.json"
            g=$(run_one "$t" "$f")
            got[$t]+="$g "
            case $t in
                fatpipe-copy | fatpipe-pull)
                    first[$t]+="$(jq -r '.timeline | (.first_byte_sent_at // .first_byte_on_disk_at // "nan") |
                        if type == "number" then (. * 100 | round / 100) else . end' "$f" 2>/dev/null || echo nan) "
                    ramp[$t]+="$(jq -r '.timeline.ramp_secs // "nan" |
                        if type == "number" then (. * 100 | round / 100) else . end' "$f" 2>/dev/null || echo nan) "
                    ;;
                fatpipe)
                    ramp[$t]+="$(jq -r '.end.ramp.secs // "nan" |
                        if type == "number" then (. * 100 | round / 100) else . end' "$f" 2>/dev/null || echo nan) "
                    ;;
            esac
            echo "  $rate ${rtt} ms loss $loss run $run $t: $g Gbit/s$([ -e "$f.bad" ] && echo " (BAD: $(cat "$f.bad"))")" >&2
            if [ "$run" = 1 ]; then
                case $t in
                    fatpipe) what=test ;;
                    fatpipe-copy) what=copy ;;
                    fatpipe-pull) what=pull ;;
                    *) what= ;;
                esac
                [ -z "$what" ] ||
                    autolines+=("$rate ${rtt} ms, loss $loss, $what: $(grep -m1 '^auto:' "$f.err" || echo "auto: (no line)")")
            fi
        done
    done
    declare -A m=()
    for t in $ALL_TOOLS; do
        if [ -n "${got[$t]+set}" ]; then
            m[$t]=$(tr ' ' '\n' <<<"${got[$t]}" | median %.3f)
        else
            m[$t]=-
        fi
    done
    local cmed tramp=-
    declare -A fm=() rm=()
    [ -n "${ramp[fatpipe]+set}" ] && tramp=$(tr ' ' '\n' <<<"${ramp[fatpipe]}" | median %.2f)
    for t in fatpipe-copy fatpipe-pull; do
        if [ -n "${first[$t]+set}" ]; then
            fm[$t]=$(tr ' ' '\n' <<<"${first[$t]}" | median %.2f)
            rm[$t]=$(tr ' ' '\n' <<<"${ramp[$t]}" | median %.2f)
        else
            fm[$t]=- rm[$t]=-
        fi
    done
    cmed=$(ratio "${m[fatpipe-pull]}" "${m[fatpipe-copy]}" %.3f)
    [ "${m[fatpipe-pull]}" = - ] && cmed=-
    local g_push g_pull
    g_push=$(ratio "${m[fatpipe-copy]}" "${m[gridftp]}" "%.2fx")
    g_pull=$(ratio "${m[fatpipe-pull]}" "${m[gridftp-pull]}" "%.2fx")
    [ "${m[gridftp]}" = - ] && g_push=-
    [ "${m[gridftp-pull]}" = - ] && g_pull=-
    startrows+=("$(printf "$START_ROW" "$rate" "$rtt ms" "$loss" "${m[fatpipe-copy]}" "${m[fatpipe-pull]}" "$cmed" \
        "${m[gridftp]}" "${m[gridftp-pull]}" "$g_push" "$g_pull" \
        "${fm[fatpipe-copy]}" "${rm[fatpipe-copy]}" "${fm[fatpipe-pull]}" "${rm[fatpipe-pull]}")")
    local r_d r_b r_8
    r_d=$(ratio "${m[fatpipe]}" "${m[iperf3-default]}" "%.1fx")
    r_b=$(ratio "${m[fatpipe]}" "${m[iperf3-bdp]}" "%.1fx")
    r_8=$(ratio "${m[fatpipe]}" "${m[iperf3-8bbr]}" "%.1fx")
    [ "${m[iperf3-default]}" = - ] && r_d=-
    [ "${m[iperf3-bdp]}" = - ] && r_b=-
    [ "${m[iperf3-8bbr]}" = - ] && r_8=-
    abrows+=("$(printf "$AB_ROW" "$rate" "$rtt ms" "$loss" "${m[fatpipe]}" "${m[fatpipe-b]}" \
        "$(ratio "${m[fatpipe-b]}" "${m[fatpipe]}" %.3f)" "${m[fatpipe-copy]}" "${m[fatpipe-copy-b]}" \
        "$(ratio "${m[fatpipe-copy-b]}" "${m[fatpipe-copy]}" %.3f)")")
    rows+=("$(printf "$ROW" "$rate" "$rtt ms" "$loss" "${m[fatpipe]}" "$tramp" "${m[fatpipe-copy]}" "${m[iperf3-default]}" "${m[iperf3-bdp]}" \
        "${m[iperf3-8bbr]}" "$r_d" "$r_b" "$r_8" "$target" "$(mark "${m[fatpipe]}" "$target")" \
        "$(mark "${m[fatpipe-copy]}" "$target")")")
}

# one table row: link RTT loss, test median and ramp, 4 medians, 3 ratios, goal, 2 marks
ROW='| %6s | %6s | %5s | %7s | %6s | %7s | %7s | %7s | %7s | %6s | %6s | %6s | %4s | %5s | %5s |'
AB_ROW='| %6s | %6s | %5s | %7s | %7s | %6s | %7s | %7s | %6s |'
START_ROW='| %6s | %6s | %5s | %7s | %7s | %6s | %7s | %7s | %7s | %7s | %7s | %7s | %7s | %7s |'
CAP=$(sysctl -n net.core.rmem_max net.core.wmem_max | sort -n | head -1)
{ has_tool fatpipe-copy || has_tool fatpipe-pull; } && make_copy_data
startrows=()
rows=()
abrows=()
autolines=()
for rtt in $RTTS; do
    lab_link "$RATE" "$rtt"
    for loss in $LOSSES; do
        "$FATPIPE" lab set "$LAB" --loss "$loss" >/dev/null
        cell "$RATE" "$rtt" "$loss" "$TARGET" $TOOLS
    done
done
if [ "$STRETCH" = 1 ]; then
    stretch_tools=()
    for t in fatpipe iperf3-default; do has_tool "$t" && stretch_tools+=("$t"); done
    [ ${#stretch_tools[@]} -gt 0 ] || die "STRETCH=1 needs fatpipe or iperf3-default in TOOLS"
    lab_link "$STRETCH_RATE" "$STRETCH_RTT"
    cell "$STRETCH_RATE" "$STRETCH_RTT" 0 "$STRETCH_TARGET" "${stretch_tools[@]}"
fi
stop_servers
"$FATPIPE" lab down "$LAB" >/dev/null 2>&1 || true

echo
echo "fatpipe with no flags vs iperf3 on lab links, median of $RUNS runs (Gbit/s, receiver; copy: goodput)"
echo "fatpipe test: ${FP_DURATION} s runs$(has_tool fatpipe-copy && echo "; fatpipe copy: one $COPY_SIZE file pushed, verified"); iperf3: ${IPERF_DURATION} s runs"
echo "iperf3 BDP: -w min(1 BDP, host cap); the host caps plain socket buffers at $CAP bytes; 8bbr: -P 8 -C bbr"
echo "n/a: no successful run; -: not run in this cell"
echo
printf "$ROW\n" link RTT loss fatpipe "test" fatpipe iperf3 iperf3 iperf3 "test/" "test/" "test/" goal test copy
printf "$ROW\n" "" "" "" test "ramp s" copy default "-w BDP" "-P8 bbr" "def." BDP 8bbr "" pass pass
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
if has_tool fatpipe-b || has_tool fatpipe-copy-b; then
    echo
    echo "A/B: FATPIPE=$FATPIPE against FATPIPE_B=$FATPIPE_B (medians, Gbit/s; B/A)"
    printf "$AB_ROW\n" link RTT loss "test A" "test B" "B/A" "copy A" "copy B" "B/A"
    echo "|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${abrows[@]}"
fi
if has_tool fatpipe-copy || has_tool fatpipe-pull; then
    echo
    echo "copy start-up ($COPY_SIZE, medians; goodput over the whole command's wall clock; seconds since the command started):"
    printf "$START_ROW\n" link RTT loss "push" "pull" "pull/" "GridFTP" "GridFTP" "push/" "pull/" "push 1st" "push" "pull 1st" "pull"
    printf "$START_ROW\n" "" "" "" "Gbit/s" "Gbit/s" "push" "push" "pull" "GridFTP" "GridFTP" "byte s" "ramp s" "byte s" "ramp s"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${startrows[@]}"
fi
echo
echo "what auto-tuning chose (first run of each cell):"
printf '  %s\n' "${autolines[@]}"
