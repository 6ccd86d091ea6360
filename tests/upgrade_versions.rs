//! Upgrades of a state's meaning: `.state_version(n)` declares the
//! version of an operator's state. A restore into another version than
//! the savepoint's migrates every value of the operator's user-defined
//! states through the job's migration, even when their layout did not
//! change, or is refused; a savepoint of a later version is refused; the
//! state of an operator whose version did not change restores as is,
//! whatever migrations the job offers for its type.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weibo::Job;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;

const EVENTS: u64 = 6_000;

fn event(i: u64) -> (u64, u64) {
    (i % 10, i % 97)
}

/// What a job emits: (key, total or count).
type Out = CollectSink<(u64, u64)>;

/// The job at version `version` of `totals`: per key, the total of the
/// values times `unit` (`totals`), and the number of values (`count`, at
/// version 1 always). Both keep a `u64`.
fn job(job: Job, version: u32, unit: u64, rate: Option<f64>) -> (Job, Out, Out) {
    let (totals, counts) = (CollectSink::new(), CollectSink::new());
    let source = Generator::new(EVENTS, event);
    let source = match rate {
        Some(r) => source.with_rate(r),
        None => source,
    };
    let events = job.source(source).uid("events").key_by(|e: &(u64, u64)| e.0);
    events.fold(|| 0u64, move |t, e| *t += e.1 * unit).uid("totals").state_version(version).sink(totals.clone());
    events.fold(|| 0u64, |n, _| *n += 1).uid("count").sink(counts.clone());
    (job, totals, counts)
}

fn new_job(dir: &Path) -> Job {
    Job::new("totals").with_checkpoints(dir, Duration::from_secs(3600)).with_max_key_groups(16)
}

/// Version `version` of the job (totals in `unit`s) run over part of the
/// input, then a savepoint.
fn savepoint_of(dir: &Path, version: u32, unit: u64) -> PathBuf {
    let (job, _, _) = job(new_job(dir), version, unit, Some(6_000.0));
    weibo_tests::savepoint_midway(job, Duration::from_millis(300))
}

/// The last value per key.
fn finals(out: Vec<(u64, u64)>) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    for (k, v) in out {
        let e = m.entry(k).or_insert(0);
        *e = v.max(*e);
    }
    m
}

/// An uninterrupted run of a job.
fn uninterrupted(version: u32, unit: u64) -> (BTreeMap<u64, u64>, BTreeMap<u64, u64>) {
    let dir = tempfile::tempdir().unwrap();
    let (job, totals, counts) = job(new_job(dir.path()), version, unit, None);
    job.run_blocking().unwrap();
    (finals(totals.values()), finals(counts.values()))
}

#[test]
fn a_bumped_version_with_the_same_layout_restores_through_the_operators_migration_and_leaves_others_alone() {
    let dir = tempfile::tempdir().unwrap();
    // Version 1 keeps cents; version 2 tenths of cents.
    let savepoint = savepoint_of(dir.path(), 1, 100);
    let restored = new_job(&dir.path().join("v2"))
        .restore_from(&savepoint)
        .with_state_migration_for("totals", |cents: u64| cents * 10)
        // For any operator's u64: must not touch `count`, whose version did not change.
        .with_state_migration(|n: u64| n + 1_000_000);
    let (restored, totals, counts) = job(restored, 2, 1_000, None);
    let report = restored.run_blocking().unwrap();
    let (want_totals, want_counts) = uninterrupted(2, 1_000);
    assert_eq!(finals(totals.values()), want_totals, "every total migrated once, then kept in tenths of cents");
    assert_eq!(finals(counts.values()), want_counts, "the counts restored as they were");
    assert_eq!(report.migrated.len(), 1, "one state migrated: {:?}", report.migrated);
    assert_eq!(report.migrated[0].operator, "totals");
    assert_eq!(report.migrated[0].entries, 10, "one per key");
    // The restored job's checkpoints record version 2.
    let last = weibo::checkpoint::complete_checkpoints(&dir.path().join("v2"))
        .into_iter()
        .next()
        .expect("a final checkpoint")
        .1;
    let (inspection, _) = weibo::checkpoint::inspect::Inspection::open(&last).unwrap();
    let version = |id: &str| inspection.operators.iter().find(|o| o.id == id).map(|o| o.state_version);
    assert_eq!((version("totals"), version("count")), (Some(2), Some(1)));
}

#[test]
fn a_bumped_version_without_a_migration_is_refused_naming_the_operator_the_state_and_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let savepoint = savepoint_of(dir.path(), 1, 100);
    // A migration for the other operator does not serve `totals`.
    let restored =
        new_job(&dir.path().join("v2")).restore_from(&savepoint).with_state_migration_for("count", |n: u64| n * 10);
    let (restored, totals, counts) = job(restored, 2, 1_000, None);
    let err = restored.run_blocking().unwrap_err().to_string();
    assert!(err.contains("`totals`") && err.contains("version 1") && err.contains("version 2"), "{err}");
    assert!(err.contains("state `accumulator`"), "{err}");
    assert!(totals.values().is_empty() && counts.values().is_empty(), "nothing ran");
}

#[test]
fn a_savepoint_of_a_later_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let savepoint = savepoint_of(dir.path(), 3, 100);
    let restored = new_job(&dir.path().join("v2")).restore_from(&savepoint);
    let (restored, totals, _) = job(restored, 2, 100, None);
    let err = restored.run_blocking().unwrap_err().to_string();
    assert!(err.contains("`totals`") && err.contains("version 3") && err.contains("version 2"), "{err}");
    assert!(totals.values().is_empty(), "nothing ran");
}

#[test]
fn an_unchanged_version_restores_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let savepoint = savepoint_of(dir.path(), 2, 100);
    let restored = new_job(&dir.path().join("v2")).restore_from(&savepoint);
    let (restored, totals, counts) = job(restored, 2, 100, None);
    let report = restored.run_blocking().unwrap();
    let (want_totals, want_counts) = uninterrupted(2, 100);
    assert_eq!(finals(totals.values()), want_totals);
    assert_eq!(finals(counts.values()), want_counts);
    assert!(report.migrated.is_empty(), "{:?}", report.migrated);
}

#[test]
fn the_state_version_is_a_wiring_error_on_an_operator_without_state_and_when_zero() {
    let stateless = Job::new("stateless");
    stateless.source(Generator::new(3, |i| i)).map(|x: u64| x + 1).state_version(2).sink(CollectSink::new());
    let err = stateless.run_blocking().unwrap_err().to_string();
    assert!(err.contains("keeps no state"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let (zero, _, _) = job(new_job(dir.path()), 0, 100, None);
    let err = zero.run_blocking().unwrap_err().to_string();
    assert!(err.contains("state version 0"), "{err}");
}

#[test]
fn a_savepoint_transformed_offline_into_the_new_meaning_restores_without_a_migration() {
    use weibo::checkpoint::processor::{SavepointReader, SavepointWriter};
    let dir = tempfile::tempdir().unwrap();
    let savepoint = savepoint_of(dir.path(), 1, 100);
    let reader = SavepointReader::open(&savepoint).unwrap();
    let cents: Vec<(u64, u64)> = reader.entries("totals", "accumulator").unwrap();
    assert!(!cents.is_empty());
    let mut writer = SavepointWriter::from(&reader);
    writer.set_state("totals", "accumulator", cents.iter().map(|(k, c)| (*k, c * 10))).unwrap();
    writer.set_state_version("totals", 2).unwrap();
    assert!(writer.set_state_version("nobody", 2).is_err(), "an operator the savepoint does not have");
    let rewritten = writer.write(dir.path().join("rewritten")).unwrap();
    let restored = new_job(&dir.path().join("v2")).restore_from(&rewritten);
    let (restored, totals, counts) = job(restored, 2, 1_000, None);
    let report = restored.run_blocking().unwrap();
    assert!(report.migrated.is_empty(), "already of version 2: {:?}", report.migrated);
    let (want_totals, want_counts) = uninterrupted(2, 1_000);
    assert_eq!(finals(totals.values()), want_totals);
    assert_eq!(finals(counts.values()), want_counts);
}
