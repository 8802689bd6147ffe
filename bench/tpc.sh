#!/usr/bin/env bash
# bench/tpc.sh: HTTP third-party copy (issue 33's "bench/tpc.sh") on lab
# links: fatpipe's COPY against XRootD's, driven by gfal-copy as FTS
# drives it (one stream per file, `--copy-mode pull`, adler32 checked).
#
# For each link of LINKS (default "93ms:0.01% 228ms:0.1%", 1 Gbit/s): a
# lab (`fatpipe lab up`), in namespace b the source side (a fatpipe server
# with --http and its copy port, an XRootD 5.5.3 with XrdHttpTPC, both
# serving one SIZE file of random bytes), in namespace a the destination
# side (the same two). From namespace a, alternating within every run,
# each the wall clock of one command, the file removed between runs:
#   fp-fp       gfal-copy --copy-mode pull -n 1 -K adler32 from fatpipe to
#               fatpipe (a COPY to a's fatpipe, which pulls from b's)
#   fp-xrd      the same from XRootD to fatpipe (fatpipe pulling from XRootD)
#   xrd-xrd-1   the same from XRootD to XRootD, 1 stream
#   xrd-xrd-4   the same, 4 streams
#   copy        `fatpipe copy` (fatpipe's own protocol) between the same
#               hosts, for reference
# Medians over RUNS, Gbit/s over the wall clock, and the issue's targets.
# Then SMALL_N files of 8 MiB copied one COPY each, in sequence (as FTS
# issues them), by curl -X COPY to a's fatpipe and to a's XRootD: files
# per second.
#
# Needs root (namespaces). Installs gfal2-util-scripts, gfal2-plugin-http,
# xrootd-server(-plugins), curl and openssl if missing. Servers are ended
# by PID, the lab removed, on any exit. The machine may be shared: figures
# are medians, and noisy.
#
# Settings (environment):
#   RUNS=3 SIZE=2G LINKS="93ms:0.01% 228ms:0.1%" SMALL_N=500 (0: none)
#   ONLY="fp-fp copy"         (the variants to run; default every one)
#   LEG=off                   (fatpipe's COPYs over HTTP, not the leg)
#   LABNAME=name              (the lab's name; default fpt<PID>)
#   FATPIPE=path/to/fatpipe   (default: build with cargo --release)
#   KEEP=1                    (keep the work directory)
set -euo pipefail

RUNS=${RUNS:-3}
SIZE=${SIZE:-2G}
LINKS=${LINKS:-"93ms:0.01% 228ms:0.1%"}
SMALL_N=${SMALL_N:-500}
PORT_FP=8080
PORT_COPY=5301
PORT_XRD=1094
LABNAME=${LABNAME:-fpt$$}
ONLY=${ONLY:-fp-fp fp-xrd xrd-1 xrd-4 copy}
LEG=${LEG:-on}
want() { case " $ONLY " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

BENCH=tpc
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d /var/tmp/fatpipe-tpc-bench.XXXXXX)
chmod 755 "$work"

cleanup() {
    stop_servers
    [ -n "${FATPIPE:-}" ] && "$FATPIPE" lab down "$LABNAME" >/dev/null 2>&1 || true
    drop_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces"
install_missing gfal-copy:gfal2-util-scripts curl:curl openssl:openssl xrootd:xrootd-server
[ -e /usr/lib/x86_64-linux-gnu/libXrdHttpTPC-5.so ] || install_missing nonexistent-cmd:xrootd-server-plugins
dpkg -s gfal2-plugin-http >/dev/null 2>&1 || install_missing nonexistent-cmd:gfal2-plugin-http
build_fatpipe
export GFAL_PYTHONBIN=/usr/bin/python3

bytes_of() { numfmt --from=iec "${1%B}"; }
make_file() {
    local n
    n=$(bytes_of "$2")
    { openssl enc -aes-128-ctr -pass pass:fatpipe -nosalt -pbkdf2 </dev/zero 2>/dev/null || true; } |
        head -c "$n" >"$1"
    [ "$(stat -c %s "$1")" = "$n" ] || die "could not make $1"
}

src="$work/src"
dst="$work/dst"
xsrc="$work/xsrc"
xdst="$work/xdst"
mkdir -p "$src" "$dst" "$xsrc" "$xdst" "$work/small"
echo "== making a $SIZE file and $SMALL_N files of 8 MiB"
make_file "$src/big.bin" "$SIZE"
size=$(stat -c %s "$src/big.bin")
ln "$src/big.bin" "$xsrc/big.bin"
make_file "$work/small/seed" 8M
for i in $(seq "$SMALL_N"); do
    # Different files (their first bytes differ), cheaply.
    { printf '%08d' "$i"; tail -c +9 "$work/small/seed"; } >"$src/s$i.bin"
    ln "$src/s$i.bin" "$xsrc/s$i.bin"
done
(umask 077 && echo "fatpipe-bench-key-$$" >"$work/key")
chown -R nobody "$xsrc" "$xdst"

# xrootd_cfg NAME ADDR DATA: an XRootD 5.5.3 config with XrdHttp on
# PORT_XRD and its TPC handler (loaded only with TLS configured).
xrootd_cfg() {
    local name=$1 addr=$2 data=$3 d="$work/xrd-$1"
    mkdir -p "$d/adm"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=$addr" -addext "subjectAltName=IP:$addr" \
        -keyout "$d/tls.key" -out "$d/tls.crt" 2>/dev/null
    cat >"$d/x.cfg" <<EOF
all.export /
oss.localroot $data
all.adminpath $d/adm
all.pidpath $d/adm
xrd.port $((PORT_XRD + 1))
xrd.tls $d/tls.crt $d/tls.key
xrd.tlsca certfile $d/tls.crt
xrd.protocol XrdHttp:$PORT_XRD libXrdHttp.so
http.exthandler xrdtpc libXrdHttpTPC.so
xrootd.chksum adler32
EOF
    chown -R nobody "$d"
}

# timed CMD...: wall-clock bit/s of CMD moving SIZE, run in namespace a.
timed() {
    local t0 t1
    t0=$(date +%s.%N)
    if ip netns exec "fp-$LABNAME-a" "$@" >"$work/last.log" 2>&1; then
        t1=$(date +%s.%N)
        awk -v a="$t0" -v b="$t1" -v n="$size" 'BEGIN { printf "%.0f\n", n * 8 / (b - a) }'
    else
        tail -3 "$work/last.log" >&2
        echo FAIL
    fi
}

clean_dst() { rm -f "$dst"/* "$xdst"/* "$work/copied"/* 2>/dev/null || true; }

summary=()
for link in $LINKS; do
    rtt=${link%%:*} loss=${link#*:}
    tag="$rtt/$loss"
    echo "== lab 1 Gbit/s x $rtt, $loss loss; $SIZE, $RUNS alternating runs"
    "$FATPIPE" lab up "$LABNAME" --rate 1gbit --rtt "$rtt" --loss "$loss" --owner $$ >/dev/null
    A=$(ip -n "fp-$LABNAME-a" -4 -o addr show dev lab-a | awk '{split($4,a,"/"); print a[1]}')
    B=$(ip -n "fp-$LABNAME-b" -4 -o addr show dev lab-b | awk '{split($4,a,"/"); print a[1]}')
    start_server "fp-$LABNAME-b" fpb "$PORT_FP" "$FATPIPE" server --bind "$B" --port "$PORT_COPY" \
        --key-file "$work/key" --export "src=$src:public" --http "$B:$PORT_FP" ||
        die "fatpipe server did not start in b"
    start_server "fp-$LABNAME-a" fpa "$PORT_FP" "$FATPIPE" server --bind "$A" --port "$PORT_COPY" \
        --key-file "$work/key" --export "dst=$dst:public" --http "$A:$PORT_FP" --http-tpc-leg "$LEG" ||
        die "fatpipe server did not start in a"
    xrootd_cfg b "$B" "$xsrc"
    xrootd_cfg a "$A" "$xdst"
    start_server "fp-$LABNAME-b" xrdb "$PORT_XRD" xrootd -R nobody -l "$work/xrd-b/log" -n fptb \
        -c "$work/xrd-b/x.cfg" || die "XRootD did not start in b"
    start_server "fp-$LABNAME-a" xrda "$PORT_XRD" xrootd -R nobody -l "$work/xrd-a/log" -n fpta \
        -c "$work/xrd-a/x.cfg" || die "XRootD did not start in a"
    # Both sources' adler32 computed once, before the runs.
    ip netns exec "fp-$LABNAME-a" curl -sS -I -H 'Want-Digest: adler32' "http://$B:$PORT_FP/src/big.bin" >/dev/null
    ip netns exec "fp-$LABNAME-a" curl -sS -I -H 'Want-Digest: adler32' "http://$B:$PORT_XRD/big.bin" >/dev/null
    mkdir -p "$work/copied"
    gc=(gfal-copy -t 3600 --copy-mode pull -K adler32)
    for r in $(seq "$RUNS"); do
        clean_dst
        if want fp-fp; then
            v=$(timed "${gc[@]}" -n 1 "http://$B:$PORT_FP/src/big.bin" "http://$A:$PORT_FP/dst/fp.bin")
            echo "$v" >>"$work/$rtt-fp-fp.txt"; echo "  run $r fp-fp (gfal-copy, 1 stream): $(ratio "$v" 1e9 %.3f) Gbit/s"
        fi
        if want fp-xrd; then
            v=$(timed "${gc[@]}" -n 1 "http://$B:$PORT_XRD/big.bin" "http://$A:$PORT_FP/dst/fx.bin")
            echo "$v" >>"$work/$rtt-fp-xrd.txt"; echo "  run $r fp-xrd (fatpipe pulls from XRootD): $(ratio "$v" 1e9 %.3f) Gbit/s"
        fi
        if want xrd-1; then
            v=$(timed "${gc[@]}" -n 1 "http://$B:$PORT_XRD/big.bin" "http://$A:$PORT_XRD/x1.bin")
            echo "$v" >>"$work/$rtt-xrd-1.txt"; echo "  run $r xrd-xrd 1 stream: $(ratio "$v" 1e9 %.3f) Gbit/s"
        fi
        clean_dst
        if want xrd-4; then
            v=$(timed "${gc[@]}" -n 4 "http://$B:$PORT_XRD/big.bin" "http://$A:$PORT_XRD/x4.bin")
            echo "$v" >>"$work/$rtt-xrd-4.txt"; echo "  run $r xrd-xrd 4 streams: $(ratio "$v" 1e9 %.3f) Gbit/s"
        fi
        if want copy; then
            v=$(timed "$FATPIPE" copy -q --port "$PORT_COPY" --key-file "$work/key" "$B:src/big.bin" "$work/copied/")
            echo "$v" >>"$work/$rtt-copy.txt"; echo "  run $r fatpipe copy: $(ratio "$v" 1e9 %.3f) Gbit/s"
        fi
    done
    clean_dst
    m() { [ -s "$work/$rtt-$1.txt" ] && median '%.0f' <"$work/$rtt-$1.txt" || echo n/a; }
    fp=$(m fp-fp) fx=$(m fp-xrd) x1=$(m xrd-1) x4=$(m xrd-4) cp=$(m copy)
    best=$(printf '%s\n%s\n' "$x1" "$x4" | median '%.0f')
    is_num "$x1" && is_num "$x4" && best=$(awk -v a="$x1" -v b="$x4" 'BEGIN{print (a > b ? a : b)}')
    printf '%-34s %10s\n' "$tag" "Gbit/s"
    printf '%-34s %10s\n' "fatpipe->fatpipe COPY (gfal, 1)" "$(ratio "$fp" 1e9 %.3f)"
    printf '%-34s %10s\n' "XRootD->fatpipe COPY (gfal, 1)" "$(ratio "$fx" 1e9 %.3f)"
    printf '%-34s %10s\n' "XRootD->XRootD COPY, 1 stream" "$(ratio "$x1" 1e9 %.3f)"
    printf '%-34s %10s\n' "XRootD->XRootD COPY, 4 streams" "$(ratio "$x4" 1e9 %.3f)"
    printf '%-34s %10s\n' "fatpipe copy (own protocol)" "$(ratio "$cp" 1e9 %.3f)"
    summary+=("$tag: fatpipe COPY $(ratio "$fp" 1e9 %.3f) Gbit/s = $(ratio "$fp" "$cp") x fatpipe copy (target >= 0.95), $(ratio "$fp" "$best") x XRootD's best")

    # Small files, one COPY each, in sequence.
    if [ "$SMALL_N" = 0 ]; then
        clean_dst
        stop_servers
        "$FATPIPE" lab down "$LABNAME" >/dev/null
        continue
    fi
    n_fp=0 n_x=0
    t0=$(date +%s.%N)
    for i in $(seq "$SMALL_N"); do
        ip netns exec "fp-$LABNAME-a" curl -sS -X COPY -H "Source: http://$B:$PORT_FP/src/s$i.bin" \
            "http://$A:$PORT_FP/dst/s$i.bin" | tail -n 1 | grep -q '^success' && n_fp=$((n_fp + 1))
    done
    t1=$(date +%s.%N)
    fps_fp=$(awk -v a="$t0" -v b="$t1" -v n="$n_fp" 'BEGIN { printf "%.2f\n", n / (b - a) }')
    t0=$(date +%s.%N)
    for i in $(seq "$SMALL_N"); do
        ip netns exec "fp-$LABNAME-a" curl -sS -X COPY -H "Source: http://$B:$PORT_XRD/s$i.bin" \
            "http://$A:$PORT_XRD/s$i.bin" | tail -n 1 | grep -q '^success' && n_x=$((n_x + 1))
    done
    t1=$(date +%s.%N)
    fps_x=$(awk -v a="$t0" -v b="$t1" -v n="$n_x" 'BEGIN { printf "%.2f\n", n / (b - a) }')
    echo "  $SMALL_N COPYs of 8 MiB in sequence: fatpipe $fps_fp files/s ($n_fp ok), XRootD $fps_x files/s ($n_x ok)"
    summary+=("$tag: $SMALL_N x 8 MiB COPYs: fatpipe $fps_fp files/s, XRootD $fps_x, x$(ratio "$fps_fp" "$fps_x")")
    clean_dst
    stop_servers
    "$FATPIPE" lab down "$LABNAME" >/dev/null
done
echo "== summary"
printf '%s\n' "${summary[@]}"
