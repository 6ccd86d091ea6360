#!/usr/bin/env bash
# The Postgres sink against a hand-written binary COPY of the same rows, on a
# throwaway PostgreSQL cluster (Debian's server binaries; default durability:
# fsync and synchronous_commit on), in a release build.
#
#   scripts/bench-postgres.sh [rows] [repetitions]
#
# Prints each run and, last, one `POSTGRES …` line per contender with its
# median rows/s and its ratio to the COPY.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rows=${1:-1000000}
reps=${2:-5}

bin=$(compgen -G '/usr/lib/postgresql/*/bin/initdb' | sort -V | tail -n 1 | xargs dirname) || {
    echo "no PostgreSQL server binaries: apt-get install -y postgresql" >&2
    exit 1
}
as_pg=()
[ "$(id -u)" = 0 ] && as_pg=(runuser -u postgres --)
dir=$(mktemp -d /tmp/weibo-pg-bench.XXXXXX)
[ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
stop() {
    "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop > /dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT
"${as_pg[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C > /dev/null
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_wal_size=4GB" > /dev/null

cargo build --release --locked -q -p weibo-examples --example postgres_bench
target=${CARGO_TARGET_DIR:-target}
"$target/release/examples/postgres_bench" "host=127.0.0.1 port=$port user=postgres dbname=postgres" "$rows" "$reps"
