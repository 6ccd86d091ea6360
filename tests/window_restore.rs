//! Windows across crashes and restores: random out-of-order input through
//! every window kind with allowed lateness, checkpointed every few
//! milliseconds into exactly-once file sinks (results and late records),
//! the job cancelled at random moments (as a crash: nothing after its
//! last complete checkpoint is committed) and restored, again and again,
//! then run to the end. The committed output must equal the naive model's
//! for the same restore points (the watermark starts again after each; a
//! window that fired before a checkpoint fires again only when records
//! are added to it after the restore), and, when no record is ever behind
//! the watermark, the output of a run that never crashed.

use std::path::Path;
use std::time::Duration;

use weibo::Job;
use weibo::sinks::TxnFileSink;
use weibo::sources::Generator;
use weibo::time::WatermarkStrategy;
use weibo::window::{Session, Sliding, Tumbling, WindowContext};
use weibo_tests::crash::{self, Rng};
use weibo_tests::window_model::{Ev, Firing, Kind, Naive, in_order, naive, naive_with_restores};

/// A case: the input and the window configuration.
#[derive(Clone, Debug)]
struct Case {
    input: Vec<Ev>,
    bound: i64,
    lateness: i64,
    kind: Kind,
    partitions: usize,
}

fn case(seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let n = 150 + rng.below(150) as usize;
    let bound = rng.pick(&[0i64, 3, 10]);
    // Every other case keeps each record within the bound (nothing is
    // behind the watermark): then the output must also equal a run that
    // never crashed.
    let back_max = if seed.is_multiple_of(2) { bound } else { 40 };
    let mut base = 0i64;
    let input = (0..n)
        .map(|i| {
            base += rng.below(4) as i64;
            Ev {
                key: rng.below(3) as u8,
                ts: base - rng.below(back_max as u64 + 1) as i64,
                value: rng.below(100) as i64,
                seq: i as u32,
            }
        })
        .collect();
    let kind = match rng.below(3) {
        0 => {
            let size = rng.pick(&[5i64, 10, 25]);
            Kind::Tumbling { size, offset: rng.below(size as u64) as i64 }
        }
        1 => {
            let (size, slide) = rng.pick(&[(20i64, 5i64), (20, 10), (10, 10), (6, 15)]);
            Kind::Sliding { size, slide, offset: rng.below(slide as u64) as i64 }
        }
        _ => Kind::Session { gap: rng.pick(&[2i64, 5, 10]) },
    };
    Case { input, bound, lateness: rng.pick(&[7i64, 20, 60]), kind, partitions: 1 + rng.below(3) as usize }
}

fn job(c: &Case, rate: f64, out: &Path, late: &Path, checkpoints: &Path, on_disk: Option<&Path>) -> Job {
    let ms = |v: i64| Duration::from_millis(v as u64);
    let mut job = Job::new("window-restore")
        .with_checkpoints(checkpoints, Duration::from_millis(15))
        .with_batch_size(4)
        .with_max_key_groups(8);
    if let Some(dir) = on_disk {
        job = job.with_state_backend(weibo::state::FjallBackend::builder(dir).with_object_cache(256).open().unwrap());
    }
    let input = c.input.clone();
    let keyed = job
        .source(Generator::new(input.len() as u64, move |i| input[i as usize].clone()).with_rate(rate))
        .with_timestamps(|e: &Ev| e.ts, WatermarkStrategy::bounded_out_of_orderness(ms(c.bound)))
        .key_by(|e: &Ev| e.key)
        .with_partitions(c.partitions);
    let windowed = match c.kind {
        Kind::Tumbling { size, offset } => keyed.window(Tumbling::of(ms(size)).with_offset(ms(offset))),
        Kind::Sliding { size, slide, offset } => keyed.window(Sliding::of(ms(size), ms(slide)).with_offset(ms(offset))),
        Kind::Session { gap } => keyed.window(Session::with_gap(ms(gap))),
    }
    .allowed_lateness(ms(c.lateness));
    let out_stream = windowed.process(|ctx: &WindowContext<'_, u8>, evs: &[Ev], out: &mut Vec<Firing>| {
        let mut seqs: Vec<u32> = evs.iter().map(|e| e.seq).collect();
        seqs.sort_unstable();
        out.push((*ctx.key, ctx.window.start, ctx.window.end, seqs));
    });
    out_stream.late_records().map(|e: Ev| e.seq).sink_exactly_once(TxnFileSink::json_lines(late));
    out_stream.sink_exactly_once(TxnFileSink::json_lines(out));
    job
}

/// The first few firings `a` holds more often than `b`.
fn surplus<'a>(a: &'a [Firing], b: &'a [Firing]) -> Vec<&'a Firing> {
    let mut counts: std::collections::BTreeMap<&Firing, i64> = std::collections::BTreeMap::new();
    for f in a {
        *counts.entry(f).or_default() += 1;
    }
    for f in b {
        *counts.entry(f).or_default() -= 1;
    }
    counts.into_iter().filter(|(_, n)| *n > 0).map(|(f, _)| f).take(5).collect()
}

fn committed<T: serde::de::DeserializeOwned>(dir: &Path) -> Vec<T> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().is_file() {
            for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
                out.push(serde_json::from_str(line).unwrap());
            }
        }
    }
    out
}

/// Runs `c` through lives cancelled after `kills`, then a life to the end;
/// returns the committed output and the restore positions.
fn run(c: &Case, kills: &[Duration], on_disk: bool) -> (Naive, Vec<usize>) {
    let dir = tempfile::tempdir().unwrap();
    let (out, late, cps, state) =
        (dir.path().join("out"), dir.path().join("late"), dir.path().join("checkpoints"), dir.path().join("state"));
    let mut restores = Vec::new();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for life in 0..=kills.len() {
        // 1,500 records a second: a life sees several checkpoints.
        let handle = runtime
            .block_on(async { job(c, 1500.0, &out, &late, &cps, on_disk.then_some(state.as_path())).spawn() })
            .unwrap();
        if let Some(n) = handle.last_checkpoint() {
            let manifest =
                weibo::checkpoint::read_manifest(&cps.join(format!("chk-{n:020}"))).expect("the restored manifest");
            let p = manifest.sources[0].position as usize;
            if restores.last() != Some(&p) {
                restores.push(p);
            }
        }
        match kills.get(life) {
            Some(after) => runtime.block_on(async {
                tokio::time::sleep(*after).await;
                // As a crash: nothing after the last complete checkpoint
                // reaches the sinks.
                handle.cancel().await.unwrap();
            }),
            None => {
                runtime.block_on(handle.wait()).unwrap();
            }
        }
    }
    let mut got = Naive { firings: committed(&out), late: committed(&late) };
    got.firings.sort();
    got.late.sort_unstable();
    (got, restores)
}

/// Runs case `seed` through three crashes; returns how many restores
/// moved it on.
fn check(seed: u64, on_disk: bool) -> usize {
    let c = case(seed);
    let kills: Vec<Duration> = crash::kill_times(seed ^ 0x5555, 20..110).take(3).collect();
    let (got, restores) = run(&c, &kills, on_disk);
    let want = naive_with_restores(&c.input, c.bound, c.lateness, c.kind, &restores);
    assert!(
        got == want,
        "seed {seed} ({:?}, bound {}, lateness {}, {} partitions, restored at {restores:?}, fjall {on_disk}):\n\
         firings committed more often than the model has them: {:?}\nless often: {:?}\nlate: {:?} vs {:?}",
        c.kind,
        c.bound,
        c.lateness,
        c.partitions,
        surplus(&got.firings, &want.firings),
        surplus(&want.firings, &got.firings),
        got.late,
        want.late,
    );
    if in_order(&c.input, c.bound) {
        assert_eq!(got, naive(&c.input, c.bound, c.lateness, c.kind), "seed {seed}: as a run that never crashed");
    }
    eprintln!(
        "seed {seed}: {:?}, {} records, restored at {restores:?}, {} firings, {} late",
        c.kind,
        c.input.len(),
        got.firings.len(),
        got.late.len()
    );
    restores.len()
}

#[test]
fn windows_restored_again_and_again_commit_what_the_model_does() {
    let restored: usize = (0..24).map(|seed| check(seed, false)).sum();
    // Most lives end after a checkpoint of their own.
    assert!(restored >= 40, "the cases were restored mid-way {restored} times");
}

#[test]
fn on_fjall_windows_restored_again_and_again_commit_what_the_model_does() {
    let restored: usize = (100..108).map(|seed| check(seed, true)).sum();
    assert!(restored >= 12, "the cases were restored mid-way {restored} times");
}

/// Runs case `c` (one partition) at two records a second until a
/// checkpoint at source position `at` (taken after record `at` and before
/// the next, half a second later), cancels it there as a crash would end
/// it, and runs it again from that checkpoint at `rate` records a second
/// to the end; returns the firings committed, sorted.
fn crashed_after_checkpoint_at(c: &Case, at: u64, rate: f64) -> Vec<Firing> {
    let dir = tempfile::tempdir().unwrap();
    let (out, late, cps) = (dir.path().join("out"), dir.path().join("late"), dir.path().join("checkpoints"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let handle = job(c, 2.0, &out, &late, &cps, None).spawn().unwrap();
        loop {
            let checkpoint = handle.checkpoint().await.unwrap();
            let position = weibo::checkpoint::read_manifest(&checkpoint).unwrap().sources[0].position;
            assert!(position <= at, "the checkpoint came after record {}: a loaded machine; run again", at + 1);
            if position == at {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        handle.cancel().await.unwrap();
    });
    runtime.block_on(job(c, rate, &out, &late, &cps, None).run()).unwrap();
    let mut got: Vec<Firing> = committed(&out);
    got.sort();
    got
}

#[test]
fn a_tumbling_window_that_fired_before_the_checkpoint_does_not_fire_again() {
    // The smallest case: tumbling windows of 10 ms, lateness 20 ms, bound
    // 0; records at 0, 15, 16, a checkpoint after the second, a crash and
    // a restore: [0, 10) fired (at 15) and is kept; it must not fire again.
    let input: Vec<Ev> =
        [0i64, 15, 16].iter().enumerate().map(|(i, ts)| Ev { key: 0, ts: *ts, value: 1, seq: i as u32 }).collect();
    let kind = Kind::Tumbling { size: 10, offset: 0 };
    let want = naive_with_restores(&input, 0, 20, kind, &[2]);
    assert_eq!(want, naive(&input, 0, 20, kind), "the model agrees with a run without the crash");
    assert_eq!(want.firings.iter().filter(|f| f.1 == 0).count(), 1);
    let c = Case { input, bound: 0, lateness: 20, kind, partitions: 1 };
    let got = crashed_after_checkpoint_at(&c, 2, 1000.0);
    assert_eq!(got, want.firings, "[0, 10) fired once");
}

#[test]
fn a_window_that_fired_before_the_checkpoint_fires_again_for_every_key_it_got_records_for_since() {
    // Tumbling windows of 10 ms, lateness 100 ms, bound 0. Keys 0, 1, 2
    // put records in [0, 10), which fires at 15; a checkpoint there, a
    // crash, a restore; then the three keys' records into [0, 10) again,
    // in one batch (one after another in the same window: the operator
    // takes the second and third in a run), and a record at 30 that
    // passes the window's end again: it fires again for all three keys.
    let at = [(0u8, 0i64), (1, 1), (2, 2), (0, 15), (0, 3), (1, 4), (2, 5), (0, 30)];
    let input: Vec<Ev> = at.iter().enumerate().map(|(i, &(key, ts))| Ev { key, ts, value: 1, seq: i as u32 }).collect();
    let kind = Kind::Tumbling { size: 10, offset: 0 };
    let want = naive_with_restores(&input, 0, 100, kind, &[4]);
    for key in 0..3u8 {
        assert_eq!(
            want.firings.iter().filter(|f| f.0 == key && f.1 == 0).count(),
            2,
            "the model fires [0, 10) of key {key} again: {:?}",
            want.firings
        );
    }
    // As fast as it goes after the restore: the rest arrives in one batch
    // of four.
    let c = Case { input, bound: 0, lateness: 100, kind, partitions: 1 };
    let got = crashed_after_checkpoint_at(&c, 4, 1e9);
    assert_eq!(got, want.firings);
}
