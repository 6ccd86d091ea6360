//! The per-record cost of YAML pipelines' expressions (see the book's
//! "Pipelines in YAML"): CEL compiled to closures, evaluated row by row
//! and a column of a batch at a time, beside the same computation written
//! in Rust on a tuple.
//!
//! ```sh
//! cargo bench -p weibo-connectors --features yaml --bench yaml_expr
//! ```
//!
//! Each figure is per record (criterion's throughput) over 10,000 rows.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use weibo_connectors::yaml::doc::Pos;
use weibo_connectors::yaml::expr::{Origin, Schema, compile};
use weibo_connectors::yaml::{Row, Value};

const N: usize = 10_000;

fn rows() -> Vec<Row> {
    (0..N as i64)
        .map(|i| {
            Row::new([
                Value::str(if i % 3 == 0 { "view" } else { "click" }),
                Value::str(&format!("u{}", i % 97)),
                Value::Int(i % 1000),
                Value::Int(i),
            ])
        })
        .collect()
}

fn exprs(c: &mut Criterion) {
    let schema = Schema::of(["kind", "user", "value", "ts"]);
    let at = Origin { pos: Pos { line: 1, column: 1 }, quoted: false };
    let rows = rows();
    let tuples: Vec<(bool, u64)> = (0..N as u64).map(|i| (i % 3 != 0, i % 1000)).collect();
    let mut group = c.benchmark_group("yaml_expr");
    group.throughput(Throughput::Elements(N as u64));
    for text in [
        "event.value",
        "event.value * 3 + 1",
        "(event.value * 3 + 1) % 2 == 0",
        "event.kind == 'click' && event.value > 0",
        "event.user + '-' + string(event.value)",
    ] {
        let e = compile(text, &schema, at).unwrap();
        group.bench_function(text, |b| {
            b.iter(|| {
                for r in &rows {
                    black_box(e.eval(black_box(r)).ok());
                }
            })
        });
        // A column at a time, in batches of 1,024 rows (a pipeline's).
        group.bench_function(format!("column: {text}"), |b| {
            b.iter(|| {
                for batch in rows.chunks(1024) {
                    black_box(e.eval_column(black_box(batch)));
                }
            })
        });
    }
    group.bench_function("rust: (v * 3 + 1) % 2 == 0", |b| {
        b.iter(|| {
            for t in &tuples {
                black_box((black_box(t.1) * 3 + 1) % 2 == 0);
            }
        })
    });
    group.bench_function("rust: kind == click && v > 0", |b| {
        b.iter(|| {
            for t in &tuples {
                black_box(black_box(t.0) && t.1 > 0);
            }
        })
    });
    group.finish();
}

criterion_group!(benches, exprs);
criterion_main!(benches);
