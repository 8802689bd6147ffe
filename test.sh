#!/usr/bin/env bash
# Installs what the tests need and runs them all: format, lints, unit,
# integration and lab tests, and a short run of every fuzz target.
#
# Lab tests need root (network namespaces, TUN devices). As root they run;
# otherwise they skip with a message that says why. CI (CI=true) runs as root.
#
# Environment:
#   FUZZ_SECONDS  seconds per fuzz target (default 20; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")"

say() { printf '\n==> %s\n' "$*"; }

# --- what the tests need -----------------------------------------------------
APT_PACKAGES=(iperf3 iperf nuttcp iproute2 iputils-ping procps kmod ethtool)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "note: not root, cannot install ${missing[*]}; tests that need them will skip"
  fi
fi

# --- static checks -------------------------------------------------------------
say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

# --- tests ----------------------------------------------------------------------

say "cargo test (unit and integration; lab tests apart)"
# Tests whose name contains `lab_` measure time and throughput through an
# emulated link. On 2 cores they must not share the CPU with the heavy
# loopback tests, so they run afterwards, one at a time.
cargo test --workspace --release --locked -- --skip lab_

say "cargo test: lab tests, one at a time"
cargo test --workspace --release --locked -- lab_ --test-threads=1

# --- fuzzing --------------------------------------------------------------------
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
if [ -d fuzz ] && [ "$FUZZ_SECONDS" != 0 ]; then
  if ! rustup toolchain list 2>/dev/null | grep -q nightly; then
    echo "note: fuzzing skipped: no nightly toolchain (cargo fuzz needs one)"
  else
    command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked -q
    for target in $(cargo +nightly fuzz list); do
      say "fuzz $target for ${FUZZ_SECONDS}s"
      cargo +nightly fuzz run "$target" -- -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 2>&1 | tail -n 3
    done
  fi
fi

say "all checks passed"
