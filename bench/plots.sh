#!/usr/bin/env bash
# bench/plots.sh: how long a big run takes to draw over time (issue 30).
#
# Runs crates/report/examples/render_timeseries.rs in release: a
# `fatpipe test` document of STREAMS (default 1,024) streams × INTERVALS
# (default 300) one-second intervals, parsed, turned into the time-series
# plot and drawn as SVG and as PNG, REPS times (default 5); prints each
# step's median, the total's, and this process's CPU time, against the
# target: the whole (parse + recipe + SVG + PNG) in <= 1 s.
#
# On a machine shared with other work the wall clock is partly the
# neighbours'; the CPU time is ours.
#
# Environment: STREAMS, INTERVALS, REPS.
set -euo pipefail
BENCH=plots
. "$(dirname "$0")/lib.sh"

STREAMS=${STREAMS:-1024}
INTERVALS=${INTERVALS:-300}
export REPS=${REPS:-5}
cd "$BENCH_ROOT"
out=$(cargo run --quiet --release -p fatpipe-report --example render_timeseries -- "$STREAMS" "$INTERVALS") ||
    die "the example failed"
echo "$out"
total=$(awk '$1 == "total" && $2 != "CPU" { print $2 }' <<<"$out")
is_num "$total" || die "no total in the example's output"
verdict=$(awk -v t="$total" 'BEGIN { print (t <= 1.0) ? "meets" : "misses" }')
echo "target: the whole in <= 1 s: $total s, $verdict it"
