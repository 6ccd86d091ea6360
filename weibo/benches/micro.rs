//! Micro-benchmarks of the pieces the whole-pipeline profile names (see the
//! book's Performance chapter): key encoding and key groups, value
//! encoding and decoding (what a byte edge or a byte state backend pays
//! per record), value-state updates, timers and window state, per backend.
//!
//! ```sh
//! cargo bench -p weibo --bench micro            # all
//! cargo bench -p weibo --bench micro -- state   # those whose name has `state`
//! ```
//!
//! Each figure is per element (criterion's throughput), over the keys of
//! the `w3` benchmark (`i * 2654435761 mod K`).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde::{Deserialize, Serialize};
use weibo::codec::Data;
use weibo::codec::key::{encode, key_group};
use weibo::state::{FjallBackend, MemoryBackend, StateBackend, StateScope, TimerState, ValueStore, WindowState};

const MULT: u64 = 2_654_435_761;
const GROUPS: u16 = 128;
/// Records per measured batch.
const N: u64 = 10_000;

/// The `w3` benchmark's aggregate.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct RunSum {
    key: u64,
    sum: u64,
    delta: u64,
    count: u64,
}

fn key_of(i: u64, keys: u64) -> u64 {
    i.wrapping_mul(MULT) % keys
}

/// `key` encoded into `bytes`, and its key group.
fn encoded(key: u64, bytes: &mut Vec<u8>) -> u16 {
    bytes.clear();
    weibo::Key::encode_key(&key, bytes);
    key_group(bytes, GROUPS)
}

fn scope() -> StateScope {
    StateScope::new("bench", "op", "value", 0..GROUPS, GROUPS)
}

fn keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("keys");
    g.throughput(Throughput::Elements(N));
    g.bench_function("encode u64 + key group", |b| {
        let mut out = Vec::with_capacity(16);
        b.iter(|| {
            let mut sum = 0u32;
            for i in 0..N {
                sum += u32::from(encoded(key_of(i, 5_000_000), &mut out));
            }
            black_box(sum)
        });
    });
    g.bench_function("encode String + key group", |b| {
        let names: Vec<String> = (0..N).map(|i| format!("user-{}", key_of(i, 100_000))).collect();
        b.iter(|| {
            let mut sum = 0u32;
            for name in &names {
                sum += u32::from(key_group(&encode(name), GROUPS));
            }
            black_box(sum)
        });
    });
    g.finish();
}

fn values(c: &mut Criterion) {
    let mut g = c.benchmark_group("values");
    g.throughput(Throughput::Elements(N));
    let records: Vec<RunSum> =
        (0..N).map(|i| RunSum { key: key_of(i, 5_000_000), sum: i % 1000, delta: i % 1000, count: 1 }).collect();
    g.bench_function("encode RunSum (postcard)", |b| {
        let mut out = Vec::with_capacity(64 * N as usize);
        b.iter(|| {
            out.clear();
            for r in &records {
                r.encode(&mut out).unwrap();
            }
            black_box(out.len())
        });
    });
    let mut encoded = Vec::new();
    let mut ends = Vec::new();
    for r in &records {
        r.encode(&mut encoded).unwrap();
        ends.push(encoded.len());
    }
    g.bench_function("decode RunSum (postcard)", |b| {
        b.iter(|| {
            let mut start = 0;
            let mut sum = 0u64;
            for &end in &ends {
                sum = sum.wrapping_add(RunSum::decode(&encoded[start..end]).unwrap().sum);
                start = end;
            }
            black_box(sum)
        });
    });
    g.finish();
}

/// Updates of `w3`'s aggregate over `keys` keys, after one pass over
/// every key (so the state holds them all).
fn value_state(c: &mut Criterion) {
    let mut g = c.benchmark_group("value state update");
    g.throughput(Throughput::Elements(N));
    g.sample_size(20);
    let dir = tempfile::tempdir().unwrap();
    let fjall = FjallBackend::open(dir.path().join("fjall")).unwrap();
    let backends: [(&str, &dyn StateBackend); 2] = [("memory", &MemoryBackend), ("fjall", &fjall)];
    for (name, backend) in backends {
        for keys in [100u64, 100_000, 5_000_000] {
            if name == "fjall" && keys == 5_000_000 {
                // Filling takes minutes; `bench w3` covers it.
                continue;
            }
            let mut state = ValueStore::<u64, RunSum>::open(backend, &scope()).unwrap();
            let mut bytes = Vec::new();
            let mut update = |state: &mut ValueStore<u64, RunSum>, i: u64| {
                let key = key_of(i, keys);
                let group = encoded(key, &mut bytes);
                let v = i % 1000;
                state
                    .update(group, key, &bytes, |slot| {
                        let new = match slot.take() {
                            Some(a) => RunSum { key, sum: a.sum + v, delta: v, count: a.count + 1 },
                            None => RunSum { key, sum: v, delta: v, count: 1 },
                        };
                        *slot = Some(new);
                        new.sum
                    })
                    .unwrap()
            };
            for i in 0..keys {
                update(&mut state, i);
            }
            let mut next = keys;
            g.bench_with_input(BenchmarkId::new(name, keys), &keys, |b, _| {
                b.iter(|| {
                    let mut sum = 0u64;
                    for _ in 0..N {
                        sum = sum.wrapping_add(update(&mut state, next));
                        next += 1;
                    }
                    black_box(sum)
                });
            });
            if name == "memory" {
                // As keyed operators do: each record's state asked for 4
                // records ahead (`ValueStore::prefetch`).
                let mut ahead_bytes = Vec::new();
                g.bench_with_input(BenchmarkId::new("memory, prefetched 4 ahead", keys), &keys, |b, _| {
                    b.iter(|| {
                        let mut sum = 0u64;
                        for _ in 0..N {
                            let key = key_of(next + 4, keys);
                            state.prefetch([(encoded(key, &mut ahead_bytes), &key)]);
                            sum = sum.wrapping_add(update(&mut state, next));
                            next += 1;
                        }
                        black_box(sum)
                    });
                });
            }
        }
    }
    g.finish();
}

/// Setting a timer per record and firing them in time order, as a session
/// window does per event.
fn timers(c: &mut Criterion) {
    let mut g = c.benchmark_group("timers set + fire");
    g.throughput(Throughput::Elements(N));
    g.sample_size(20);
    let dir = tempfile::tempdir().unwrap();
    let in_memory = FjallBackend::builder(dir.path().join("mem")).open().unwrap();
    let on_disk = FjallBackend::builder(dir.path().join("disk")).with_timers_on_disk(true).open().unwrap();
    let backends: [(&str, &dyn StateBackend); 3] =
        [("memory", &MemoryBackend), ("fjall, timers in memory", &in_memory), ("fjall, timers on disk", &on_disk)];
    for (name, backend) in backends {
        let mut timers = TimerState::<u64>::open(backend, &scope()).unwrap();
        let mut bytes = Vec::new();
        let mut time = 0i64;
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut fired = 0usize;
                for i in 0..N {
                    let key = key_of(i, 100_000);
                    timers.register(time + 60_000, encoded(key, &mut bytes), &key).unwrap();
                    time += 1;
                    while let Some((_, due)) = timers.pop_due(time).unwrap() {
                        fired += due.len();
                    }
                }
                black_box(fired)
            });
        });
    }
    g.finish();
}

/// `w1`'s window state: one accumulator per (key, window) added, and each
/// window fired and purged when the next one starts (1,000 records per
/// window over 100,000 keys, so each holds one record per key).
fn window_state(c: &mut Criterion) {
    let mut g = c.benchmark_group("window state add + fire");
    g.throughput(Throughput::Elements(N));
    g.sample_size(20);
    let dir = tempfile::tempdir().unwrap();
    let fjall = FjallBackend::open(dir.path().join("fjall")).unwrap();
    let backends: [(&str, &dyn StateBackend); 2] = [("memory", &MemoryBackend), ("fjall", &fjall)];
    for (name, backend) in backends {
        g.bench_function(name, |b| {
            b.iter_batched(
                || WindowState::<u64, u64>::open(backend, &scope()).unwrap(),
                |mut windows| {
                    let mut bytes = Vec::new();
                    let mut sum = 0u64;
                    for i in 0..N {
                        let key = key_of(i, 100_000);
                        let start = (i / 1000 * 1000) as i64;
                        let group = encoded(key, &mut bytes);
                        windows.update(start, group, key, &bytes, |acc| *acc.get_or_insert(0) += i % 1000).unwrap();
                        if i % 1000 == 999 {
                            windows.for_each_in_window(start, true, |_, _, acc| sum += acc).unwrap();
                        }
                    }
                    black_box(sum)
                },
                BatchSize::PerIteration,
            );
        });
    }
    g.finish();
}

criterion_group!(benches, keys, values, value_state, timers, window_state);
criterion_main!(benches);
