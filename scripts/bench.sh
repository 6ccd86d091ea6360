#!/usr/bin/env bash
# Runs a benchmark workload several times in a release build and prints one
# RESULT line per run (with peak RSS, like the peers' scripts) and the median
# events per second.
#   scripts/bench.sh <w1|w1-100keys|w1-sum|w2|w3|w3-sum|sessions|sessions-100keys> <events> <partitions> [reps] [threads]
# (CARGO_TARGET_DIR is honoured.) scripts/bench-compare.sh runs the peers beside it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
workload=${1:?workload}; events=${2:?events}; partitions=${3:?partitions}; reps=${4:-3}; threads=${5:-$partitions}
cargo build --release --locked -q -p weibo-examples --example bench
bench="${CARGO_TARGET_DIR:-target}/release/examples/bench"
eps=()
for _ in $(seq "$reps"); do
    err=$(mktemp)
    line=$(/usr/bin/time -v "$bench" "$workload" "$events" "$partitions" "$threads" 2>"$err" | grep '^RESULT ')
    rss=$(awk -F': ' '/Maximum resident set size/{print $2}' "$err")
    rm -f "$err"
    echo "$line rss_kb=$rss"
    eps+=("$(sed -E 's/.* eps=([0-9]+).*/\1/' <<<"$line")")
done
printf '%s\n' "${eps[@]}" | sort -n | awk '{a[NR]=$1} END {printf "median eps=%d over %d runs\n", a[int((NR+1)/2)], NR}'
