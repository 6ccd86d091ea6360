//! The timely-dataflow peer of `shared/bench/peers/timely` (its `src/main.rs`),
//! run on several workers: `scripts/bench-compare.sh` builds it in place of
//! the peer's own `main.rs` (same `Cargo.toml` and `Cargo.lock`) to measure
//! timely with two workers beside Weibo with two partitions.
//!
//! usage: WORKERS=<n> LAG=<windows> timely-peer <w1|w2|w3> [N]
//!
//! WORKERS (default 1): timely workers in this process (`Config::process`);
//! worker `i` of `n` generates the events `i mod n`, and the exchange routes
//! them by key as in the peer. LAG (default 1, the peer's own pacing): how
//! many 1 s windows of input a worker sends before it waits for the output
//! to catch up; with one worker and LAG 1 this is the peer, with two, LAG
//! 1 stops both workers at every window (a progress round each), so the
//! comparison runs with LAG 100.
//!
//! Everything else (events, operators, checksums) is the peer's; see its
//! documentation below.
//!
//! timely-dataflow peer for Weibo W1 (and W2), one worker (`execute_directly`).
//!
//! usage: timely-peer <w1|w2|w3> [N]
//!
//! Event i: key = (i * 2654435761) mod 100000, value = i mod 1000, ts = i ms.
//! Timely timestamps are the 1 s event-time window index (ts / 1000): the input frontier
//! is advanced once per second of event time, so "frontier passed w" == "watermark
//! (max event time seen) reached the end of window w". That is the idiomatic timely
//! encoding; per-millisecond timestamps would cost one progress round per event.
//! W1 operator: per-timestamp FxHashMap<key, sum>, emitted when the frontier passes it.
//! W3 (bonus): key = (i * 2654435761) mod 5000000, FxHashMap running sum per key, one
//! update (key, sum, delta, is_new) emitted per event like Flink's keyBy+reduce.
//! Same checksums as the other engines. Prints one RESULT line.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

use rustc_hash::FxHashMap;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::vec::{Filter, Map};
use timely::dataflow::operators::{Capability, Inspect, Operator, Probe};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::{InputHandle, ProbeHandle};

const MULT: u64 = 2_654_435_761;
const M: u64 = 1000; // events per window (1 ms per event, 1 s windows)

type Ev = (u64, u64, u64);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let wl = args.get(1).cloned().unwrap_or_else(|| "w1".into());
    let n: u64 = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(20_000_000);
    assert!(n % M == 0);
    let is_w1 = wl == "w1";
    let is_w3 = wl == "w3";
    let key_mod: u64 = if is_w3 { 5_000_000 } else { 100_000 };
    let workers: usize = std::env::var("WORKERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let lag: u64 = std::env::var("LAG").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let t0 = Instant::now();
    let guards = timely::execute(timely::Config::process(workers), move |worker| {
        let (index, peers) = (worker.index() as u64, worker.peers() as u64);
        let mut input: InputHandle<u64, CapacityContainerBuilder<Vec<Ev>>> = InputHandle::new();
        let probe = ProbeHandle::new();
        let acc = Rc::new(RefCell::new((0u64, 0u64, 0u64)));
        let acc2 = acc.clone();
        let w1 = is_w1;
        worker.dataflow::<u64, _, _>(|scope| {
            let stream = input.to_stream(scope);
            if w1 {
                stream
                    .unary_frontier(Exchange::new(|e: &Ev| e.0), "TumblingSum", |_cap, _info| {
                        let mut open: BTreeMap<u64, (Capability<u64>, FxHashMap<u64, u64>)> = BTreeMap::new();
                        move |(input, frontier), output| {
                            input.for_each_stamp(|cap, data| {
                                if let Some(cap) = cap.retain_least(output.output_index()) {
                                    let t = *cap.time();
                                    let entry = open.entry(t).or_insert_with(|| (cap, FxHashMap::default()));
                                    for batch in data {
                                        for (k, v, _ts) in batch.drain(..) {
                                            *entry.1.entry(k).or_insert(0) += v;
                                        }
                                    }
                                }
                            });
                            while let Some(t) = open.keys().next().copied() {
                                if frontier.less_equal(&t) {
                                    break;
                                }
                                let (cap, mut m) = open.remove(&t).unwrap();
                                let mut session = output.session(&cap);
                                for (k, s) in m.drain() {
                                    session.give((k, t, s));
                                }
                            }
                        }
                    })
                    .container::<Vec<Ev>>()
                    .inspect(move |&(k, w, s): &Ev| {
                        let mut a = acc2.borrow_mut();
                        a.0 += 1;
                        a.1 = a.1.wrapping_add(s);
                        a.2 = a.2.wrapping_add(k.wrapping_mul(1_000_003).wrapping_add(w).wrapping_mul(s.wrapping_add(1)));
                    })
                    .probe_with(&probe);
            } else if is_w3 {
                stream
                    .unary(Exchange::new(|e: &Ev| e.0), "RunningSum", |_cap, _info| {
                        let mut state: FxHashMap<u64, u64> = FxHashMap::default();
                        move |input, output| {
                            input.for_each_stamp(|cap, data| {
                                let mut session = output.session(&cap);
                                for batch in data {
                                    for (k, v, _ts) in batch.drain(..) {
                                        let mut new = false;
                                        let s = state.entry(k).or_insert_with(|| { new = true; 0 });
                                        *s += v;
                                        session.give((k, *s, v, new as u64));
                                    }
                                }
                            });
                        }
                    })
                    .container::<Vec<(u64, u64, u64, u64)>>()
                    .inspect(move |&(k, _s, d, new): &(u64, u64, u64, u64)| {
                        let mut a = acc2.borrow_mut();
                        a.0 += new;
                        a.1 = a.1.wrapping_add(d);
                        a.2 = a.2.wrapping_add(k.wrapping_mul(d));
                    })
                    .probe_with(&probe);
            } else {
                stream
                    .map(|(k, v, t): Ev| (k, v * 3 + 1, t))
                    .filter(|e: &Ev| e.1 % 2 == 0)
                    .inspect(move |&(_k, v, _t): &Ev| {
                        let mut a = acc2.borrow_mut();
                        a.0 += 1;
                        a.1 = a.1.wrapping_add(v);
                        a.2 = a.2.wrapping_add(v);
                    })
                    .probe_with(&probe);
            }
        });
        for w in 0..n / M {
            for i in (w * M..(w + 1) * M).filter(|i| i % peers == index) {
                input.send((i.wrapping_mul(MULT) % key_mod, i % 1000, i));
            }
            input.advance_to(w + 1);
            let behind = (w + 1).saturating_sub(lag.max(1) - 1);
            while probe.less_than(&behind) {
                worker.step();
            }
        }
        input.close();
        while worker.step() {}
        let r = *acc.borrow();
        r
    })
    .unwrap();
    let out = guards.join().into_iter().map(|r| r.unwrap()).fold((0u64, 0u64, 0u64), |a, b| {
        (a.0 + b.0, a.1.wrapping_add(b.1), a.2.wrapping_add(b.2))
    });
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "RESULT engine=timely workload={wl} n={n} par={workers} secs={secs:.4} eps={:.0} out_count={} out_sum={} out_chk={}",
        n as f64 / secs,
        out.0,
        out.1,
        out.2
    );
}
