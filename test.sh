#!/usr/bin/env bash
# Installs what the tests need and runs them all: format, lints, unit,
# integration and lab tests, a check that a release build ignores the test
# hooks, the packages (built, linted, installed, served from, purged; as
# root) and a short run of every fuzz target.
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
# Everything is compiled once, in the `ci` profile (Cargo.toml: release's
# optimisation without LTO), and run by cargo-nextest (installed here),
# which gives every test a timeout (.config/nextest.toml) and names a hung
# test when it kills it. Each stage's wall time and the slowest tests are
# printed at the end.
#
# Environment:
#   FUZZ_SECONDS  seconds per fuzz target (default 4: 21 targets, two at a
#                 time, fit the 15-minute CI; 0 skips fuzzing)
#   FUZZ_JOBS     fuzz targets run at once (default: the number of cores)
#   FATPIPE_TEST_POSTGRES  postgres:// URL of a server to test the archive
#                 against instead of starting one
#   PG_TEST_PORT  port of the private PostgreSQL (default 54329)
set -euo pipefail
cd "$(dirname "$0")"

FEATURES=(--features fatpipe/test-hooks)
PROFILE=(--cargo-profile ci)

say() { printf '\n==> %s\n' "$*"; }

# Stage timing: `stage NAME` closes the previous stage and opens NAME; the
# table is printed on exit, whatever the outcome.
stage_names=()
stage_secs=()
stage_t0=$SECONDS
stage_name=""
stage() {
  if [ -n "$stage_name" ]; then
    stage_names+=("$stage_name")
    stage_secs+=($((SECONDS - stage_t0)))
  fi
  stage_name=$1
  stage_t0=$SECONDS
  [ -z "$1" ] || say "$1"
}
stage_table() {
  stage ""
  printf '\n==> wall time by stage\n'
  local i
  for i in "${!stage_names[@]}"; do
    printf '  %5ds  %s\n' "${stage_secs[$i]}" "${stage_names[$i]}"
  done
  printf '  %5ds  total\n' "$SECONDS"
}
on_exit=(stage_table)
run_on_exit() {
  local rc=$? f
  for f in "${on_exit[@]}"; do $f || true; done
  exit $rc
}
trap run_on_exit EXIT

stage "installing what the tests need"

# --- what the tests need -----------------------------------------------------
APT_PACKAGES=(curl davix davix-tests gfal2-util-scripts gfal2-plugin-http gfal2-plugin-file xrootd-server xrootd-server-plugins iperf3 iperf nuttcp iproute2 iputils-ping procps kmod ethtool postgresql systemd groff-base zsh fish openssl chromium fonts-dejavu-core sccache lintian rpmlint rpm)
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

# cargo-nextest runs the tests (per-test timeouts, the slowest-tests report);
# cargo-fuzz runs the fuzz targets. Both come from crates.io, built once
# into ~/.cargo/bin.
command -v cargo-nextest >/dev/null 2>&1 || {
  say "installing cargo-nextest"
  cargo install cargo-nextest --locked -q
}
# cargo-deb builds the .deb (scripts/package.sh; rpmbuild, Debian's, the .rpm).
command -v cargo-deb >/dev/null 2>&1 || {
  say "installing cargo-deb"
  cargo install cargo-deb --locked -q
}
if [ "${FUZZ_SECONDS:-4}" != 0 ] && rustup toolchain list 2>/dev/null | grep -q nightly; then
  command -v cargo-fuzz >/dev/null 2>&1 || {
    say "installing cargo-fuzz"
    cargo install cargo-fuzz --locked -q
  }
fi

# sccache (Debian's) keeps each compiled dependency under ~/.cache/sccache,
# so a fresh clone compiles only the workspace's own crates, in each of the
# three builds (lints, tests, fuzz targets). Off with FATPIPE_NO_SCCACHE=1.
# Its server is stopped on exit.
if [ -z "${FATPIPE_NO_SCCACHE:-}" ] && command -v sccache >/dev/null 2>&1; then
  export RUSTC_WRAPPER=sccache CARGO_INCREMENTAL=0
  sccache --zero-stats >/dev/null 2>&1 || true
  stop_sccache() {
    sccache --show-stats 2>/dev/null | grep -E '^(Compile requests|Cache hits|Cache misses) ' | sed 's/^/  sccache: /'
    sccache --stop-server >/dev/null 2>&1
  }
  on_exit=(stop_sccache "${on_exit[@]}")
fi

# --- archive: a private PostgreSQL for the archive tests (begin) ----------------
# Started before the cargo steps, stopped (pg_ctl stop, by its PID file) and
# its directory removed on exit, whatever the outcome.
if [ -z "${FATPIPE_TEST_POSTGRES:-}" ]; then
  if [ "$(id -u)" = 0 ]; then
    pg_test_dir=$(mktemp -d /tmp/fatpipe-pg.XXXXXX)
    stop_pg() { scripts/pg-test-server.sh stop "$pg_test_dir"; }
    on_exit=(stop_pg "${on_exit[@]}")
    say "starting a private PostgreSQL on 127.0.0.1:${PG_TEST_PORT:-54329}"
    FATPIPE_TEST_POSTGRES=$(scripts/pg-test-server.sh start "$pg_test_dir" "${PG_TEST_PORT:-54329}")
    export FATPIPE_TEST_POSTGRES
  else
    echo "note: not root, no private PostgreSQL; the archive's PostgreSQL tests will skip"
  fi
fi
# --- archive (end) ---------------------------------------------------------------

# --- static checks -------------------------------------------------------------
stage "cargo fmt --check"
cargo fmt --all -- --check

# Two passes, since the hooks are code of their own (cfg'd in and out); the
# second re-checks only the crates the feature touches (transfer and up).
stage "cargo clippy -D warnings (without and with the test hooks)"
cargo clippy --workspace --all-targets --locked --features fatpipe-archive/bench-example -- -D warnings
cargo clippy --workspace --all-targets --locked "${FEATURES[@]}" -- -D warnings

# --- tests ----------------------------------------------------------------------
# One nextest run builds and runs every unit and integration test of the
# workspace. Tests whose name contains `lab_` (time and throughput through
# an emulated link), the server flood test and the memory tests each run
# alone: nextest's config gives them every test thread, so no heavy
# loopback test shares the 2 cores with them.
stage "build the tests (ci profile, with the test hooks)"
cargo nextest run --workspace --locked "${PROFILE[@]}" "${FEATURES[@]}" --profile ci --no-run

stage "run the unit, integration and lab tests (cargo nextest)"
junit=target/nextest/ci/junit.xml
slowest() {
  [ -f "$junit" ] || return 0
  printf '\n==> the ten slowest tests\n'
  # One line per <testcase ...>: its time, binary (classname) and name.
  grep -o '<testcase [^>]*>' "$junit" | while IFS= read -r tc; do
    t=${tc##* time=\"}; t=${t%%\"*}
    n=${tc##* name=\"}; n=${n%%\"*}
    c=${tc##* classname=\"}; c=${c%%\"*}
    printf '%s %s %s\n' "$t" "$c" "$n"
  done | sort -rn | head -n 10 | awk '{ printf "  %7.1fs  %s %s\n", $1, $2, $3 }'
}
on_exit=(slowest "${on_exit[@]}")
cargo nextest run --workspace --locked "${PROFILE[@]}" "${FEATURES[@]}" --profile ci

stage "doc tests"
cargo test --doc --workspace --locked --profile ci "${FEATURES[@]}"

stage "a build without the test hooks"
# Built without the feature, as `cargo build --release` builds it (the
# feature, not the profile, decides what is compiled in): the corruption
# hook's name is not even in the binary. The packages below are made of
# this binary, and the last test stage runs it.
cargo build --locked --profile ci -p fatpipe --bin fatpipe
if grep -aq FATPIPE_TEST_CORRUPT_CHUNK target/ci/fatpipe; then
  echo "error: target/ci/fatpipe knows FATPIPE_TEST_CORRUPT_CHUNK: the test-hooks feature leaked into a build without it" >&2
  exit 1
fi
mkdir -p target/ci/hook-free
cp target/ci/fatpipe target/ci/hook-free/fatpipe

# --- packages -------------------------------------------------------------------
# The .deb and .rpm of that hook-free build (scripts/package.sh), linted,
# and the .deb installed, served from and purged (scripts/package-check.sh;
# root only: it installs on this machine).
if [ "$(id -u)" = 0 ]; then
  stage "packages: build, lint, install, serve, purge"
  # The .rpm is signed as a release signs it, here with a throwaway key.
  gnupg=$(mktemp -d)
  GNUPGHOME=$gnupg gpg --batch --quiet --passphrase '' \
    --quick-gen-key "fatpipe CI throwaway <ci@fatpipe.invalid>" rsa2048 sign 1d
  GNUPGHOME=$gnupg FATPIPE_PROFILE=ci FATPIPE_RPM_SIGN=ci@fatpipe.invalid \
    scripts/package.sh --no-build
  GNUPGHOME=$gnupg gpgconf --kill all 2>/dev/null || true
  rm -rf "$gnupg"
  scripts/package-check.sh
elif [ -n "${CI:-}" ]; then
  echo "error: the package check needs root, and CI runs as root" >&2
  exit 1
else
  echo "note: package check skipped: it installs the .deb, so it needs root"
fi

# --- the hook-free build ignores the hooks --------------------------------------
stage "a build without the test hooks ignores them"
# A copy given every FATPIPE_TEST_* variable behaves as without them. The
# integration tests built above run the hook-free binary (FATPIPE_BIN)
# rather than being compiled a second time without the feature. (nextest's
# default profile: its own timeouts, and it leaves the main run's JUnit
# report, which the slowest-tests table reads, in place.)
FATPIPE_BIN=$(pwd)/target/ci/hook-free/fatpipe cargo nextest run --locked "${PROFILE[@]}" "${FEATURES[@]}" \
  -p fatpipe --test integration --run-ignored only -E 'test(test_hooks_are_ignored)'

# --- fuzzing --------------------------------------------------------------------
FUZZ_SECONDS=${FUZZ_SECONDS:-4}
if [ -d fuzz ] && [ "$FUZZ_SECONDS" != 0 ]; then
  if ! rustup toolchain list 2>/dev/null | grep -q nightly; then
    echo "note: fuzzing skipped: no nightly toolchain (cargo fuzz needs one)"
  else
    # -a: debug assertions and overflow checks on (cargo fuzz builds
    # release without them by default): wire arithmetic must not overflow.
    # -s none: no AddressSanitizer. Every decoder is safe Rust (only the sys
    # crate may hold `unsafe`, and no decoder calls it), so ASan would find
    # nothing Rust's own bounds and overflow checks do not; without it the
    # targets compile faster and run two to three times more inputs in the
    # same seconds. (A long run by hand may still add ASan: cargo fuzz's
    # default.) Every target is built in one invocation, then they run
    # FUZZ_JOBS at a time, each for FUZZ_SECONDS.
    stage "fuzz: build every target"
    cargo +nightly fuzz build -a -s none
    stage "fuzz: every target for ${FUZZ_SECONDS}s, $(nproc) at a time"
    fuzz_log=$(mktemp -d)
    cargo +nightly fuzz list >"$fuzz_log/targets"
    fuzz_one() {
      if cargo +nightly fuzz run "$1" -a -s none -- -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 \
        >"$fuzz_log/$1" 2>&1; then
        printf '  fuzz %-18s ok   %s\n' "$1" "$(grep -E '^(#[0-9]+|Done)' "$fuzz_log/$1" | tail -n 1)"
      else
        printf '  fuzz %-18s FAILED\n' "$1"
        tail -n 40 "$fuzz_log/$1"
        return 1
      fi
    }
    export -f fuzz_one
    export FUZZ_SECONDS fuzz_log
    xargs -P "${FUZZ_JOBS:-$(nproc)}" -I{} bash -c 'fuzz_one {}' <"$fuzz_log/targets"
    rm -rf "$fuzz_log"
  fi
fi

stage ""
say "all checks passed"
