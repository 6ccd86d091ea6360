#!/usr/bin/env bash
# Every check CI runs, in order: formatting, clippy with the lint wall, all
# tests (unit, integration, doc, compile-fail), then the quickstart and the
# book's examples, which assert what they print.
#
# Needs only the Rust toolchain pinned in rust-toolchain.toml (with clippy
# and rustfmt). Later issues add services (Kafka, PostgreSQL) that this
# script will fetch and start itself.
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

step "tests"
cargo test --workspace --locked

step "quickstart"
cargo run --locked -q -p weibo-examples --example quickstart > /dev/null

step "book examples"
for example in examples/book_*.rs; do
    [ -e "$example" ] || continue
    name=$(basename "$example" .rs)
    echo "running $name"
    cargo run --locked -q -p weibo-examples --example "$name" > /dev/null
done

step "all checks passed"
