#!/usr/bin/env bash
# Every check CI runs, in order: formatting, clippy with the lint wall, all
# tests (unit, integration, doc, compile-fail), then the quickstart and the
# book's examples, which assert what they print.
#
# Needs the Rust toolchain pinned in rust-toolchain.toml (with clippy and
# rustfmt), and Java 17 and Maven for the Kafka tests: the broker (Apache
# Kafka, KRaft) is fetched from Maven Central once into
# $HOME/.cache/weibo/ and started by the tests themselves on loopback.
# Debian's `prometheus` (a real scraper for the metrics endpoint),
# `chromium` (a real browser for the dashboard) and `postgresql` (the
# server binaries for the Postgres sink's tests, which run a throwaway
# cluster of their own; `openssl` makes a certificate for its TLS test) are
# installed with apt-get when missing, and PyPI's
# `moto[server]` (a local S3 server) with pip; the tests start them
# themselves.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "toolchain"
rustc --version
cargo --version

step "rustfmt"
cargo fmt --all -- --check

step "clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "Kafka broker for the tests"
scripts/fetch-kafka.sh

step "Prometheus, Chromium and PostgreSQL for the tests"
# Installs Debian package $1 when command (or file) $2 is missing.
need() {
    command -v "$2" > /dev/null && return 0
    compgen -G "$2" > /dev/null && return 0
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    install() { $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$1"; }
    install "$1" || { $sudo apt-get update && install "$1"; }
}
need prometheus prometheus
need chromium chromium
# The server binaries live in /usr/lib/postgresql/<version>/bin, off the PATH.
need postgresql '/usr/lib/postgresql/*/bin/initdb'
need openssl openssl
prometheus --version | head -n 1
chromium --version 2> /dev/null | head -n 1
"$(compgen -G '/usr/lib/postgresql/*/bin/postgres' | sort -V | tail -n 1)" --version
# A local S3 server for the S3 tests.
export PATH="$HOME/.local/bin:$PATH"
if ! command -v moto_server > /dev/null; then
    python3 -m pip install --quiet --user 'moto[server]' \
        || python3 -m pip install --quiet --user --break-system-packages 'moto[server]'
fi
command -v moto_server

step "the library without its optional features"
cargo check --locked -q -p weibo --no-default-features

step "fault injection is off without its feature"
# Built for weibo alone, without the feature the workspace's tests turn on.
cargo test --locked -q -p weibo --lib checkpoint::faults

step "tests"
cargo test --workspace --locked

step "the unsafe code, optimised"
# The two unsafe paths of `state/flat.rs` (the prefetch, the in-place
# update) driven with drop-counting keys and values and panicking updates,
# in a release build: what optimisation could break is checked as it ships.
cargo test --release --locked -q -p weibo --no-default-features --lib state::flat

step "quickstart"
cargo run --locked -q -p weibo-examples --example quickstart > /dev/null

step "book examples"
# An example passes when it ends well and no thread of it panicked (a
# panic on a background thread does not fail the process, but a user
# running the example would see it).
stderr_of=$(mktemp)
for example in examples/book_*.rs; do
    [ -e "$example" ] || continue
    name=$(basename "$example" .rs)
    echo "running $name"
    cargo run --locked -q -p weibo-examples --example "$name" > /dev/null 2> "$stderr_of" || { cat "$stderr_of"; exit 1; }
    if grep -q "panicked at" "$stderr_of"; then
        cat "$stderr_of"
        echo "$name: a thread panicked" >&2
        exit 1
    fi
done
rm -f "$stderr_of"

step "all checks passed"
