#!/usr/bin/env bash
# Installs what the tests need and runs them all: format, lints, unit,
# integration and lab tests, a check that a release build ignores the test
# hooks, and a short run of every fuzz target.
#
# The tests run with the `test-hooks` feature (FEATURES below), which compiles
# in the FATPIPE_TEST_* variables that make the binary misbehave on purpose
# (corrupt a chunk, force the copy's adjuster); ordinary builds, release
# included, leave them out.
#
# Lab tests need root (network namespaces, TUN devices). As root they run;
# otherwise they skip with a message that says why. CI (CI=true) runs as root.
#
# The archive's PostgreSQL tests need a server: as root this script starts a
# private one (scripts/pg-test-server.sh: 127.0.0.1 only, its own port and
# directory, run as the postgres user) and stops it on exit; otherwise they
# skip with a message, unless FATPIPE_TEST_POSTGRES already names a server.
#
# The HTML report's test opens it in Debian's headless Chromium (installed
# here with fonts-dejavu-core) and inspects the screenshot; without it the
# test skips outside CI and fails in CI.
#
# Environment:
#   FUZZ_SECONDS  seconds per fuzz target (default 20; 0 skips fuzzing)
#   FATPIPE_TEST_POSTGRES  postgres:// URL of a server to test the archive
#                 against instead of starting one
#   PG_TEST_PORT  port of the private PostgreSQL (default 54329)
set -euo pipefail
cd "$(dirname "$0")"

FEATURES=(--features fatpipe/test-hooks)

say() { printf '\n==> %s\n' "$*"; }

# --- what the tests need -----------------------------------------------------
APT_PACKAGES=(iperf3 iperf nuttcp iproute2 iputils-ping procps kmod ethtool postgresql systemd groff-base zsh fish openssl chromium fonts-dejavu-core)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Debian's postgresql package would start a default server of its own
    # while installing; the tests start their own private one, so no
    # service may start during the install (policy-rc.d exit 101 = deny).
    policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      policy=/usr/sbin/policy-rc.d
      printf '#!/bin/sh\nexit 101\n' >"$policy"
      chmod 755 "$policy"
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    [ -z "$policy" ] || rm -f "$policy"
  else
    echo "note: not root, cannot install ${missing[*]}; tests that need them will skip"
  fi
fi

# --- archive: a private PostgreSQL for the archive tests (begin) ----------------
# Started before the cargo steps, stopped (pg_ctl stop, by its PID file) and
# its directory removed on exit, whatever the outcome.
if [ -z "${FATPIPE_TEST_POSTGRES:-}" ]; then
  if [ "$(id -u)" = 0 ]; then
    pg_test_dir=$(mktemp -d /tmp/fatpipe-pg.XXXXXX)
    trap 'scripts/pg-test-server.sh stop "$pg_test_dir"' EXIT
    say "starting a private PostgreSQL on 127.0.0.1:${PG_TEST_PORT:-54329}"
    FATPIPE_TEST_POSTGRES=$(scripts/pg-test-server.sh start "$pg_test_dir" "${PG_TEST_PORT:-54329}")
    export FATPIPE_TEST_POSTGRES
  else
    echo "note: not root, no private PostgreSQL; the archive's PostgreSQL tests will skip"
  fi
fi
# --- archive (end) ---------------------------------------------------------------

# --- static checks -------------------------------------------------------------
say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy -D warnings (without and with the test hooks)"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --locked "${FEATURES[@]}" -- -D warnings

# --- tests ----------------------------------------------------------------------

say "cargo test (unit and integration; lab and flood tests apart)"
# Tests whose name contains `lab_` measure time and throughput through an
# emulated link. On 2 cores they must not share the CPU with the heavy
# loopback tests, so they run afterwards, one at a time. The server flood
# test (`flood::`) opens thousands of connections a second for seconds: it
# runs alone too, since beside it other tests' start-up waits (a stock
# iperf3 server coming up) ran out. So do the memory tests (`memory::`),
# whose 1,024-stream test runs two thousand threads for seconds.
cargo test --workspace --release --locked "${FEATURES[@]}" -- --skip lab_ --skip flood:: --skip memory::

say "cargo test: the flood and memory tests, alone"
cargo test --release --locked -p fatpipe --test integration "${FEATURES[@]}" -- flood:: memory:: --test-threads=1

say "cargo test: lab tests, one at a time"
cargo test --workspace --release --locked "${FEATURES[@]}" -- lab_ --test-threads=1

say "release build ignores the test hooks"
# Built without the feature, as `cargo build --release` builds it: a copy
# given every FATPIPE_TEST_* variable behaves as without them, and the
# corruption hook's name is not even in the binary. (This leaves the
# hook-free binary in target/release, as a release build would.)
cargo test --release --locked -p fatpipe --test integration -- test_hooks_are_ignored
cargo build --release --locked
if grep -aq FATPIPE_TEST_CORRUPT_CHUNK target/release/fatpipe; then
  echo "error: target/release/fatpipe knows FATPIPE_TEST_CORRUPT_CHUNK: the test-hooks feature leaked into a release build" >&2
  exit 1
fi

# --- fuzzing --------------------------------------------------------------------
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
if [ -d fuzz ] && [ "$FUZZ_SECONDS" != 0 ]; then
  if ! rustup toolchain list 2>/dev/null | grep -q nightly; then
    echo "note: fuzzing skipped: no nightly toolchain (cargo fuzz needs one)"
  else
    command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked -q
    for target in $(cargo +nightly fuzz list); do
      say "fuzz $target for ${FUZZ_SECONDS}s"
      # -a: debug assertions and overflow checks on (cargo fuzz builds
      # release without them by default): wire arithmetic must not overflow.
      cargo +nightly fuzz run "$target" -a -- -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 2>&1 | tail -n 3
    done
  fi
fi

say "all checks passed"
