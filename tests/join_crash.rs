//! Crash test of joins and enrichment: a child process reads orders and
//! payments from two files and joins them three ways, an interval full
//! outer join, a window left join and a temporal left join, and enriches
//! the orders by asynchronous calls (`map_async`), into the exactly-once
//! file sink with
//! checkpoints every 150 ms; it is killed with SIGKILL at random moments
//! and started again until it finishes. Its committed output, outer rows
//! included, must equal that of a run that never crashed: every line once,
//! none missing, none twice. In memory, and on fjall.
//!
//! The child is this test binary itself, started with
//! `WEIBO_JOIN_CRASH_CHILD` set, running only the `child` test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weibo::sinks::TxnFileSink;
use weibo::sources::FileSource;
use weibo::time::WatermarkStrategy;
use weibo::window::Tumbling;
use weibo::{AsyncOptions, Job};
use weibo_tests::crash;

const LINES: u64 = 6_000;

/// A record of either file: key, id, time.
type Rec = (u32, u64, i64);

/// Orders: line `i` is `key,i,i` (1 ms a line, in time order). Payments:
/// one for each order but every seventh, 0 to 299 ms after it (out of
/// order by less than 300 ms), and a price change every 50 ms per key.
fn write_inputs(orders: &Path, payments: &Path) {
    let (mut o, mut p) = (String::new(), String::new());
    for i in 0..LINES {
        o.push_str(&format!("{},{i},{i}\n", i % 13));
        if !i.is_multiple_of(7) {
            p.push_str(&format!("{},{},{}\n", i % 13, 100_000 + i, i + i % 300));
        }
    }
    std::fs::write(orders, o).unwrap();
    std::fs::write(payments, p).unwrap();
}

fn parse(line: &String) -> Result<Rec, String> {
    let mut parts = line.split(',');
    let mut next = || parts.next().ok_or_else(|| format!("short line `{line}`"));
    let key = next()?.parse().map_err(|e| format!("{e}"))?;
    let id = next()?.parse().map_err(|e| format!("{e}"))?;
    let time = next()?.parse().map_err(|e| format!("{e}"))?;
    Ok((key, id, time))
}

/// The pipeline; `slow` paces both inputs so that a life ends mid-run.
fn pipeline(orders: &Path, payments: &Path, out: &Path, checkpoints: &Path, slow: bool, state: Option<&Path>) -> Job {
    let mut job = Job::new("join-crash").with_checkpoints(checkpoints, Duration::from_millis(150));
    if let Some(dir) = state {
        job = job.with_state_backend(weibo::state::FjallBackend::builder(dir).with_object_cache(512).open().unwrap());
    }
    let read = |path: &Path, name: &str, out_of_order: u64| {
        job.source(FileSource::lines(path))
            .uid(name)
            .name(name)
            .process(weibo::on_error::Fail, parse)
            .name(&format!("parse {name}"))
            .map(move |r: Rec| {
                if slow && r.1.is_multiple_of(10) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                r
            })
            .name(&format!("pace {name}"))
            .with_timestamps(
                |r: &Rec| r.2,
                WatermarkStrategy::bounded_out_of_orderness(Duration::from_millis(out_of_order)),
            )
            .key_by(|r: &Rec| r.0)
    };
    let orders = read(orders, "orders", 0);
    let payments = read(payments, "payments", 300);
    let show = |r: Option<&Rec>| r.map_or_else(|| "-".to_string(), |r| r.1.to_string());
    let interval = orders
        .interval_join(&payments)
        .between(0, 5)
        .with_partitions(2)
        .full_join(move |o: Option<&Rec>, p: Option<&Rec>| format!("i,{},{}", show(o), show(p)))
        .uid("interval");
    let window = orders
        .join(&payments)
        .with_partitions(2)
        .window(Tumbling::of(Duration::from_millis(100)))
        .left_join(move |o: &Rec, p: Option<&Rec>| format!("w,{},{}", o.1, show(p)))
        .uid("window")
        .into_stream();
    // The payments as a table: each key's latest payment at an order's time.
    let temporal = orders
        .temporal_join(&payments)
        .with_partitions(2)
        .left_join(move |o: &Rec, p: Option<&Rec>| format!("t,{},{}", o.1, show(p)))
        .uid("temporal");
    // An enrichment by a call that takes a few milliseconds, many in
    // flight: those in flight at a kill are called for again.
    let enriched = orders
        .map_async(weibo::on_error::Fail, AsyncOptions::new().in_flight(32).unordered(), |_: &u32, o: &Rec| {
            let id = o.1;
            async move {
                tokio::time::sleep(Duration::from_millis(id % 4)).await;
                Ok::<_, String>(format!("a,{id},{}", id * 7))
            }
        })
        .uid("enrich");
    interval.union(&window).union(&temporal).union(&enriched).sink_exactly_once(TxnFileSink::json_lines(out));
    job
}

/// The child's life: run the pipeline to the end.
#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_JOIN_CRASH_CHILD") else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let (orders, payments, out, cps) = (parts[0], parts[1], parts[2], parts[3]);
    let state = parts.get(4).filter(|s| !s.is_empty()).map(Path::new);
    let job = pipeline(Path::new(orders), Path::new(payments), Path::new(out), Path::new(cps), true, state);
    weibo::testing::block_on(job.run()).unwrap();
}

struct Dirs {
    root: tempfile::TempDir,
    orders: PathBuf,
    payments: PathBuf,
    out: PathBuf,
    checkpoints: PathBuf,
    state: Option<PathBuf>,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let (orders, payments) = (root.path().join("orders.txt"), root.path().join("payments.txt"));
    write_inputs(&orders, &payments);
    let (out, checkpoints) = (root.path().join("out"), root.path().join("checkpoints"));
    Dirs { orders, payments, out, checkpoints, state: None, root }
}

fn reference() -> BTreeMap<String, usize> {
    let d = dirs();
    let job = pipeline(&d.orders, &d.payments, &d.out, &d.checkpoints, false, None);
    weibo::testing::block_on(job.run()).unwrap();
    let out = crash::committed_lines(&d.out);
    let count = |prefix: &str| out.keys().filter(|l| l.starts_with(prefix)).count();
    assert!(count("\"i,") > 5_000 && count("\"w,") > 5_000 && count("\"t,") == LINES as usize, "{out:?}");
    assert_eq!(count("\"a,"), LINES as usize, "every order enriched once");
    assert!(count("\"i,-,") > 0 && out.keys().any(|l| l.starts_with("\"i,") && l.ends_with(",-\"")), "outer rows");
    assert!(out.values().all(|n| *n == 1), "every line is unique in a run");
    out
}

/// Kills the child at pseudo-random moments (`seed`) until it finishes,
/// then compares its committed output with a run that never crashed.
fn killed_again_and_again(d: Dirs, seed: u64) {
    let want = reference();
    let least = if d.state.is_some() { 500 } else { 250 };
    let lives = crash::lives_until_done(&d.out, seed, least, |_, after| {
        let state = d.state.as_ref().map(|s| s.display().to_string()).unwrap_or_default();
        let spec = format!(
            "{}|{}|{}|{}|{state}",
            d.orders.display(),
            d.payments.display(),
            d.out.display(),
            d.checkpoints.display()
        );
        crash::run_child(crash::child_command("child", "WEIBO_JOIN_CRASH_CHILD", spec), after, None)
    });
    assert!(lives > 3, "the child was killed mid-run several times ({lives} lives)");
    let got = crash::committed_lines(&d.out);
    crash::assert_committed_once(&got, &want);
}

#[test]
fn joins_survive_sigkill_in_memory() {
    if std::env::var("WEIBO_JOIN_CRASH_CHILD").is_ok() {
        return;
    }
    killed_again_and_again(dirs(), 31);
}

#[test]
fn joins_survive_sigkill_on_fjall() {
    if std::env::var("WEIBO_JOIN_CRASH_CHILD").is_ok() {
        return;
    }
    let mut d = dirs();
    d.state = Some(d.root.path().join("state"));
    killed_again_and_again(d, 37);
}
