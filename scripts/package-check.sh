#!/usr/bin/env bash
# Checks the packages scripts/package.sh built (run by ./test.sh as root):
#   - lintian: no errors in the .deb; rpmlint: no errors in the .rpm;
#   - the .deb installs with dpkg; the packaged units pass systemd-analyze
#     verify;
#   - the server starts as the packaged unit starts it (its ExecStart, as
#     the packaged user, from the packaged config with a key and an export
#     added the way docs/config.md tells an operator), and a `fatpipe test`
#     and a `fatpipe copy` against it succeed;
#   - `dpkg --purge` leaves no file or directory the package created (the
#     system user stays, as Debian's policy advises).
# Installs and purges the package on this machine: root only.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "package-check.sh: needs root (dpkg -i); skipped" >&2
    exit 0
fi
deb=$(ls target/pkg/fatpipe_*.deb)
rpm=$(ls target/pkg/fatpipe-*.rpm)

echo "--> lintian $deb"
lintian --fail-on error "$deb"
echo "--> rpmlint $rpm"
# Its signature is checked against the key package.sh published, imported
# as a user would, into an rpm database of this check's own.
rpmhome=$(mktemp -d)
echo "%_dbpath $rpmhome/rpmdb" >"$rpmhome/.rpmmacros"
if [ -e target/pkg/RPM-GPG-KEY-fatpipe ]; then
    HOME=$rpmhome rpmkeys --import target/pkg/RPM-GPG-KEY-fatpipe
fi
HOME=$rpmhome rpmlint "$rpm"
rm -rf "$rpmhome"

# A package left by an interrupted earlier run goes first.
if dpkg -s fatpipe >/dev/null 2>&1; then
    dpkg --purge fatpipe >/dev/null
fi
# What existed before, so the purge is judged only on what it created.
mapfile -t paths < <(dpkg-deb -c "$deb" | awk '{print $6}' | sed -e 's|^\./|/|' -e 's|/$||' | grep -v '^/$')
paths+=(/var/lib/fatpipe /var/log/fatpipe /etc/fatpipe)
declare -A before
for p in "${paths[@]}"; do
    [ -e "$p" ] && before[$p]=1
done

work=$(mktemp -d /tmp/fatpipe-pkg.XXXXXX)
srv=
cleanup() {
    if [ -n "$srv" ]; then
        kill -TERM "$srv" 2>/dev/null || true
        wait "$srv" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "--> dpkg -i $deb"
dpkg -i "$deb"
getent passwd fatpipe >/dev/null || {
    echo "package-check: no fatpipe user after install" >&2
    exit 1
}
for d in /var/lib/fatpipe /var/log/fatpipe; do
    [ "$(stat -c %U "$d")" = fatpipe ] || {
        echo "package-check: $d is not the fatpipe user's" >&2
        exit 1
    }
done
echo "--> systemd-analyze verify"
(cd /usr/lib/systemd/system && systemd-analyze verify fatpipe-server.service fatpipe-test@.timer)

# The operator's steps (docs/config.md), on loopback and a free port.
fatpipe key new /etc/fatpipe/key
chown fatpipe: /etc/fatpipe/key
install -d -o fatpipe -g fatpipe "$work/export"
cat >>/etc/fatpipe/server.toml <<CONF
bind = "127.0.0.1"
port = 0
key-file = "/etc/fatpipe/key"
export = ["data=$work/export"]
CONF
chmod 755 "$work"
exec_start=$(sed -n 's/^ExecStart=//p' /usr/lib/systemd/system/fatpipe-server.service)
echo "--> as fatpipe: $exec_start"
# shellcheck disable=SC2086 # ExecStart is a command line, split as systemd does
setpriv --reuid=fatpipe --regid=fatpipe --init-groups $exec_start >"$work/out" 2>"$work/err" &
srv=$!
port=
for _ in $(seq 1 200); do
    port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$work/out")
    [ -n "$port" ] && break
    kill -0 "$srv" 2>/dev/null || break
    sleep 0.05
done
if [ -z "$port" ]; then
    echo "package-check: the packaged server did not start:" >&2
    cat "$work/err" >&2
    exit 1
fi
fatpipe test 127.0.0.1 -p "$port" --key-file /etc/fatpipe/key -t 2 --no-auto
head -c 20000000 /dev/urandom >"$work/f.bin"
fatpipe copy -q -p "$port" --key-file /etc/fatpipe/key "$work/f.bin" 127.0.0.1:data/f.bin
cmp "$work/f.bin" "$work/export/f.bin"
[ "$(stat -c %U "$work/export/f.bin")" = fatpipe ]
kill -TERM "$srv"
wait "$srv"
srv=

echo "--> dpkg --purge fatpipe"
rm -f /etc/fatpipe/key
dpkg --purge fatpipe
left=0
for p in "${paths[@]}"; do
    if [ -z "${before[$p]:-}" ] && [ -e "$p" ]; then
        echo "package-check: left after purge: $p" >&2
        left=1
    fi
done
[ "$left" = 0 ]
echo "package-check: ok (lintian, rpmlint, install, verify, serve, purge)"
