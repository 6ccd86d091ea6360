#!/usr/bin/env bash
# Runs Weibo side by side with the hand-written Rust loop and timely (the
# peers in shared/bench/peers; timely also with two workers, for w1 and w3:
# scripts/peers/timely-workers.rs), interleaved, and prints the comparison:
# medians per engine, workload and parallelism, ratios against timely, and
# the peers' own table, which checks every engine's outputs against values
# computed independently (summarize.py).
#
#   scripts/bench-compare.sh [events] [reps] [workloads]
#
# events: default 20000000; reps: default 5; workloads: default "w1 w2 w3".
# PEERS_DIR: the peers' folder (default ../shared/bench/peers beside this
# repository); PEERS_CACHE: where the peers are built (default
# ~/.cache/weibo-peers); CARGO_TARGET_DIR is honoured for Weibo's build.
# The peers' load gate waits for a quiet machine (LOAD_MAX, default 1.0 in
# their common.sh; set it higher on a machine that is never quiet).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
events=${1:-20000000}; reps=${2:-5}; workloads=${3:-"w1 w2 w3"}
peers=${PEERS_DIR:-$(cd .. && pwd)/shared/bench/peers}
export PEERS_CACHE=${PEERS_CACHE:-$HOME/.cache/weibo-peers}
[ -d "$peers" ] || { echo "no peers folder at $peers (set PEERS_DIR)" >&2; exit 2; }
# shellcheck source=/dev/null
source "$peers/common.sh"

target=${CARGO_TARGET_DIR:-target}
cargo build --release --locked -q -p weibo-examples --example bench
"$peers/rust-baseline/run-rust.sh" setup >/dev/null
"$peers/timely/run-timely.sh" setup >/dev/null
bench="$target/release/examples/bench"
# timely with two workers: the peer's crate with scripts/peers/timely-workers.rs
# as its main.rs (same dependencies, locked), built beside the peers.
workers_src="$PEERS_CACHE/timely-workers"
rm -rf "$workers_src" && mkdir -p "$workers_src/src"
cp "$peers/timely/Cargo.toml" "$peers/timely/Cargo.lock" "$workers_src/"
cp scripts/peers/timely-workers.rs "$workers_src/src/main.rs"
(cd "$workers_src" && CARGO_TARGET_DIR="$PEERS_CACHE/timely-workers-target" cargo build --release --locked --quiet)
timely_workers="$PEERS_CACHE/timely-workers-target/release/timely-peer"

results=$(mktemp "${TMPDIR:-/tmp}/weibo-bench-compare.XXXXXX")
trap 'rm -f "$results"' EXIT
for rep in $(seq "$reps"); do
    for w in $workloads; do
        echo "rep $rep/$reps: $w" >&2
        measure "$bench" "$w" "$events" 1 >>"$results"
        measure "$bench" "$w" "$events" 2 >>"$results"
        # The same workload with the state timely's peer keeps (the sum
        # alone), beside the 32-byte (w3) and 24-byte (w1) tuples.
        if [ "$w" = w1 ] || [ "$w" = w3 ]; then
            measure "$bench" "$w-sum" "$events" 1 >>"$results"
        fi
        measure "$PEERS_CACHE/target/release/rust-baseline" "$w" fx "$events" >>"$results"
        measure "$PEERS_CACHE/target/release/timely-peer" "$w" "$events" >>"$results"
        # timely with two workers, the input up to 100 windows ahead of the
        # output (see scripts/peers/timely-workers.rs).
        if [ "$w" = w1 ] || [ "$w" = w3 ]; then
            measure env WORKERS=2 LAG=100 "$timely_workers" "$w" "$events" >>"$results"
        fi
    done
done

echo
echo "Medians of $reps interleaved runs, $events events (events/s; ratio to timely, 1 worker):"
python3 - "$results" <<'EOF'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    if not line.startswith("RESULT "):
        continue
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    runs[(f["workload"], f["engine"], int(f["par"]))].append((float(f["eps"]), int(f.get("rss_kb", 0)), int(f.get("heap_peak_kb", 0))))
timely = {w: statistics.median(e for e, _, _ in r) for (w, eng, par), r in runs.items() if eng == "timely" and par == 1}
print("| workload | engine | par | median M/s | min–max M/s | max/min | ratio to timely | peak RSS MB (median) | peak heap MB (median) |")
print("|---|---|---|---|---|---|---|---|---|")
for (w, eng, par), r in sorted(runs.items()):
    eps = [e for e, _, _ in r]
    med = statistics.median(eps)
    ratio = f"{med / timely[w]:.2f}×" if w in timely else "–"
    heap = statistics.median(h for _, _, h in r) / 1024
    print(f"| {w} | {eng} | {par} | {med / 1e6:.2f} | {min(eps) / 1e6:.2f}–{max(eps) / 1e6:.2f} | {max(eps) / min(eps):.2f} | {ratio} "
          f"| {statistics.median(s for _, s, _ in r) / 1024:.0f} | {heap:.1f} |" if heap else
          f"| {w} | {eng} | {par} | {med / 1e6:.2f} | {min(eps) / 1e6:.2f}–{max(eps) / 1e6:.2f} | {max(eps) / min(eps):.2f} | {ratio} "
          f"| {statistics.median(s for _, s, _ in r) / 1024:.0f} | – |")
EOF
echo
echo "Outputs checked against independently computed values (the peers' summarize.py):"
python3 "$peers/summarize.py" "$results"
