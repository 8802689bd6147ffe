#!/usr/bin/env bash
# Builds fatpipe's .deb and .rpm into target/pkg/:
#   scripts/package.sh               # release build, then both packages
#   FATPIPE_PROFILE=ci scripts/package.sh --no-build   # package target/ci/fatpipe
#
# The binary, the systemd units and timer (contrib/systemd), sysusers.d and
# tmpfiles.d entries, a commented /etc/fatpipe/server.toml generated from
# the binary's own flags (`server --print-config`), man pages and
# bash/zsh/fish completions generated from the binary, the Grafana
# dashboard and the docs. Packaging tools: cargo-deb (installed with `cargo
# install` if missing) and rpmbuild (packaging/rpm/fatpipe.spec; Debian's
# `rpm` package has it). FATPIPE_RPM_SIGN=KEYID signs the .rpm with that
# GnuPG key (rpmsign). Neither package starts the service: an operator
# configures a key and exports first.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${FATPIPE_PROFILE:-release}
build=1
for a in "$@"; do
    case $a in
    --no-build) build=0 ;;
    *)
        echo "package.sh: unknown argument $a (--no-build only)" >&2
        exit 2
        ;;
    esac
done

if ! cargo deb --version >/dev/null 2>&1; then
    echo "==> cargo install cargo-deb (once per machine)"
    cargo install --locked cargo-deb
fi
command -v rpmbuild >/dev/null || {
    echo "package.sh: rpmbuild is missing (Debian: apt install rpm)" >&2
    exit 2
}

if [ "$build" = 1 ]; then
    cargo build --profile "$profile" -p fatpipe --locked
fi
bin=target/$profile/fatpipe
[ -x "$bin" ] || {
    echo "package.sh: $bin is missing; build it or drop --no-build" >&2
    exit 2
}

# What the packages carry that the binary generates: always from this build.
gen=target/pkg/gen
rm -rf "$gen"
mkdir -p "$gen/man" "$gen/completions"
"$bin" man --dir "$gen/man"
gzip -9n "$gen"/man/*.1
"$bin" completions bash >"$gen/completions/fatpipe"
"$bin" completions zsh >"$gen/completions/_fatpipe"
"$bin" completions fish >"$gen/completions/fatpipe.fish"
{
    cat <<'HEAD'
# /etc/fatpipe/server.toml: fatpipe-server.service's settings.
#
# Each key is a long flag of `fatpipe server --help` (man fatpipe-server);
# below, every one with its help and default, commented out. Uncomment and
# change what you need; `fatpipe server --config /etc/fatpipe/server.toml
# --print-config` shows what the server will use. Documentation:
# /usr/share/doc/fatpipe/config.md.
#
# Before `systemctl enable --now fatpipe-server`:
#   fatpipe key new /etc/fatpipe/key && chown fatpipe: /etc/fatpipe/key
# then set key-file = "/etc/fatpipe/key" and an export below, e.g.
#   export = ["data=/srv/fatpipe"]
# (install -d -o fatpipe -g fatpipe /srv/fatpipe; an export elsewhere also
# needs ReadWritePaths= in `systemctl edit fatpipe-server`).
HEAD
    # Defaults come out commented (`# key = value  (default)`).
    "$bin" server --print-config | sed -e '1,3d'
} >"$gen/server.toml"
# Every setting line must be commented: the defaults are the binary's.
if grep -qv -e '^#' -e '^$' "$gen/server.toml"; then
    echo "package.sh: uncommented line in the example config:" >&2
    grep -v -e '^#' -e '^$' "$gen/server.toml" >&2
    exit 1
fi

mkdir -p target/pkg
rm -f target/pkg/*.deb target/pkg/*.rpm target/pkg/RPM-GPG-KEY-fatpipe
cargo deb -p fatpipe --profile "$profile" --no-build --output target/pkg/
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
rm -rf target/pkg/rpmbuild
strip -o "$gen/fatpipe" "$bin"
rpmbuild -bb --quiet --define "_topdir $PWD/target/pkg/rpmbuild" --define "fp_src $PWD" \
    --define "fp_bin $gen/fatpipe" --define "fp_version $version" packaging/rpm/fatpipe.spec
mv target/pkg/rpmbuild/RPMS/*/fatpipe-*.rpm target/pkg/
if [ -n "${FATPIPE_RPM_SIGN:-}" ]; then
    rpmsign --define "_gpg_name $FATPIPE_RPM_SIGN" --define "__gpg $(command -v gpg)" \
        --addsign target/pkg/fatpipe-*.rpm
    # Published beside the packages: users `rpm --import` it first.
    gpg --batch --armor --export "$FATPIPE_RPM_SIGN" >target/pkg/RPM-GPG-KEY-fatpipe
fi
ls -l target/pkg/*.deb target/pkg/*.rpm
