//! Whole-pipeline benchmark: a workload of `shared/bench/README.md` through
//! the public DSL, printing one `RESULT` line in the peers' format.
//!
//! ```sh
//! cargo run --release -p weibo-examples --example bench -- <w1|w1-100keys|w1-sum|w2|w3|w3-100keys|w3-sum|sessions|sessions-100keys|dedup|list-append|map-state|join-interval|join-window|join-interval-loop|join-window-loop|async|async-loop> <events> <partitions> [threads]
//! ```
//!
//! Event `i`: `key = (i * 2654435761) mod K`, `value = i mod 1000`, `ts = i`.
//! The generator runs with `partitions` partitions (each an interleaved
//! slice of the sequence), keyed operators with `partitions` workers, on a
//! tokio runtime of `threads` worker threads (default: `partitions`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weibo::sinks::{Sink, SinkBatch, SinkWriter};
use weibo::sources::Generator;
use weibo::time::WatermarkStrategy;
use weibo::window::{Session, Tumbling, WindowResult};
use weibo::{Aggregate, Job, Result};

const MULT: u64 = 2_654_435_761;

/// The system allocator, counting the bytes allocated (live and peak) so
/// the benchmark can report heap, not only resident memory (which also
/// holds freed memory the allocator keeps). Counting is two relaxed atomic
/// operations per allocation.
struct Counting;

static LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static PEAK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`; the counters do
// not affect the memory handed out.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use std::sync::atomic::Ordering::Relaxed;
        let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
        PEAK.fetch_max(live, Relaxed);
        // SAFETY: the caller's contract for `alloc` holds.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract for `dealloc` holds.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        use std::sync::atomic::Ordering::Relaxed;
        if new_size >= layout.size() {
            let live = LIVE.fetch_add(new_size - layout.size(), Relaxed) + new_size - layout.size();
            PEAK.fetch_max(live, Relaxed);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Relaxed);
        }
        // SAFETY: the caller's contract for `realloc` holds.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap in use now and at its peak, in kB.
fn heap_kb() -> (usize, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    (LIVE.load(Relaxed) / 1024, PEAK.load(Relaxed) / 1024)
}

/// W3's running aggregate: (key, running sum, last delta, count), as the
/// Flink peer computes it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct RunSum {
    key: u64,
    sum: u64,
    delta: u64,
    count: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Out {
    count: u64,
    sum: u64,
    chk: u64,
}

impl Out {
    fn merge(&mut self, o: Out) {
        self.count = self.count.wrapping_add(o.count);
        self.sum = self.sum.wrapping_add(o.sum);
        self.chk = self.chk.wrapping_add(o.chk);
    }
}

/// A sink that folds records into a checksum per instance and merges the
/// instances' checksums when they finish.
struct Checksum<F> {
    total: Arc<Mutex<Out>>,
    f: F,
}

impl<T, F> Sink<T> for Checksum<F>
where
    T: Send + 'static,
    F: Fn(&mut Out, &T) + Clone + Send + Sync + 'static,
{
    fn default_name(&self) -> String {
        "checksum".into()
    }
    fn open(&self, _instance: usize, _parallelism: usize) -> Result<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(ChecksumWriter { total: self.total.clone(), f: self.f.clone(), out: Out::default() }))
    }
}

struct ChecksumWriter<F> {
    total: Arc<Mutex<Out>>,
    f: F,
    out: Out,
}

impl<T, F> SinkWriter<T> for ChecksumWriter<F>
where
    F: Fn(&mut Out, &T) + Send,
{
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> Result<()> {
        for v in batch.values() {
            (self.f)(&mut self.out, v);
        }
        batch.drain().for_each(drop);
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        self.total.lock().unwrap_or_else(PoisonError::into_inner).merge(self.out);
        Ok(())
    }
}

/// Dedup: ids `(i * MULT) mod 5,000,000` in 1,024 keyed partitions
/// (`id mod 1024`), each remembering its ids in map state with a one-hour
/// time-to-live (processing time: nothing expires during the run, every
/// value carries its expiry); the first sighting of an id goes on.
fn dedup(job: &Job, n: u64, partitions: usize, total: Arc<Mutex<Out>>) {
    use weibo::process::StateTtl;
    job.source(Generator::new(n, |i| i.wrapping_mul(MULT) % 5_000_000).with_partitions(partitions))
        .key_by(|id: &u64| id % 1_024)
        .with_partitions(partitions)
        .process_with_state(
            weibo::on_error::Fail,
            |states| states.ttl(StateTtl::after_write(Duration::from_secs(3_600))).map::<u64, ()>("seen"),
            |ctx, seen, id| {
                if !ctx.map(seen).contains(id) {
                    ctx.map(seen).put(*id, ());
                    ctx.emit(*id);
                }
            },
        )
        .sink(Checksum {
            total,
            f: |o: &mut Out, id: &u64| {
                o.count += 1;
                o.sum = o.sum.wrapping_add(*id);
                o.chk = o.chk.wrapping_add(id.wrapping_mul(*id));
            },
        });
}

/// Interval join: `n / 2` orders and `n / 2` payments over 1,000,000
/// keys; order `i` is at event time `i` ms, its payment (same key) 0 to
/// 3 s later; each order is joined with its key's payments within ±5 s,
/// so every order pairs with exactly its own payment. Orders' watermarks
/// are monotonous, payments' 3 s out of order (none is late).
fn join_interval(job: &Job, n: u64, partitions: usize, total: Arc<Mutex<Out>>) {
    let (orders, payments) = join_input(job, n, partitions);
    orders
        .key_by(|o: &(u64, u64)| o.0)
        .interval_join(&payments.key_by(|p: &(u64, u64)| p.0))
        .between(-5_000, 5_000)
        .with_partitions(partitions)
        .join(|o: &(u64, u64), p: &(u64, u64)| (o.1, p.1))
        .sink(Checksum { total, f: pair_checksum });
}

/// Window join: the input of `join-interval`; each order is joined with
/// its key's payments in the same 10 s tumbling window (so with its own
/// payment when both fall in one window).
fn join_window(job: &Job, n: u64, partitions: usize, total: Arc<Mutex<Out>>) {
    let (orders, payments) = join_input(job, n, partitions);
    orders
        .key_by(|o: &(u64, u64)| o.0)
        .join(&payments.key_by(|p: &(u64, u64)| p.0))
        .with_partitions(partitions)
        .window(Tumbling::of(Duration::from_secs(10)))
        .apply(|o: &(u64, u64), p: &(u64, u64)| (o.1, p.1))
        .into_stream()
        .sink(Checksum { total, f: pair_checksum });
}

/// A side of the join workloads: key and time.
type Side = weibo::Stream<(u64, u64)>;

/// The two inputs of the join workloads: `n / 2` orders and `n / 2`
/// payments over 1,000,000 keys (see [`join_interval`]).
fn join_input(job: &Job, n: u64, partitions: usize) -> (Side, Side) {
    let half = n / 2;
    let orders = job
        .source(Generator::new(half, join_order).with_partitions(partitions))
        .with_timestamps(|o: &(u64, u64)| o.1 as i64, WatermarkStrategy::monotonous());
    let payments = job.source(Generator::new(half, join_payment).with_partitions(partitions)).with_timestamps(
        |p: &(u64, u64)| p.1 as i64,
        WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(3)),
    );
    (orders, payments)
}

/// Order `i` of the join workloads: its key and time.
fn join_order(i: u64) -> (u64, u64) {
    (i.wrapping_mul(MULT) % 1_000_000, i)
}

/// Payment `i` of the join workloads: its order's key, 0 to 3 s later.
fn join_payment(i: u64) -> (u64, u64) {
    (i.wrapping_mul(MULT) % 1_000_000, i + i % 3_000)
}

fn pair_checksum(o: &mut Out, pair: &(u64, u64)) {
    o.count += 1;
    o.sum = o.sum.wrapping_add(pair.0);
    o.chk = o.chk.wrapping_add(pair.1.wrapping_sub(pair.0));
}

/// A multiplicative hasher for `u64` keys (the floor's maps).
#[derive(Default, Clone, Copy)]
struct MulHash(u64);

impl std::hash::Hasher for MulHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type Fast<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<MulHash>>;

/// The floor of the join workloads: one thread, no framework, over the
/// same input in the order one instance would see it (an order, then a
/// payment), with the same watermarks (orders' monotonous, payments' 3 s
/// behind) and the same output. `window` picks the window join; otherwise
/// the interval join (±5 s), whose records are removed when the
/// watermark reaches their time plus 5 s.
fn join_floor(n: u64, window: bool) -> Out {
    let mut out = Out::default();
    let half = n / 2;
    let mut payment_max = 0u64;
    let watermark = |order: u64, payment_max: u64| order.saturating_sub(1).min(payment_max.saturating_sub(3_001));
    if window {
        // Open windows by start: each key's orders and payments.
        type Sides = (Vec<u64>, Vec<u64>);
        let mut open: std::collections::BTreeMap<u64, Fast<Sides>> = std::collections::BTreeMap::new();
        let fire = |open: &mut std::collections::BTreeMap<u64, Fast<Sides>>, wm: u64, out: &mut Out| {
            while let Some(entry) = open.first_entry() {
                if *entry.key() + 9_999 > wm {
                    break;
                }
                for (_, (orders, payments)) in entry.remove() {
                    for o in &orders {
                        for p in &payments {
                            pair_checksum(out, &(*o, *p));
                        }
                    }
                }
            }
        };
        for i in 0..half {
            let (key, at) = join_order(i);
            open.entry(at - at % 10_000).or_default().entry(key).or_default().0.push(at);
            let (key, at) = join_payment(i);
            payment_max = payment_max.max(at);
            open.entry(at - at % 10_000).or_default().entry(key).or_default().1.push(at);
            fire(&mut open, watermark(i, payment_max), &mut out);
        }
        fire(&mut open, u64::MAX, &mut out);
    } else {
        // Each side: its records per key, and a queue in time order for
        // removal.
        let mut orders: Fast<Vec<u64>> = Fast::default();
        let mut payments: Fast<Vec<u64>> = Fast::default();
        let mut order_queue = std::collections::VecDeque::new();
        let mut payment_queue = std::collections::BinaryHeap::new();
        for i in 0..half {
            let (key, at) = join_order(i);
            for p in payments.get(&key).into_iter().flatten() {
                if p + 5_000 >= at && *p <= at + 5_000 {
                    pair_checksum(&mut out, &(at, *p));
                }
            }
            orders.entry(key).or_default().push(at);
            order_queue.push_back((at, key));
            let (key, at) = join_payment(i);
            payment_max = payment_max.max(at);
            for o in orders.get(&key).into_iter().flatten() {
                if o + 5_000 >= at && *o <= at + 5_000 {
                    pair_checksum(&mut out, &(*o, at));
                }
            }
            payments.entry(key).or_default().push(at);
            payment_queue.push(std::cmp::Reverse((at, key)));
            let wm = watermark(i, payment_max);
            while order_queue.front().is_some_and(|(t, _)| t + 5_000 <= wm) {
                if let Some((t, key)) = order_queue.pop_front() {
                    remove_time(&mut orders, key, t);
                }
            }
            while payment_queue.peek().is_some_and(|std::cmp::Reverse((t, _))| t + 5_000 <= wm) {
                if let Some(std::cmp::Reverse((t, key))) = payment_queue.pop() {
                    remove_time(&mut payments, key, t);
                }
            }
        }
    }
    out
}

fn remove_time(side: &mut Fast<Vec<u64>>, key: u64, at: u64) {
    if let Some(times) = side.get_mut(&key) {
        if let Some(i) = times.iter().position(|t| *t == at) {
            times.swap_remove(i);
        }
        if times.is_empty() {
            side.remove(&key);
        }
    }
}

/// Asynchronous enrichment: `n` records over 1,000,000 keys, each looked
/// up by an HTTP GET to a local server that answers after
/// `WEIBO_LATENCY_MS` (default 5) ms, `WEIBO_IN_FLIGHT` (default 100)
/// calls in flight per instance, results in input order. The floor is
/// `in-flight × instances / latency` records per second.
fn async_lookup(job: &Job, n: u64, partitions: usize, server: std::net::SocketAddr, total: Arc<Mutex<Out>>) {
    let in_flight = std::env::var("WEIBO_IN_FLIGHT").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let client = reqwest::Client::builder().pool_max_idle_per_host(4 * in_flight).build().unwrap_or_default();
    job.source(Generator::new(n, |i| i).with_partitions(partitions))
        .key_by(|i: &u64| i.wrapping_mul(MULT) % 1_000_000)
        .with_partitions(partitions)
        .map_async(weibo::on_error::Fail, weibo::AsyncOptions::new().in_flight(in_flight), move |_: &u64, i: &u64| {
            let request = client.get(format!("http://{server}/{i}"));
            async move {
                let body = request.send().await.map_err(|e| e.to_string())?.text().await.map_err(|e| e.to_string())?;
                body.trim().parse::<u64>().map_err(|e| format!("`{body}`: {e}"))
            }
        })
        .sink(Checksum {
            total,
            f: |o: &mut Out, v: &u64| {
                o.count += 1;
                o.sum = o.sum.wrapping_add(*v);
                o.chk = o.chk.wrapping_add(v.wrapping_mul(*v));
            },
        });
}

/// A local HTTP/1.1 server (keep-alive) that answers `GET /<n>` with
/// `n + 1` after `latency`.
async fn slow_server(latency: Duration) -> std::io::Result<std::net::SocketAddr> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let mut number = None;
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(path) = line.strip_prefix("GET /") {
                        number = path.split(' ').next().and_then(|n| n.parse::<u64>().ok());
                    } else if line.is_empty() {
                        tokio::time::sleep(latency).await;
                        let body = number.take().map_or(0, |n| n + 1).to_string();
                        let response = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                        if write.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// List-append: 100,000 keys, each event appends its value to its key's
/// list (reading nothing); one event in 1,000 (picked by a hash of its
/// number, so any key's) reads its key's list, emits its length and sum,
/// and clears it.
fn list_append(job: &Job, n: u64, partitions: usize, total: Arc<Mutex<Out>>) {
    job.source(Generator::new(n, |i| (i.wrapping_mul(MULT) % 100_000, i % 1000, i)).with_partitions(partitions))
        .key_by(|e: &(u64, u64, u64)| e.0)
        .with_partitions(partitions)
        .process_with_state(
            weibo::on_error::Fail,
            |states| states.list::<u64>("values"),
            |ctx, values, &(key, value, i)| {
                ctx.list(values).add(value);
                if (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % 1_000 == 0 {
                    let (mut len, mut sum) = (0u64, 0u64);
                    ctx.list(values).for_each(|v| {
                        len += 1;
                        sum += v;
                        true
                    });
                    ctx.list(values).clear();
                    ctx.emit((key, len, sum));
                }
            },
        )
        .sink(Checksum {
            total,
            f: |o: &mut Out, &(key, len, sum): &(u64, u64, u64)| {
                o.count += len;
                o.sum = o.sum.wrapping_add(sum);
                o.chk = o.chk.wrapping_add(key.wrapping_mul(sum));
            },
        });
}

/// Map-state: 1,000 keys with 1,000 entries each; each event adds its value
/// to one entry (a point update: one read, one write) and emits the entry's
/// new total.
fn map_state(job: &Job, n: u64, partitions: usize, total: Arc<Mutex<Out>>) {
    job.source(
        Generator::new(n, |i| {
            let mixed = i.wrapping_mul(MULT);
            (mixed % 1_000, (mixed / 1_000) % 1_000, i % 1000)
        })
        .with_partitions(partitions),
    )
    .key_by(|e: &(u64, u64, u64)| e.0)
    .with_partitions(partitions)
    .process_with_state(
        weibo::on_error::Fail,
        |states| states.map::<u64, u64>("entries"),
        |ctx, entries, &(key, entry, value)| {
            let mut now = 0;
            ctx.map(entries).update(entry, |v| {
                now = v.unwrap_or(0) + value;
                *v = Some(now);
            });
            ctx.emit((key, entry, value, now));
        },
    )
    .sink(Checksum {
        total,
        f: |o: &mut Out, &(key, entry, value, _now): &(u64, u64, u64, u64)| {
            o.count += 1;
            o.sum = o.sum.wrapping_add(value);
            o.chk = o.chk.wrapping_add((key * 1_000 + entry).wrapping_mul(value));
        },
    });
}

fn w2(job: &Job, n: u64, partitions: usize, total: Arc<Mutex<Out>>) {
    job.source(Generator::new(n, |i| (i.wrapping_mul(MULT) % 100_000, i % 1000, i)).with_partitions(partitions))
        .map(|(_key, value, _ts): (u64, u64, u64)| value * 3 + 1)
        .filter(|v: &u64| v.is_multiple_of(2))
        .sink(Checksum {
            total,
            f: |o: &mut Out, v: &u64| {
                o.count += 1;
                o.sum = o.sum.wrapping_add(*v);
                o.chk = o.sum;
            },
        });
}

/// W3: a running sum per key over `keys` keys (5,000,000 for w3 proper;
/// the `w3-100keys` variant uses 100, so its state stays in cache and the
/// run measures everything but the state's cache misses).
fn w3(job: &Job, n: u64, partitions: usize, keys: u64, total: Arc<Mutex<Out>>) {
    job.source(Generator::new(n, move |i| (i.wrapping_mul(MULT) % keys, i % 1000, i)).with_partitions(partitions))
        .map(|(key, value, _ts): (u64, u64, u64)| RunSum { key, sum: value, delta: value, count: 1 })
        .key_by(|r: &RunSum| r.key)
        .with_partitions(partitions)
        .reduce(|acc, e| RunSum { key: acc.key, sum: acc.sum + e.sum, delta: e.sum, count: acc.count + 1 })
        .sink(Checksum {
            total,
            f: |o: &mut Out, r: &RunSum| {
                if r.count == 1 {
                    o.count += 1;
                }
                o.sum = o.sum.wrapping_add(r.delta);
                o.chk = o.chk.wrapping_add(r.key.wrapping_mul(r.delta));
            },
        });
}

/// W3 with the state timely's peer keeps: the running sum alone (8 bytes
/// per key, where `w3`'s reduce keeps Flink's 32-byte tuple), in a keyed
/// `process` function that emits (key, sum, delta, first) per event.
fn w3_sum(job: &Job, n: u64, partitions: usize, total: Arc<Mutex<Out>>) {
    type Update = (u64, u64, u64, bool);
    job.source(Generator::new(n, |i| (i.wrapping_mul(MULT) % 5_000_000, i % 1000)).with_partitions(partitions))
        .key_by(|e: &(u64, u64)| e.0)
        .with_partitions(partitions)
        .process(weibo::on_error::Fail, |ctx: &mut weibo::KeyedContext<'_, u64, u64, Update>, e: &(u64, u64)| {
            let slot = ctx.state();
            let first = slot.is_none();
            let sum = slot.get_or_insert(0);
            *sum += e.1;
            let sum = *sum;
            ctx.emit((e.0, sum, e.1, first));
            Ok::<_, std::convert::Infallible>(())
        })
        .sink(Checksum {
            total,
            f: |o: &mut Out, &(key, _sum, delta, first): &Update| {
                o.count += u64::from(first);
                o.sum = o.sum.wrapping_add(delta);
                o.chk = o.chk.wrapping_add(key.wrapping_mul(delta));
            },
        });
}

/// W1: tumbling 1 s event-time windows, sum(value) per (key, window), watermark
/// = max timestamp seen (monotonous). `keys` is 100,000 for w1 proper; the
/// `w1-100keys` variant uses 100, so each key-window folds many events.
fn w1(job: &Job, n: u64, partitions: usize, keys: u64, total: Arc<Mutex<Out>>) {
    job.source(Generator::new(n, move |i| (i.wrapping_mul(MULT) % keys, i % 1000, i)).with_partitions(partitions))
        .with_timestamps(|e: &(u64, u64, u64)| e.2 as i64, WatermarkStrategy::monotonous())
        .key_by(|e: &(u64, u64, u64)| e.0)
        .with_partitions(partitions)
        .window(Tumbling::of(Duration::from_secs(1)))
        .reduce(|a, b| (a.0, a.1 + b.1, a.2))
        .sink(Checksum {
            total,
            f: |o: &mut Out, r: &WindowResult<u64, (u64, u64, u64)>| {
                let window = r.window.start as u64 / 1000;
                let sum = r.value.1;
                o.count += 1;
                o.sum = o.sum.wrapping_add(sum);
                o.chk = o
                    .chk
                    .wrapping_add(r.key.wrapping_mul(1_000_003).wrapping_add(window).wrapping_mul(sum.wrapping_add(1)));
            },
        });
}

/// W1 with the state timely's peer keeps: the sum alone per (key, window)
/// (8 bytes, where `w1`'s reduce keeps Flink's 24-byte tuple), through an
/// [`Aggregate`]; the records cross the hash edge as (key, value) pairs.
fn w1_sum(job: &Job, n: u64, partitions: usize, total: Arc<Mutex<Out>>) {
    job.source(Generator::new(n, |i| (i.wrapping_mul(MULT) % 100_000, i % 1000, i)).with_partitions(partitions))
        .with_timestamps(|e: &(u64, u64, u64)| e.2 as i64, WatermarkStrategy::monotonous())
        .map(|(key, value, _ts): (u64, u64, u64)| (key, value))
        .key_by(|e: &(u64, u64)| e.0)
        .with_partitions(partitions)
        .window(Tumbling::of(Duration::from_secs(1)))
        .aggregate(SumOfValues)
        .sink(Checksum {
            total,
            f: |o: &mut Out, r: &WindowResult<u64, u64>| {
                let window = r.window.start as u64 / 1000;
                let sum = r.value;
                o.count += 1;
                o.sum = o.sum.wrapping_add(sum);
                o.chk = o
                    .chk
                    .wrapping_add(r.key.wrapping_mul(1_000_003).wrapping_add(window).wrapping_mul(sum.wrapping_add(1)));
            },
        });
}

/// The sum of the values of (key, value) pairs.
struct SumOfValues;

impl Aggregate<(u64, u64)> for SumOfValues {
    type Acc = u64;
    type Out = u64;
    fn create(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, value: (u64, u64)) {
        *acc += value.1;
    }
    fn merge(&self, acc: &mut u64, other: u64) {
        *acc += other;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
}

/// Sessions (not a peer workload): w1's events, in session windows with a
/// 60 s gap, the sum of values per session. Each of the 100,000 keys gets
/// an event every 100 s of event time, so every event closes its key's
/// session and opens the next: per event, a session timer fires and one
/// is set (timers live in the backend: in fjall's table on fjall). The
/// `sessions-100keys` variant has 100 keys, each with an event every
/// 100 ms: every event extends its key's open session, so per event a
/// timer is deleted and one set, and most key groups hold one key.
fn sessions(job: &Job, n: u64, partitions: usize, keys: u64, total: Arc<Mutex<Out>>) {
    job.source(Generator::new(n, move |i| (i.wrapping_mul(MULT) % keys, i % 1000, i)).with_partitions(partitions))
        .with_timestamps(|e: &(u64, u64, u64)| e.2 as i64, WatermarkStrategy::monotonous())
        .key_by(|e: &(u64, u64, u64)| e.0)
        .with_partitions(partitions)
        .window(Session::with_gap(Duration::from_secs(60)))
        .reduce(|a, b| (a.0, a.1 + b.1, a.2))
        .sink(Checksum {
            total,
            f: |o: &mut Out, r: &WindowResult<u64, (u64, u64, u64)>| {
                let sum = r.value.1;
                o.count += 1;
                o.sum = o.sum.wrapping_add(sum);
                o.chk = o.chk.wrapping_add(r.key.wrapping_mul(1_000_003).wrapping_add(r.window.start as u64));
            },
        });
}

/// The fjall backend in `dir`, with the memory budgets the environment
/// sets (in MiB; unset: the defaults): `WEIBO_FJALL_OBJECT_CACHE_MB`,
/// `WEIBO_FJALL_BLOCK_CACHE_MB`, `WEIBO_FJALL_MEMTABLE_MB`; timers in fjall
/// with `WEIBO_FJALL_TIMERS=disk`; fjall's background threads from
/// `WEIBO_FJALL_THREADS`.
fn fjall(dir: impl AsRef<std::path::Path>) -> weibo::Result<weibo::state::FjallBackend> {
    let mb = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok()).map(|v| v << 20);
    let mut options = weibo::state::FjallBackend::builder(dir);
    if let Some(bytes) = mb("WEIBO_FJALL_OBJECT_CACHE_MB") {
        options = options.with_object_cache(usize::try_from(bytes).unwrap_or(usize::MAX));
    }
    if let Some(bytes) = mb("WEIBO_FJALL_BLOCK_CACHE_MB") {
        options = options.with_block_cache(bytes);
    }
    if let Some(bytes) = mb("WEIBO_FJALL_MEMTABLE_MB") {
        options = options.with_memtable(bytes);
    }
    if std::env::var("WEIBO_FJALL_TIMERS").is_ok_and(|v| v == "disk") {
        options = options.with_timers_on_disk(true);
    }
    if let Some(threads) = std::env::var("WEIBO_FJALL_THREADS").ok().and_then(|v| v.parse().ok()) {
        options = options.with_background_threads(threads);
    }
    options.open()
}

/// Peak resident memory of this process so far, in kB (Linux).
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Incremental checkpoints `bench ckpt` takes after the full one (it
/// prints their median, and each).
const INCREMENTALS: usize = 5;

/// Checkpoint costs with `keys` keys of w3 state: the barrier pause, a full
/// checkpoint (taken as a savepoint), incremental ones with 1% of the keys
/// changed, and restoring from the full one.
fn ckpt(runtime: &tokio::runtime::Runtime, keys: u64, on_disk: bool) {
    let root = std::env::temp_dir().join(format!("weibo-ckpt-{}", std::process::id()));
    // `WEIBO_CKPT_S3=<endpoint>|<bucket>`: checkpoints in that S3 bucket
    // (a local server: plain HTTP, path-style, test credentials).
    let s3 = std::env::var("WEIBO_CKPT_S3").ok().map(|spec| {
        let (endpoint, bucket) = spec.split_once('|').unwrap_or((spec.as_str(), "bench"));
        weibo_connectors::s3::S3Storage::builder(bucket, format!("ckpt-{}", std::process::id()))
            .with_endpoint(endpoint)
            .with_credentials("test", "testsecret")
            .allow_http()
            .path_style()
            .build()
            .unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(1)
            })
    });
    let build = |restore: Option<&std::path::Path>| -> Job {
        let mut job = match &s3 {
            Some(storage) => Job::new("bench-ckpt").with_checkpoint_storage(storage.clone(), Duration::from_secs(3600)),
            None => Job::new("bench-ckpt").with_checkpoints(root.join("checkpoints"), Duration::from_secs(3600)),
        };
        if on_disk {
            match fjall(root.join(format!("state-{}", restore.is_some()))) {
                Ok(b) => job = job.with_state_backend(b),
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(1)
                }
            }
        }
        match (restore, &s3) {
            (Some(_), Some(storage)) => {
                job = job.restore_from_storage(std::sync::Arc::new(storage.clone()), "savepoints/bench")
            }
            (Some(r), None) => job = job.restore_from(r),
            (None, _) => {}
        }
        // Every key once, then only the first 1% of the keys over and over:
        // after the first checkpoint at most 1% of the keys change.
        let touched = (keys / 100).max(1);
        let key = move |i: u64| if i < keys { i } else { i % touched };
        job.source(Generator::new(u64::MAX, move |i| (key(i), i % 1000)).with_rate(if restore.is_some() {
            1.0
        } else {
            1e12
        }))
        .map(|(key, value): (u64, u64)| RunSum { key, sum: value, delta: value, count: 1 })
        .key_by(|r: &RunSum| r.key)
        .reduce(|acc, e| RunSum { key: acc.key, sum: acc.sum + e.sum, delta: e.sum, count: acc.count + 1 })
        .name("sums")
        .sink(weibo::sinks::Blackhole::new());
        job
    };
    let result = runtime.block_on(async {
        let handle = build(None).spawn()?;
        while handle.metrics().operator("sums").map_or(0, |m| m.records_in) < keys {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The heap holding the state, once fjall has flushed and compacted
        // what the fill wrote (the job goes on with its 1% of keys).
        tokio::time::sleep(Duration::from_secs(3)).await;
        let steady = heap_kb().0;
        let started = Instant::now();
        let savepoint = handle.savepoint("bench").await?;
        let checkpoint = started.elapsed();
        // The next checkpoints hold only what changed: at most 1% of the
        // keys. Five of them, each after the job has had time to change its
        // 1% again (the machine is noisy; the median is reported).
        let mut incremental = Vec::new();
        for _ in 0..INCREMENTALS {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let started = Instant::now();
            let _ = handle.checkpoint().await?;
            incremental.push(started.elapsed());
        }
        let pause = handle.metrics().operator("sums").map_or(Duration::ZERO, |m| m.max_checkpoint_pause);
        let rss = rss_kb();
        handle.abort();
        let size: u64 = std::fs::read_dir(&savepoint)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum();
        let started = Instant::now();
        let restored = build(Some(&savepoint)).spawn()?;
        let restore = started.elapsed();
        restored.abort();
        Ok::<_, weibo::Error>((pause, checkpoint, incremental, restore, rss, size, steady))
    });
    let _ = std::fs::remove_dir_all(&root);
    match result {
        Ok((pause, checkpoint, mut incremental, restore, rss, size, steady)) => {
            let runs: Vec<String> = incremental.iter().map(|d| format!("{:.1}", d.as_secs_f64() * 1e3)).collect();
            incremental.sort_unstable();
            let median = incremental.get(incremental.len() / 2).copied().unwrap_or_default();
            println!(
                "CHECKPOINT engine=weibo{}{} keys={keys} pause_ms={:.1} checkpoint_ms={:.1} incremental_1pct_ms={:.1} incremental_runs_ms={} restore_ms={:.1} files_mb={:.1} rss_kb={rss} heap_steady_kb={steady} heap_peak_kb={}",
                if on_disk { "-fjall" } else { "" },
                if s3.is_some() { " storage=s3" } else { "" },
                pause.as_secs_f64() * 1e3,
                checkpoint.as_secs_f64() * 1e3,
                median.as_secs_f64() * 1e3,
                runs.join("/"),
                restore.as_secs_f64() * 1e3,
                size as f64 / 1e6,
                heap_kb().1
            )
        }
        Err(e) => {
            eprintln!("checkpoint benchmark failed: {e}");
            std::process::exit(1)
        }
    }
}

/// W1, W2 and W3 declared in YAML (`yaml-w1`, `yaml-w2`, `yaml-w3`, and `yaml-w3-100keys`, W3 over 100 keys): the
/// same events from a generator whose fields are CEL expressions over the
/// index `i`, the same operators, and the results handed to the same
/// checksum sinks (through `Pipeline::job_with_sinks`).
fn yaml_job(workload: &str, n: u64, partitions: usize, total: Arc<Mutex<Out>>) -> Job {
    use weibo_connectors::yaml::{Pipeline, Row, SinkUse, Value};
    let source = |keys: u64, time: &str| {
        format!(
            "job: bench-yaml-{workload}\n\
             sources:\n  events:\n    generator: {{ count: {n}, partitions: {partitions}, \
             fields: {{ key: \"(i * {MULT}) % {keys}\", value: \"i % 1000\", ts: \"i\" }} }}\n{time}\
             sinks:\n  out: {{ blackhole: {{}} }}\n"
        )
    };
    let text = match workload {
        "w1" => {
            source(100_000, "    event_time: { field: ts }\n")
                + &format!(
                    "pipeline:\n  - from: events\n  - key_by: \"event.key\"\n    partitions: {partitions}\n  \
                 - window: {{ tumbling: 1s }}\n    aggregate: {{ sum: \"sum(event.value)\" }}\n  - to: out\n"
                )
        }
        "w2" => {
            source(100_000, "")
                + "pipeline:\n  - from: events\n  - map: { v: \"event.value * 3 + 1\" }\n  \
               - filter: \"event.v % 2 == 0\"\n  - to: out\n"
        }
        "w3" | "w3-100keys" => {
            source(if workload == "w3" { 5_000_000 } else { 100 }, "")
                + &format!(
                    "pipeline:\n  - from: events\n  - key_by: \"event.key\"\n    partitions: {partitions}\n  \
                 - aggregate: {{ n: \"count()\", sum: \"sum(event.value)\", delta: \"last(event.value)\" }}\n  - to: out\n"
                )
        }
        _ => usage(),
    };
    let pipeline = match Pipeline::parse(&format!("{workload}.yaml"), text.as_bytes()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1)
        }
    };
    let int = |v: &Value| match v {
        Value::Int(i) => *i as u64,
        _ => 0,
    };
    let workload = workload.to_string();
    let job = pipeline.job_with_sinks(move |_, out: &SinkUse| {
        let total = total.clone();
        match workload.as_str() {
            "w1" => out.stream.sink(Checksum {
                total,
                f: move |o: &mut Out, r: &Row| {
                    let (key, window, sum) = (int(r.field(0)), int(r.field(1)) / 1000, int(r.field(3)));
                    o.count += 1;
                    o.sum = o.sum.wrapping_add(sum);
                    o.chk = o.chk.wrapping_add(
                        key.wrapping_mul(1_000_003).wrapping_add(window).wrapping_mul(sum.wrapping_add(1)),
                    );
                },
            }),
            "w2" => out.stream.sink(Checksum {
                total,
                f: move |o: &mut Out, r: &Row| {
                    o.count += 1;
                    o.sum = o.sum.wrapping_add(int(r.field(0)));
                    o.chk = o.sum;
                },
            }),
            _ => out.stream.sink(Checksum {
                total,
                f: move |o: &mut Out, r: &Row| {
                    let (key, count, delta) = (int(r.field(0)), int(r.field(1)), int(r.field(3)));
                    o.count += u64::from(count == 1);
                    o.sum = o.sum.wrapping_add(delta);
                    o.chk = o.chk.wrapping_add(key.wrapping_mul(delta));
                },
            }),
        };
        true
    });
    job.unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    })
}

fn usage() -> ! {
    eprintln!(
        "usage: bench <w1|w1-100keys|w1-sum|w2|w3|w3-100keys|w3-sum|yaml-w1|yaml-w2|yaml-w3|yaml-w3-100keys|sessions|sessions-100keys|dedup|list-append|map-state|join-interval|join-window|join-interval-loop|join-window-loop|async|async-loop> <events> <partitions> [threads] | bench ckpt <keys> 1"
    );
    std::process::exit(2)
}

/// Loads the admin API at `addr` from a thread of its own until the
/// process ends: 2,000 connections kept open (silent, or with half a
/// request head; reopened as the server closes them), and with `flood`
/// four clients requesting `/api/metrics` and posting unauthenticated
/// bodies back to back.
fn admin_load(addr: std::net::SocketAddr, flood: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let spawned = std::thread::Builder::new().name("admin-load".into()).spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        rt.block_on(async move {
            for i in 0..2_000u32 {
                tokio::spawn(async move {
                    loop {
                        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        };
                        if i % 2 == 1 {
                            let _ = s.write_all(b"GET /api/job HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").await;
                        }
                        let mut sink = [0u8; 256];
                        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
                    }
                });
            }
            for c in 0..if flood { 4 } else { 0 } {
                tokio::spawn(async move {
                    loop {
                        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else { continue };
                        let request = if c % 2 == 0 {
                            format!("GET /api/metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                        } else {
                            format!(
                                "POST /api/stop HTTP/1.1\r\nHost: {addr}\r\nContent-Type: text/plain\r\n\
                                 Content-Length: 2\r\nConnection: close\r\n\r\n[]"
                            )
                        };
                        let mut response = Vec::new();
                        let _ = s.write_all(request.as_bytes()).await;
                        let _ = s.read_to_end(&mut response).await;
                    }
                });
            }
            std::future::pending::<()>().await;
        });
    });
    if let Err(e) = spawned {
        eprintln!("cannot start the admin load: {e}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let workload = args.get(1).cloned().unwrap_or_else(|| usage());
    let parse = |i: usize, default: Option<u64>| -> u64 {
        match args.get(i).map(|s| s.replace('_', "").parse::<u64>()) {
            Some(Ok(v)) => v,
            Some(Err(_)) => usage(),
            None => default.unwrap_or_else(|| usage()),
        }
    };
    let n = parse(2, Some(20_000_000));
    let partitions = usize::try_from(parse(3, Some(1))).unwrap_or(1).max(1);
    let threads = usize::try_from(parse(4, Some(partitions as u64))).unwrap_or(1).max(1);
    // State backend: `WEIBO_STATE=fjall` keeps state on disk (in a fresh
    // temporary directory), anything else in memory.
    let on_disk = std::env::var("WEIBO_STATE").is_ok_and(|s| s == "fjall");

    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start tokio: {e}");
            std::process::exit(1)
        }
    };
    let total = Arc::new(Mutex::new(Out::default()));
    let state_dir = std::env::temp_dir().join(format!("weibo-bench-{}", std::process::id()));
    if workload == "ckpt" {
        ckpt(&runtime, n, std::env::var("WEIBO_STATE").is_ok_and(|s| s == "fjall"));
        return;
    }
    if workload == "async-loop" {
        // The floor of `async`: the same calls from a plain loop, as many
        // in flight, no framework.
        let latency = std::env::var("WEIBO_LATENCY_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
        let in_flight = std::env::var("WEIBO_IN_FLIGHT").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
        let started = Instant::now();
        let out = runtime.block_on(async move {
            let Ok(server) = slow_server(Duration::from_millis(latency)).await else { return Out::default() };
            let client = reqwest::Client::builder().pool_max_idle_per_host(4 * in_flight).build().unwrap_or_default();
            let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            for i in 0..n {
                let Ok(permit) = permits.clone().acquire_owned().await else { break };
                let (request, tx) = (client.get(format!("http://{server}/{i}")), tx.clone());
                tokio::spawn(async move {
                    let body = match request.send().await {
                        Ok(response) => response.text().await.unwrap_or_default(),
                        Err(_) => String::new(),
                    };
                    let _ = tx.send(body.trim().parse::<u64>().unwrap_or(0));
                    drop(permit);
                });
            }
            drop(tx);
            let mut out = Out::default();
            while let Some(v) = rx.recv().await {
                out.count += 1;
                out.sum = out.sum.wrapping_add(v);
                out.chk = out.chk.wrapping_add(v.wrapping_mul(v));
            }
            out
        });
        let secs = started.elapsed().as_secs_f64();
        println!(
            "RESULT engine=loop workload=async n={n} par=1 secs={secs:.4} eps={:.0} out_count={} out_sum={} out_chk={} threads={threads} heap_peak_kb={}",
            n as f64 / secs,
            out.count,
            out.sum,
            out.chk,
            heap_kb().1
        );
        return;
    }
    if let Some(join @ ("join-interval" | "join-window")) = workload.strip_suffix("-loop") {
        let started = Instant::now();
        let out = join_floor(n, join == "join-window");
        let secs = started.elapsed().as_secs_f64();
        println!(
            "RESULT engine=loop workload={join} n={n} par=1 secs={secs:.4} eps={:.0} out_count={} out_sum={} out_chk={} threads=1 heap_peak_kb={}",
            n as f64 / secs,
            out.count,
            out.sum,
            out.chk,
            heap_kb().1
        );
        return;
    }
    let mut job = match workload.strip_prefix("yaml-") {
        Some(w) => yaml_job(w, n, partitions, total.clone()),
        None => Job::new(format!("bench-{workload}")),
    };
    // `WEIBO_ALIGN_MS=<ms>` sets the sources' watermark alignment (the
    // largest drift between partitions; `off`: none).
    match std::env::var("WEIBO_ALIGN_MS").as_deref() {
        Ok("off") => job = job.without_watermark_alignment(),
        Ok(ms) => match ms.parse::<u64>() {
            Ok(ms) => job = job.with_watermark_alignment(Duration::from_millis(ms)),
            Err(_) => {
                eprintln!("WEIBO_ALIGN_MS={ms}: expected milliseconds or `off`");
                std::process::exit(2)
            }
        },
        Err(_) => {}
    }
    // `WEIBO_CHANNEL=<batches>` sets the edges' channel capacity and
    // `WEIBO_BATCH=<records>` the batch size (what the heap at p=2 is
    // made of: see the Performance chapter).
    if let Some(c) = std::env::var("WEIBO_CHANNEL").ok().and_then(|v| v.parse::<usize>().ok()) {
        job = job.with_channel_capacity(c);
    }
    if let Some(b) = std::env::var("WEIBO_BATCH").ok().and_then(|v| v.parse::<usize>().ok()) {
        job = job.with_batch_size(b);
    }
    // `WEIBO_CHECKPOINT_MS=<ms>` takes checkpoints that often (into a
    // temporary directory).
    // The longest barrier pause is printed to stderr at the end.
    let checkpoint_ms = std::env::var("WEIBO_CHECKPOINT_MS").ok().and_then(|v| v.parse::<u64>().ok());
    let checkpointing = checkpoint_ms.is_some();
    if let Some(ms) = checkpoint_ms {
        job = job.with_checkpoints(state_dir.join("checkpoints"), Duration::from_millis(ms));
    }
    if on_disk {
        match fjall(&state_dir) {
            Ok(backend) => job = job.with_state_backend(backend),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1)
            }
        }
    }
    match workload.as_str() {
        "w1" => w1(&job, n, partitions, 100_000, total.clone()),
        "w1-100keys" => w1(&job, n, partitions, 100, total.clone()),
        "w1-sum" => w1_sum(&job, n, partitions, total.clone()),
        "w2" => w2(&job, n, partitions, total.clone()),
        w if w.starts_with("yaml-") => {}
        "w3" => w3(&job, n, partitions, 5_000_000, total.clone()),
        "w3-100keys" => w3(&job, n, partitions, 100, total.clone()),
        "w3-sum" => w3_sum(&job, n, partitions, total.clone()),
        "sessions" => sessions(&job, n, partitions, 100_000, total.clone()),
        "sessions-100keys" => sessions(&job, n, partitions, 100, total.clone()),
        "dedup" => dedup(&job, n, partitions, total.clone()),
        "list-append" => list_append(&job, n, partitions, total.clone()),
        "map-state" => map_state(&job, n, partitions, total.clone()),
        "join-interval" => join_interval(&job, n, partitions, total.clone()),
        "join-window" => join_window(&job, n, partitions, total.clone()),
        "async" => {
            let latency = std::env::var("WEIBO_LATENCY_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
            match runtime.block_on(slow_server(Duration::from_millis(latency))) {
                Ok(server) => async_lookup(&job, n, partitions, server, total.clone()),
                Err(e) => {
                    eprintln!("cannot start the local HTTP server: {e}");
                    std::process::exit(1)
                }
            }
        }
        _ => usage(),
    }
    // `WEIBO_SCRAPE_MS=<ms>` serves the admin API and scrapes its
    // Prometheus endpoint that often while the job runs (what the cost of
    // metrics is measured with).
    let scrape = std::env::var("WEIBO_SCRAPE_MS").ok().and_then(|v| v.parse::<u64>().ok());
    // `WEIBO_ADMIN_LOAD=idle|flood` serves the admin API and, from a thread
    // of its own, holds 2,000 idle and half-sent connections on it (`idle`)
    // or also sends it requests as fast as it answers (`flood`): what an
    // attack on the API costs the job.
    let load = std::env::var("WEIBO_ADMIN_LOAD").ok();
    if scrape.is_some() || load.is_some() {
        job = job.with_admin("127.0.0.1:0");
    }
    let started = Instant::now();
    let result = runtime.block_on(async {
        let handle = job.spawn()?;
        if let (Some(load), Some(addr)) = (&load, handle.admin_addr()) {
            admin_load(addr, load == "flood");
        }
        if let (Some(ms), Some(addr)) = (scrape, handle.admin_addr()) {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut ticker = tokio::time::interval(Duration::from_millis(ms));
                loop {
                    ticker.tick().await;
                    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else { break };
                    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
                    let mut response = Vec::new();
                    if stream.write_all(request.as_bytes()).await.is_err()
                        || stream.read_to_end(&mut response).await.is_err()
                    {
                        break;
                    }
                }
            });
        }
        if checkpointing {
            // The longest barrier pause of any operator, read before the
            // handle is consumed (the job's metrics go with it).
            while !handle.is_finished() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let pause = handle.metrics().operators.iter().map(|o| o.max_checkpoint_pause).max().unwrap_or_default();
            eprintln!("CHECKPOINTS max_pause_ms={:.2}", pause.as_secs_f64() * 1e3);
        }
        handle.wait().await
    });
    if let Err(e) = result {
        eprintln!("job failed: {e}");
        std::process::exit(1);
    }
    let secs = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&state_dir);
    let out = *total.lock().unwrap_or_else(PoisonError::into_inner);
    let engine = match (workload.as_str(), on_disk) {
        ("w1-100keys", false) => "weibo-100keys",
        ("w1-100keys", true) => "weibo-fjall-100keys",
        ("w3-sum" | "w1-sum", false) => "weibo-sum",
        ("w1-sum", true) => "weibo-fjall-sum",
        ("w3-100keys", _) => "weibo-100keys",
        ("yaml-w3-100keys", _) => "weibo-yaml-100keys",
        ("w3-sum", true) => "weibo-fjall-sum",
        (w, false) if w.starts_with("yaml-") => "weibo-yaml",
        (w, true) if w.starts_with("yaml-") => "weibo-yaml-fjall",
        (_, true) => "weibo-fjall",
        _ => "weibo",
    };
    let workload = match workload.as_str() {
        "w1-100keys" | "w1-sum" => "w1",
        "w3-sum" | "w3-100keys" | "yaml-w3-100keys" => "w3",
        w => w.strip_prefix("yaml-").unwrap_or(w),
    };
    println!(
        "RESULT engine={engine} workload={workload} n={n} par={partitions} secs={secs:.4} eps={:.0} out_count={} out_sum={} out_chk={} threads={threads} heap_peak_kb={}",
        n as f64 / secs,
        out.count,
        out.sum,
        out.chk,
        heap_kb().1
    );
}
