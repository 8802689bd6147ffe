#!/usr/bin/env bash
# bench/http.sh: fatpipe's HTTP port and HTTP client against the stock tools
# (issue 31's "Speed").
#
# Part 1, veth: two network namespaces joined by a veth pair (198.18.0.1/24
# server side, 198.18.0.2/24 client side). One file of SIZE (default 4G) is
# served by `fatpipe server --http` (plain HTTP, a :public export) and by
# Debian's nginx (one process: master_process off, sendfile on) from the
# same directory; the same client (curl -o /dev/null) GETs it from each,
# alternating within every run. Per server: the rate (curl's) and the
# server's CPU seconds per GB (user+system from /proc/PID/stat before and
# after), medians over RUNS.
#
# Part 2, lab (LAB=1, the default): `fatpipe lab up --rate 1gbit --rtt 93ms
# --loss 0.01%`, a fatpipe server with --http (HTTPS, a test CA) in
# namespace b serving LAB_SIZE (default 4G); from namespace a, alternating:
# `fatpipe copy https://…` (auto-tuned connections), `davix-get -k` (it
# takes no CA file) and `curl --cacert`
# pulling the file to disk. Rate over each command's wall clock, medians,
# and fatpipe's ratio to each.
#
# Needs root (namespaces). Installs nginx-light, curl, davix and openssl if
# missing. Servers are ended by PID, namespaces removed, on any exit. The
# machine may be shared: figures are medians, and noisy.
#
# Settings (environment):
#   RUNS=3 SIZE=4G LAB=1 LAB_SIZE=4G LAB_RUNS=$RUNS
#   FATPIPE=path/to/fatpipe   (default: build with cargo --release)
#   KEEP=1                    (keep the work directory)
set -euo pipefail

RUNS=${RUNS:-3}
SIZE=${SIZE:-4G}
LAB=${LAB:-1}
LAB_SIZE=${LAB_SIZE:-4G}
LAB_RUNS=${LAB_RUNS:-$RUNS}

SERVER_IP=198.18.0.1
CLIENT_IP=198.18.0.2
NS_S="fphttp-s-$$"
NS_C="fphttp-c-$$"
VETH_S="fph$$s"
VETH_C="fph$$c"
PORT_FP=8080
PORT_NGINX=8081
LABNAME="fph$$"

BENCH=http
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d /var/tmp/fatpipe-http-bench.XXXXXX)

cleanup() {
    stop_servers
    ip netns del "$NS_S" 2>/dev/null || true
    ip netns del "$NS_C" 2>/dev/null || true
    [ -n "${FATPIPE:-}" ] && "$FATPIPE" lab down "$LABNAME" >/dev/null 2>&1 || true
    drop_work
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces"
install_missing nginx:nginx-light curl:curl davix-get:davix openssl:openssl
build_fatpipe
HZ=$(getconf CLK_TCK)

bytes_of() { numfmt --from=iec "${1%B}"; }

# make_file PATH SIZE: a file of pseudo-random bytes (not zeros: nothing
# on the path may compress or skip it).
make_file() {
    local n
    n=$(bytes_of "$2")
    # openssl dies of SIGPIPE when head has enough: not a failure.
    { openssl enc -aes-128-ctr -pass pass:fatpipe -nosalt -pbkdf2 </dev/zero 2>/dev/null || true; } |
        head -c "$n" >"$1"
    [ "$(stat -c %s "$1")" = "$n" ] || die "could not make $1"
}

# ---------------------------------------------------------------- part 1
srv="$work/srv"
mkdir -p "$srv"
echo "== making a $SIZE file"
make_file "$srv/big.bin" "$SIZE"
size=$(stat -c %s "$srv/big.bin")

setup_veth "$NS_S" "$NS_C" "$VETH_S" "$VETH_C" "$SERVER_IP" "$CLIENT_IP"

cat >"$work/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
error_log $work/nginx-error.log;
pid $work/nginx.pid;
events { worker_connections 64; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    client_body_temp_path $work/nginx-tmp;
    proxy_temp_path $work/nginx-tmp;
    fastcgi_temp_path $work/nginx-tmp;
    uwsgi_temp_path $work/nginx-tmp;
    scgi_temp_path $work/nginx-tmp;
    server {
        listen $SERVER_IP:$PORT_NGINX;
        root $srv;
    }
}
EOF
mkdir -p "$work/nginx-tmp"
start_server "$NS_S" nginx "$PORT_NGINX" nginx -c "$work/nginx.conf" || die "nginx did not start"
start_server "$NS_S" fatpipe "$PORT_FP" "$FATPIPE" server --bind "$SERVER_IP" --port 5301 \
    --export "pub=$srv:public" --http "$SERVER_IP:$PORT_FP" || die "fatpipe server did not start"

# one_get NAME URL: rate (bit/s) and server CPU seconds per GB of one GET.
one_get() {
    local name=$1 url=$2 pid=${SERVER_PID[$1]} t0 t1 speed
    t0=$(proc_ticks "$pid")
    speed=$(ip netns exec "$NS_C" curl -sS -o /dev/null -w '%{speed_download}' "$url") || speed=FAIL
    t1=$(proc_ticks "$pid")
    awk -v s="$speed" -v a="$t0" -v b="$t1" -v hz="$HZ" -v n="$size" \
        'BEGIN { if (s+0 > 0) printf "%.0f %.3f\n", s * 8, (b - a) / hz / (n / 1e9); else print "FAIL FAIL" }'
}

echo "== part 1: one GET of $SIZE over veth, $RUNS alternating runs"
for r in $(seq "$RUNS"); do
    read -r rate cpu < <(one_get fatpipe "http://$SERVER_IP:$PORT_FP/pub/big.bin")
    echo "$rate $cpu" >>"$work/fatpipe.txt"
    echo "  run $r fatpipe: $(awk -v r="$rate" 'BEGIN{printf "%.2f Gbit/s", r/1e9}') server CPU $cpu s/GB"
    read -r rate cpu < <(one_get nginx "http://$SERVER_IP:$PORT_NGINX/big.bin")
    echo "$rate $cpu" >>"$work/nginx.txt"
    echo "  run $r nginx:   $(awk -v r="$rate" 'BEGIN{printf "%.2f Gbit/s", r/1e9}') server CPU $cpu s/GB"
done
fr=$(median '%.0f' <"$work/fatpipe.txt")
nr=$(median '%.0f' <"$work/nginx.txt")
fc=$(awk '{print $2}' "$work/fatpipe.txt" | median '%.3f')
nc=$(awk '{print $2}' "$work/nginx.txt" | median '%.3f')
printf '%-10s %12s %16s\n' server "rate Gbit/s" "CPU s/GB (server)"
printf '%-10s %12s %16s\n' fatpipe "$(ratio "$fr" 1e9)" "$fc"
printf '%-10s %12s %16s\n' nginx "$(ratio "$nr" 1e9)" "$nc"
echo "fatpipe/nginx rate: $(ratio "$fr" "$nr") (target >= 1.0); CPU per GB: $(ratio "$fc" "$nc")"
stop_servers
ip netns del "$NS_S"
ip netns del "$NS_C"
rm -f "$srv/big.bin"

[ "$LAB" = 1 ] || exit 0

# ---------------------------------------------------------------- part 2
echo "== part 2: lab 1 Gbit/s x 93 ms, 0.01 % loss; $LAB_SIZE over HTTPS, $LAB_RUNS alternating runs"
"$FATPIPE" lab up "$LABNAME" --rate 1gbit --rtt 93ms --loss 0.01% --owner $$ >/dev/null
addr=$(ip -n "fp-$LABNAME-b" -4 -o addr show dev lab-b | awk '{split($4,a,"/"); print a[1]}')
make_file "$srv/big.bin" "$LAB_SIZE"
lsize=$(stat -c %s "$srv/big.bin")
(
    cd "$work"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=fatpipe bench CA" -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=lab \
        -keyout leaf.key -out leaf.csr 2>/dev/null
    printf 'subjectAltName=IP:%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$addr" >ext
    openssl x509 -req -days 2 -set_serial 9 -in leaf.csr -CA ca.crt -CAkey ca.key \
        -extfile ext -out leaf.crt 2>/dev/null
)
start_server "fp-$LABNAME-b" labfp "$PORT_FP" "$FATPIPE" server --bind "$addr" --port 5301 \
    --export "pub=$srv:public" --http "$addr:$PORT_FP" \
    --tls-cert "$work/leaf.crt" --tls-key "$work/leaf.key" || die "fatpipe server did not start in the lab"
url="https://$addr:$PORT_FP/pub/big.bin"
# The server's adler32 is computed once, before the runs, not in the first.
ip netns exec "fp-$LABNAME-a" curl -sS --cacert "$work/ca.crt" -I -H 'Want-Digest: adler32' "$url" >/dev/null
dst="$work/dst"
mkdir -p "$dst"

# timed NAME CMD...: wall seconds of CMD run in namespace a (FAIL if it fails).
timed() {
    local t0 t1
    rm -f "$dst"/* "$dst"/.fatpipe-* 2>/dev/null || true
    t0=$(date +%s.%N)
    if ip netns exec "fp-$LABNAME-a" "$@" >"$work/last.log" 2>&1; then
        t1=$(date +%s.%N)
        awk -v a="$t0" -v b="$t1" -v n="$lsize" 'BEGIN { printf "%.0f\n", n * 8 / (b - a) }'
    else
        tail -3 "$work/last.log" >&2
        echo FAIL
    fi
}

for r in $(seq "$LAB_RUNS"); do
    v=$(timed "$FATPIPE" copy -q --ca "$work/ca.crt" "$url" "$dst/f.bin"); echo "$v" >>"$work/lab-fatpipe.txt"
    echo "  run $r fatpipe copy: $(ratio "$v" 1e9 %.3f) Gbit/s"
    v=$(timed davix-get -k "$url" "$dst/d.bin"); echo "$v" >>"$work/lab-davix.txt"
    echo "  run $r davix-get:    $(ratio "$v" 1e9 %.3f) Gbit/s"
    v=$(timed curl -sS --cacert "$work/ca.crt" -o "$dst/c.bin" "$url"); echo "$v" >>"$work/lab-curl.txt"
    echo "  run $r curl:         $(ratio "$v" 1e9 %.3f) Gbit/s"
done
lf=$(median '%.0f' <"$work/lab-fatpipe.txt")
ld=$(median '%.0f' <"$work/lab-davix.txt")
lc=$(median '%.0f' <"$work/lab-curl.txt")
printf '%-18s %14s\n' client "Gbit/s (wall)"
printf '%-18s %14s\n' "fatpipe copy" "$(ratio "$lf" 1e9 %.3f)"
printf '%-18s %14s\n' davix-get "$(ratio "$ld" 1e9 %.3f)"
printf '%-18s %14s\n' curl "$(ratio "$lc" 1e9 %.3f)"
echo "fatpipe copy: $(ratio "$lf" 1e9 %.3f) Gbit/s (target >= 0.85); x$(ratio "$lf" "$ld") davix-get, x$(ratio "$lf" "$lc") curl"
