//! Upgrades by operator id: version 1 of a pipeline (a keyed reduce, a
//! tumbling window with lateness, a session window, a keyed process with
//! timers and an exactly-once file sink, each with a uid) runs on part of
//! its input and takes a savepoint; a version 2 restores it and finishes.
//! Where version 2's logic is defined over the whole input, what both
//! versions emitted together is what one uninterrupted run of version 2
//! emits (as sets: a record emitted between the savepoint and the stop is
//! emitted again after the restore), and the exactly-once sink's committed
//! lines are exactly the uninterrupted run's. Changes that cannot restore
//! are refused before anything runs, naming the operator.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weibo::sinks::{CollectSink, TxnFileSink};
use weibo::sources::Generator;
use weibo::time::WatermarkStrategy;
use weibo::window::{Count, Session, Tumbling};
use weibo::{Job, KeyedContext, on_error};

const EVENTS: u64 = 12_000;

/// Event `i`: (key, event time in ms), 10 ms apart with a pause of 1 s
/// after every 1,000 events, so that sessions close.
fn event(i: u64) -> (u64, u64) {
    (i % 10, i * 10 + (i / 1000) * 1000)
}

/// What may differ between the versions.
#[derive(Clone, Copy, Default)]
struct Version {
    /// Stateless operators: version 1 tags events with a `map`; version 2
    /// may drop it and add a `filter` and a `map` of its own.
    other_stateless: bool,
    /// Every operator renamed (uids kept).
    renamed: bool,
    /// Partitions of the keyed operators.
    partitions: usize,
    /// Without the session window.
    no_sessions: bool,
    /// With a new stateful operator (a count per key, uid `counts`).
    counts: bool,
    /// The reduce keyed by a `u32` instead of a `u64`.
    key_u32: bool,
    /// The reduce (uid `sums`) replaced by a fold under the same uid.
    sums_as_fold: bool,
    /// Without uids (so the ids are the names).
    no_uids: bool,
    /// State in fjall (in this directory) instead of memory.
    fjall: Option<&'static str>,
}

struct Outputs {
    sums: CollectSink<(u64, u64)>,
    windows: CollectSink<weibo::window::WindowResult<u64, u64>>,
    sessions: CollectSink<weibo::window::WindowResult<u64, (u64, u64)>>,
    timeouts: CollectSink<(u64, u64)>,
    counts: CollectSink<(u64, u64)>,
}

impl Outputs {
    fn new() -> Self {
        Self {
            sums: CollectSink::new(),
            windows: CollectSink::new(),
            sessions: CollectSink::new(),
            timeouts: CollectSink::new(),
            counts: CollectSink::new(),
        }
    }
}

/// Every output as a set, version 2's new operator aside.
#[derive(Debug, PartialEq, Default)]
struct Emitted {
    sums: BTreeSet<(u64, u64)>,
    windows: BTreeSet<(u64, i64, u64)>,
    sessions: BTreeSet<(u64, i64, i64, u64)>,
    timeouts: BTreeSet<(u64, u64)>,
}

impl Emitted {
    fn of(out: &Outputs) -> Self {
        Self {
            sums: out.sums.values().into_iter().collect(),
            windows: out.windows.values().into_iter().map(|r| (r.key, r.window.start, r.value)).collect(),
            sessions: out
                .sessions
                .values()
                .into_iter()
                .map(|r| (r.key, r.window.start, r.window.end, r.value.1))
                .collect(),
            timeouts: out.timeouts.values().into_iter().collect(),
        }
    }

    fn extend(&mut self, other: Emitted) {
        self.sums.extend(other.sums);
        self.windows.extend(other.windows);
        self.sessions.extend(other.sessions);
        self.timeouts.extend(other.timeouts);
    }
}

fn id<S>(s: S, v: Version, uid: &str, f: impl FnOnce(S, &str) -> S) -> S {
    if v.no_uids { s } else { f(s, uid) }
}

/// Builds version `v` into a job checkpointing into `dir` (rarely: a
/// savepoint is taken on request), its exactly-once sink writing to
/// `archive`.
fn pipeline(dir: &Path, archive: &Path, v: Version, rate: Option<f64>, out: &Outputs) -> Job {
    let mut job = Job::new("upgrades").with_checkpoints(dir, Duration::from_secs(3600)).with_max_key_groups(32);
    if let Some(state) = v.fjall {
        let backend = weibo::state::FjallBackend::open(dir.with_file_name(state)).unwrap();
        job = job.with_state_backend(backend);
    }
    let name = |base: &str| if v.renamed { format!("{base}-v2") } else { base.to_string() };
    let mut generator = Generator::new(EVENTS, event);
    if let Some(rate) = rate {
        generator = generator.with_rate(rate);
    }
    let source = id(job.source(generator), v, "events", |s, u| s.uid(u));
    let mut events =
        source.name(&name("events")).with_timestamps(|e: &(u64, u64)| e.1 as i64, WatermarkStrategy::monotonous());
    if v.other_stateless {
        events =
            events.filter(|_: &(u64, u64)| true).name(&name("keep-all")).map(|e: (u64, u64)| e).name(&name("same"));
    } else {
        events = events.map(|e: (u64, u64)| e).name(&name("tag"));
    }
    let p = v.partitions.max(1);
    if v.key_u32 {
        let sums = events.key_by(|e: &(u64, u64)| e.0 as u32).with_partitions(p).reduce(|a, b| (a.0, a.1 + b.1));
        id(sums.name(&name("sums")), v, "sums", |s, u| s.uid(u)).sink(out.sums.clone());
    } else if v.sums_as_fold {
        let sums = events.key_by(|e: &(u64, u64)| e.0).with_partitions(p).fold(|| 0u64, |n, e| *n += e.1);
        let sums = id(sums.name(&name("sums")), v, "sums", |s, u| s.uid(u));
        sums.map(|(k, n): (u64, u64)| (k, n)).sink(out.sums.clone());
    } else {
        let sums = events.key_by(|e: &(u64, u64)| e.0).with_partitions(p).reduce(|a, b| (a.0, a.1 + b.1));
        let sums = id(sums.name(&name("sums")), v, "sums", |s, u| s.uid(u));
        sums.sink(out.sums.clone());
        let lines = sums.map(|(k, s): (u64, u64)| format!("{k}:{s}")).name(&name("line"));
        let sink = lines.sink_exactly_once(TxnFileSink::json_lines(archive)).name(&name("archive"));
        if !v.no_uids {
            let _ = sink.uid("archive");
        }
    }
    let keyed = events.key_by(|e: &(u64, u64)| e.0).with_partitions(p);
    let windows = keyed
        .window(Tumbling::of(Duration::from_secs(1)))
        .allowed_lateness(Duration::from_millis(500))
        .aggregate(Count)
        .name(&name("per-second"));
    id(windows, v, "per-second", |s, u| s.uid(u)).sink(out.windows.clone());
    if !v.no_sessions {
        let sessions = keyed
            .window(Session::with_gap(Duration::from_millis(500)))
            .reduce(|a, b| (a.0, a.1.max(b.1)))
            .name(&name("sessions"));
        id(sessions, v, "sessions", |s, u| s.uid(u)).sink(out.sessions.clone());
    }
    let timeouts = keyed
        .process_with_timers(
            on_error::Fail,
            |ctx: &mut KeyedContext<'_, u64, u64, (u64, u64)>, e: &(u64, u64)| {
                if ctx.state().is_none() {
                    ctx.register_timer(e.1 as i64 + 700);
                }
                *ctx.state().get_or_insert(0) += 1;
                Ok::<(), String>(())
            },
            |ctx, _time| {
                let key = *ctx.key();
                if let Some(n) = ctx.state().take() {
                    ctx.emit((key, n));
                }
                Ok(())
            },
        )
        .name(&name("timeouts"));
    id(timeouts, v, "timeouts", |s, u| s.uid(u)).sink(out.timeouts.clone());
    if v.counts {
        keyed.fold(|| 0u64, |n, _| *n += 1).uid("counts").sink(out.counts.clone());
    }
    job
}

/// The lines the exactly-once sink committed, sorted.
fn committed(archive: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    let Ok(entries) = std::fs::read_dir(archive) else { return lines };
    for e in entries {
        let path = e.unwrap().path();
        if path.is_file() && path.file_name().unwrap().to_string_lossy().starts_with("part-") {
            let text = std::fs::read_to_string(&path).unwrap();
            lines.extend(text.lines().map(str::to_string));
        }
    }
    lines.sort();
    lines
}

struct Run {
    root: tempfile::TempDir,
}

impl Run {
    fn new() -> Self {
        Self { root: tempfile::tempdir().unwrap() }
    }
    fn dir(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }
}

/// Runs version 1 over part of the input and takes a savepoint, then
/// stops; returns the savepoint and what version 1 emitted.
fn version_1(run: &Run) -> (PathBuf, Emitted) {
    let v1 = Version { partitions: 2, ..Version::default() };
    let out = Outputs::new();
    let job = pipeline(&run.dir("checkpoints"), &run.dir("archive"), v1, Some(5_000.0), &out);
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(500));
    let emitted = Emitted::of(&out);
    assert!(!emitted.sums.is_empty() && emitted.sums.len() < EVENTS as usize, "stopped in the middle");
    (savepoint, emitted)
}

/// Runs `v` over the whole input, never stopped: what it emits and commits.
fn uninterrupted(run: &Run, v: Version) -> (Emitted, Vec<String>) {
    let out = Outputs::new();
    let archive = run.dir("archive-uninterrupted");
    let job = pipeline(&run.dir("checkpoints-uninterrupted"), &archive, v, None, &out);
    weibo::testing::block_on(job.run()).unwrap();
    (Emitted::of(&out), committed(&archive))
}

/// Restores version `v` from `savepoint` and runs it to the end.
fn version_2(run: &Run, savepoint: &Path, v: Version, allow: bool) -> weibo::Result<(Outputs, weibo::JobReport)> {
    let out = Outputs::new();
    let mut job = pipeline(&run.dir("checkpoints-v2"), &run.dir("archive"), v, None, &out).restore_from(savepoint);
    if allow {
        job = job.allow_unrestored_state();
    }
    let report = weibo::testing::block_on(job.run())?;
    Ok((out, report))
}

/// Version 2 restored from version 1's savepoint: together they emit what
/// version 2 emits uninterrupted, and commit exactly its lines.
fn upgrade_goes_on(v: Version) {
    let run = Run::new();
    let (savepoint, mut emitted) = version_1(&run);
    let (out, _) = version_2(&run, &savepoint, v, false).unwrap();
    emitted.extend(Emitted::of(&out));
    let (expected, expected_lines) = uninterrupted(&run, v);
    assert_eq!(emitted, expected);
    assert_eq!(committed(&run.dir("archive")), expected_lines, "every line committed once");
}

#[test]
fn stateless_operators_removed_and_added_and_operators_renamed_with_their_ids_restore() {
    upgrade_goes_on(Version { other_stateless: true, renamed: true, partitions: 3, ..Version::default() });
}

#[test]
fn the_same_pipeline_restores_with_its_state_on_disk() {
    upgrade_goes_on(Version { fjall: Some("fjall-state"), partitions: 2, ..Version::default() });
}

#[test]
fn the_same_pipeline_restores_on_one_partition() {
    upgrade_goes_on(Version { partitions: 1, ..Version::default() });
}

#[test]
fn a_new_stateful_operator_starts_empty_and_the_others_restore() {
    let run = Run::new();
    let (savepoint, mut emitted) = version_1(&run);
    let v2 = Version { counts: true, partitions: 2, ..Version::default() };
    let (out, report) = version_2(&run, &savepoint, v2, false).unwrap();
    emitted.extend(Emitted::of(&out));
    let read = report.metrics.operator("events").unwrap().records_out;
    assert!(read < EVENTS, "version 2 resumed");
    // The new operator counted only what version 2 read.
    let mut finals = std::collections::BTreeMap::new();
    for (k, n) in out.counts.values() {
        let last: &mut u64 = finals.entry(k).or_default();
        *last = (*last).max(n);
    }
    assert_eq!(finals.values().sum::<u64>(), read);
    let (expected, _) = uninterrupted(&run, v2);
    assert_eq!(emitted, expected);
}

#[test]
fn an_operator_removed_is_refused_naming_it_unless_its_state_may_be_dropped() {
    let run = Run::new();
    let (savepoint, mut emitted) = version_1(&run);
    let v2 = Version { no_sessions: true, partitions: 2, ..Version::default() };
    let err = version_2(&run, &savepoint, v2, false).err().expect("refused").to_string();
    assert!(err.contains("operator `sessions`") && err.contains("allow_unrestored_state"), "{err}");
    assert!(committed(&run.dir("archive")).len() < EVENTS as usize);
    let (out, _) = version_2(&run, &savepoint, v2, true).unwrap();
    emitted.extend(Emitted::of(&out));
    emitted.sessions.clear();
    let (expected, expected_lines) = uninterrupted(&run, v2);
    assert_eq!(emitted, expected);
    assert_eq!(committed(&run.dir("archive")), expected_lines);
}

#[test]
fn operators_without_uids_lose_their_state_when_renamed() {
    // Ids are names when there are no uids: renamed, nothing matches.
    let run = Run::new();
    let out = Outputs::new();
    let v1 = Version { no_uids: true, partitions: 2, ..Version::default() };
    let job = pipeline(&run.dir("checkpoints"), &run.dir("archive"), v1, Some(5_000.0), &out);
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(300));
    let err = version_2(&run, &savepoint, Version { renamed: true, ..v1 }, false).err().expect("refused").to_string();
    for id in ["sums", "per-second", "sessions", "timeouts", "events", "archive"] {
        assert!(err.contains(&format!("`{id}`")), "{id} in {err}");
    }
    for kind in ["positions of source", "pending commits of exactly-once sink", "the state (value) of operator"] {
        assert!(err.contains(kind), "{kind} in {err}");
    }
}

#[test]
fn a_changed_key_type_or_operator_kind_is_refused_before_anything_runs() {
    let run = Run::new();
    let (savepoint, _) = version_1(&run);
    let before = committed(&run.dir("archive"));
    for (v2, expected) in [
        (
            Version { key_u32: true, partitions: 2, ..Version::default() },
            "operator `sums` was keyed by `u64` and is keyed by `u32`",
        ),
        (
            Version { sums_as_fold: true, partitions: 2, ..Version::default() },
            "operator `sums` was a reduce and is a fold",
        ),
    ] {
        let out = Outputs::new();
        let job = pipeline(&run.dir("checkpoints-v2"), &run.dir("archive"), v2, None, &out).restore_from(&savepoint);
        let err = weibo::testing::block_on(job.run()).expect_err("refused").to_string();
        assert!(err.contains(expected), "{err}");
        // Even allowed to drop state, an incompatible operator is refused.
        let job = pipeline(&run.dir("checkpoints-v2"), &run.dir("archive"), v2, None, &Outputs::new())
            .restore_from(&savepoint)
            .allow_unrestored_state();
        assert!(weibo::testing::block_on(job.run()).is_err());
        assert!(Emitted::of(&out) == Emitted::default(), "nothing ran");
    }
    assert_eq!(committed(&run.dir("archive")), before, "nothing committed or discarded");
}

#[test]
fn ids_are_unique_and_stateful_operators_without_one_are_warned_about() {
    let job = Job::new("ids");
    let keyed = job.source(Generator::new(10, |i| i)).key_by(|x: &u64| *x);
    keyed.reduce(|a, b| a + b).uid("same").sink(CollectSink::new());
    keyed.fold(|| 0u64, |n, _| *n += 1).uid("same").sink(CollectSink::new());
    let err = job.plan().unwrap_err().to_string();
    assert!(err.contains("share the id `same`"), "{err}");

    let job = Job::new("warned");
    let keyed = job.source(Generator::new(10, |i| i)).key_by(|x: &u64| *x);
    keyed.reduce(|a, b| a + b).sink(CollectSink::new());
    keyed.fold(|| 0u64, |n, _| *n += 1).name("counts").sink(CollectSink::new());
    keyed.window(Tumbling::of(Duration::from_secs(1))).aggregate(Count).uid("per-second").sink(CollectSink::new());
    let plan = job.plan().unwrap();
    let warnings: Vec<&str> = plan.lines().filter(|l| l.contains("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{plan}");
    assert!(warnings[0].contains("reduce `reduce` keeps state under a generated id"), "{plan}");
}
