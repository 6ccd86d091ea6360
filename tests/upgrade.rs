//! A checkpoint written by an earlier build restores in this one: the
//! fixture `tests/fixtures/upgrade-442b4bc/` holds the checkpoints that
//! build (442b4bc, before the source tree was split into layers) took of
//! `upgrade_pipeline` in the middle of its input, and what the pipeline
//! had emitted when it stopped. Restored here and run to the end, every
//! output together with what was emitted before is what one uninterrupted
//! run of this build emits: nothing lost, nothing counted twice.
//!
//! The fixture was made by `weibo/examples/make_upgrade_fixture.rs` of
//! that build (its source is in the fixture's README). A build that moves
//! Weibo's own types must keep the names checkpoints record for them
//! (`codec::recorded_type_name`), or this test fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use weibo::Job;
use weibo::window::WindowResult;

use weibo_tests::upgrade_pipeline::{EVENTS, Outputs, pipeline};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upgrade-442b4bc")
}

/// What the earlier build's run had emitted when it stopped.
#[derive(Deserialize)]
struct Before {
    counts: Vec<(u64, u64)>,
    tumbling: Vec<WindowResult<u64, u64>>,
    sessions: Vec<WindowResult<u64, (u64, u64)>>,
    sizes: Vec<(u64, i64, u64)>,
    dead: Vec<weibo::DeadLetter<(u64, u64)>>,
}

/// Every output as a set (a record emitted again after the restore, by a
/// window that fired between the checkpoint and the stop, counts once).
#[derive(Debug, PartialEq)]
struct Emitted {
    counts: BTreeSet<(u64, u64)>,
    tumbling: BTreeSet<(u64, i64, u64)>,
    sessions: BTreeSet<(u64, i64, i64, u64, u64)>,
    sizes: BTreeSet<(u64, i64, u64)>,
    dead: BTreeSet<((u64, u64), u64)>,
}

impl Emitted {
    fn of(out: &Outputs) -> Self {
        Self::from_parts(
            out.counts.values(),
            out.tumbling.values(),
            out.sessions.values(),
            out.sizes.values(),
            out.dead.values(),
        )
    }

    fn from_parts(
        counts: Vec<(u64, u64)>,
        tumbling: Vec<WindowResult<u64, u64>>,
        sessions: Vec<WindowResult<u64, (u64, u64)>>,
        sizes: Vec<(u64, i64, u64)>,
        dead: Vec<weibo::DeadLetter<(u64, u64)>>,
    ) -> Self {
        Self {
            counts: counts.into_iter().collect(),
            tumbling: tumbling.into_iter().map(|r| (r.key, r.window.start, r.value)).collect(),
            sessions: sessions
                .into_iter()
                .map(|r| (r.key, r.window.start, r.window.end, r.value.0, r.value.1))
                .collect(),
            sizes: sizes.into_iter().collect(),
            dead: dead.into_iter().map(|d| (d.record, d.position.offset)).collect(),
        }
    }

    fn extend(&mut self, other: Emitted) {
        self.counts.extend(other.counts);
        self.tumbling.extend(other.tumbling);
        self.sessions.extend(other.sessions);
        self.sizes.extend(other.sizes);
        self.dead.extend(other.dead);
    }
}

#[test]
fn a_checkpoint_of_the_build_before_restores_and_the_job_goes_on_where_it_stopped() {
    // One run of this build, without interruption: what the job emits.
    let job = Job::new("upgrade");
    let reference = pipeline(&job, None);
    job.run_blocking().unwrap();
    let reference = Emitted::of(&reference);
    assert_eq!(reference.counts.len() as u64, EVENTS - reference.dead.len() as u64);

    // The earlier build's checkpoints, restored (the newest complete one).
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture().join("checkpoints"), dir.path());
    let job = Job::new("upgrade").restore_from(dir.path());
    let after = pipeline(&job, None);
    let report = job.run_blocking().unwrap();
    let read = report.metrics.operator("generator").unwrap().records_out;
    assert!(read > 0 && read < EVENTS, "the source resumed mid-input: it read {read} of {EVENTS} events");

    let before: Before =
        serde_json::from_slice(&std::fs::read(fixture().join("emitted-before-stop.json")).unwrap()).unwrap();
    assert!(!before.counts.is_empty(), "the fixture's run emitted before it stopped");
    let mut emitted = Emitted::from_parts(before.counts, before.tumbling, before.sessions, before.sizes, before.dead);
    emitted.extend(Emitted::of(&after));
    assert_eq!(emitted.counts, reference.counts, "running counts: each value once, from 1 to the end");
    assert_eq!(emitted.tumbling, reference.tumbling, "tumbling windows with lateness");
    assert_eq!(emitted.sessions, reference.sessions, "sessions");
    assert_eq!(emitted.sizes, reference.sizes, "windows that keep their elements");
    assert_eq!(emitted.dead, reference.dead, "dead letters");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
