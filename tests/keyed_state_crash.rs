//! Crash test of named keyed state: a child process runs a keyed process
//! function that keeps every kind of state (value, list, map, reducing,
//! aggregating, a map with a time-to-live) and sets timers in both domains,
//! from a file to the exactly-once file sink with checkpoints every 150 ms;
//! it is killed with SIGKILL at random moments and started again until it
//! finishes. Its committed output must equal that of a run that never
//! crashed: every line once, none missing, none twice. In memory, and on
//! fjall with a cache of a few values.
//!
//! The child is this test binary itself, started with
//! `WEIBO_STATE_CRASH_CHILD` set, running only the `child` test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weibo::process::{
    AggregatingState, KeyedProcessFunction, ListState, MapState, ProcessContext, ReducingState, StateTtl, States,
    TimeDomain, Timer, ValueState,
};
use weibo::sinks::TxnFileSink;
use weibo::sources::FileSource;
use weibo::time::WatermarkStrategy;
use weibo::{Aggregate, Job};
use weibo_tests::crash;

const LINES: usize = 8_000;

/// Line `i`: `key,value,time`, time 1 ms a line.
fn write_input(path: &Path) {
    let mut text = String::new();
    for i in 0..LINES {
        text.push_str(&format!("{},{},{}\n", i % 11, i % 100, i));
    }
    std::fs::write(path, text).unwrap();
}

fn parse(line: &String) -> Result<(u32, u64, i64), String> {
    let mut parts = line.split(',');
    let mut next = || parts.next().ok_or_else(|| format!("short line `{line}`"));
    let key = next()?.parse().map_err(|e| format!("{e}"))?;
    let value = next()?.parse().map_err(|e| format!("{e}"))?;
    let time = next()?.parse().map_err(|e| format!("{e}"))?;
    Ok((key, value, time))
}

struct Mean;

impl Aggregate<u64> for Mean {
    type Acc = (u64, u64);
    type Out = u64;
    fn create(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, u64), v: u64) {
        *acc = (acc.0 + v, acc.1 + 1);
    }
    fn merge(&self, acc: &mut (u64, u64), o: (u64, u64)) {
        *acc = (acc.0 + o.0, acc.1 + o.1);
    }
    fn result(&self, acc: &(u64, u64)) -> u64 {
        acc.0 / acc.1.max(1)
    }
}

/// Every kind of state, and timers in both domains. Each output line is a
/// function of the key's records alone, whatever the batches and however
/// often the job was restored:
/// - per record: the key's count, sum, mean, how many of its values fell in
///   the record's bucket, and whether its value was seen before;
/// - per event-time timer (every 10th record of a key, 30 ms after it):
///   the count and sum of the key's records in the 200 ms up to the
///   timer's time, from its list;
/// - one processing-time timer per key, due at once: a line for the key.
struct Everything {
    count: ValueState<u64>,
    events: ListState<(i64, u64)>,
    buckets: MapState<u64, u64>,
    sum: ReducingState<u64>,
    mean: AggregatingState<u64, Mean>,
    seen: MapState<u64, ()>,
    reminded: ValueState<bool>,
}

impl Everything {
    fn new(states: &mut States<u32>) -> Self {
        Everything {
            count: states.value("count"),
            events: states.list("events"),
            buckets: states.map("buckets"),
            sum: states.reducing("sum", |a: u64, b| a + b),
            mean: states.aggregating("mean", Mean),
            seen: states.ttl(StateTtl::after_write(Duration::from_secs(3_600))).map("seen"),
            reminded: states.value("reminded"),
        }
    }
}

impl KeyedProcessFunction<u32, (u32, u64, i64)> for Everything {
    type Out = String;
    type Error = String;

    fn process_element(&self, ctx: &mut ProcessContext<'_, u32, String>, e: &(u32, u64, i64)) -> Result<(), String> {
        let (key, value, time) = *e;
        let count = ctx.value(&self.count).get().unwrap_or(0) + 1;
        ctx.value(&self.count).set(count);
        ctx.list(&self.events).add((time, value));
        let mut in_bucket = 0;
        ctx.map(&self.buckets).update(value % 10, |n| {
            in_bucket = n.unwrap_or(0) + 1;
            *n = Some(in_bucket);
        });
        ctx.reducing(&self.sum).add(value);
        ctx.aggregating(&self.mean).add(value);
        let seen = ctx.map(&self.seen).contains(&value);
        ctx.map(&self.seen).put(value, ());
        let (sum, mean) = (ctx.reducing(&self.sum).get().unwrap_or(0), ctx.aggregating(&self.mean).get().unwrap_or(0));
        ctx.emit(format!("r,{key},{count},{sum},{mean},{in_bucket},{seen}"));
        if count % 10 == 1 {
            ctx.register_timer(time + 30);
        }
        if ctx.value(&self.reminded).get().is_none() {
            ctx.value(&self.reminded).set(true);
            ctx.register_processing_timer(ctx.processing_time());
        }
        Ok(())
    }

    fn on_timer(&self, ctx: &mut ProcessContext<'_, u32, String>, timer: Timer) -> Result<(), String> {
        let key = *ctx.key();
        if timer.domain == TimeDomain::ProcessingTime {
            ctx.emit(format!("p,{key}"));
            return Ok(());
        }
        let t = timer.time;
        let events = ctx.list(&self.events).get();
        let window: Vec<&(i64, u64)> = events.iter().filter(|(ts, _)| *ts > t - 200 && *ts <= t).collect();
        let sum: u64 = window.iter().map(|(_, v)| v).sum();
        ctx.emit(format!("e,{key},{t},{},{sum}", window.len()));
        // What no later timer looks at goes.
        let kept: Vec<(i64, u64)> = events.into_iter().filter(|(ts, _)| *ts > t - 200).collect();
        ctx.list(&self.events).update(kept);
        Ok(())
    }
}

fn pipeline(input: &Path, out: &Path, checkpoints: &Path, slow: bool, state: Option<&Path>) -> Job {
    let mut job =
        Job::new("state-crash").with_checkpoints(checkpoints, Duration::from_millis(150)).with_max_key_groups(32);
    if let Some(dir) = state {
        let fjall =
            weibo::state::FjallBackend::builder(dir).with_object_cache(512).with_timers_on_disk(true).open().unwrap();
        job = job.with_state_backend(fjall);
    }
    job.source(FileSource::lines(input))
        .name("lines")
        .process(weibo::on_error::Fail, parse)
        .name("parse")
        .map(move |e: (u32, u64, i64)| {
            if slow && e.2 % 10 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            e
        })
        .name("pace")
        .with_timestamps(|e: &(u32, u64, i64)| e.2, WatermarkStrategy::bounded_out_of_orderness(Duration::ZERO))
        .key_by(|e: &(u32, u64, i64)| e.0)
        .with_partitions(2)
        .process_function(weibo::on_error::Fail, Everything::new)
        .uid("everything")
        .name("everything")
        .sink_exactly_once(TxnFileSink::json_lines(out));
    job
}

/// The child's life: run the pipeline to the end.
#[test]
fn child() {
    let Ok(spec) = std::env::var("WEIBO_STATE_CRASH_CHILD") else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let (input, out, cps) = (parts[0], parts[1], parts[2]);
    let state = parts.get(3).filter(|s| !s.is_empty()).map(Path::new);
    let job = pipeline(Path::new(input), Path::new(out), Path::new(cps), true, state);
    weibo::testing::block_on(job.run()).unwrap();
}

/// Committed output: every line of every committed file, counted.
fn committed(out: &Path) -> BTreeMap<String, usize> {
    crash::committed_lines(out)
}

struct Dirs {
    root: tempfile::TempDir,
    input: PathBuf,
    out: PathBuf,
    checkpoints: PathBuf,
    state: Option<PathBuf>,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let input = root.path().join("input.txt");
    write_input(&input);
    let (out, checkpoints) = (root.path().join("out"), root.path().join("checkpoints"));
    Dirs { input, out, checkpoints, state: None, root }
}

fn reference() -> BTreeMap<String, usize> {
    let d = dirs();
    let job = pipeline(&d.input, &d.out, &d.checkpoints, false, None);
    weibo::testing::block_on(job.run()).unwrap();
    let out = committed(&d.out);
    assert_eq!(out.keys().filter(|l| l.starts_with("\"p,")).count(), 11, "one reminder per key: {out:?}");
    assert!(out.keys().filter(|l| l.starts_with("\"e,")).count() > 700, "event-time timers fired");
    assert!(out.values().all(|n| *n == 1));
    out
}

/// Kills the child at pseudo-random moments (`seed`) until it finishes,
/// then compares its committed output with a run that never crashed.
fn killed_again_and_again(d: Dirs, seed: u64) {
    let want = reference();
    let least = if d.state.is_some() { 500 } else { 250 };
    let lives = crash::lives_until_done(&d.out, seed, least, |_, after| {
        let state = d.state.as_ref().map(|s| s.display().to_string()).unwrap_or_default();
        let spec = format!("{}|{}|{}|{state}", d.input.display(), d.out.display(), d.checkpoints.display());
        crash::run_child(crash::child_command("child", "WEIBO_STATE_CRASH_CHILD", spec), after, None)
    });
    assert!(lives > 3, "the child was killed mid-run several times ({lives} lives)");
    let got = committed(&d.out);
    crash::assert_committed_once(&got, &want);
}

#[test]
fn every_state_kind_and_both_timer_domains_survive_sigkill_in_memory() {
    if std::env::var("WEIBO_STATE_CRASH_CHILD").is_ok() {
        return;
    }
    killed_again_and_again(dirs(), 23);
}

#[test]
fn every_state_kind_and_both_timer_domains_survive_sigkill_on_fjall() {
    if std::env::var("WEIBO_STATE_CRASH_CHILD").is_ok() {
        return;
    }
    let mut d = dirs();
    d.state = Some(d.root.path().join("state"));
    killed_again_and_again(d, 29);
}
