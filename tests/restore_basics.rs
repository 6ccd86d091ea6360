//! Checkpoints and restore within one process: a job is stopped after some
//! checkpoints completed, a new job restores and runs to the end, and its
//! final per-key state equals a run that was never stopped, also with
//! another partition count; a stopped job leaves a last checkpoint; the
//! newest checkpoint damaged falls back to the one before; another
//! pipeline is refused.

use std::time::Duration;

use weibo::Job;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo_tests::restore::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_job_ends_with_the_same_state_as_one_never_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let last = run_then_stop(dir.path(), 2, 3).await;
    assert!(last >= 3);
    let (got, read) = restore_and_finish(dir.path(), 2).await;
    assert_eq!(got, expected(), "no event lost or counted twice in the state");
    assert!(read < EVENTS, "the sources resumed at their checkpointed positions (read {read})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_job_leaves_a_last_checkpoint_and_nothing_runs_after_stop_returns() {
    let dir = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let handle = job(dir.path(), 2, 3_000.0, &out).spawn().unwrap();
    while handle.last_checkpoint().is_none_or(|n| n < 2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = handle.last_checkpoint().unwrap();
    handle.stop().await.unwrap();
    let newest = weibo::checkpoint::complete_checkpoints(dir.path()).iter().map(|(n, _)| *n).max().unwrap();
    assert!(newest > before, "stop took a checkpoint of its own ({newest} after {before})");
    let seen = out.values().len();
    assert!((seen as u64) < EVENTS, "stopped before the end of input");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(out.values().len(), seen, "nothing runs after stop returned");
    let listed: Vec<_> = weibo::checkpoint::complete_checkpoints(dir.path()).iter().map(|(n, _)| *n).collect();
    assert_eq!(listed.iter().max(), Some(&newest), "no checkpoint after stop returned");
    let (got, _) = restore_and_finish(dir.path(), 2).await;
    assert_eq!(got, expected(), "the job goes on from the last checkpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_restores_with_another_partition_count() {
    let dir = tempfile::tempdir().unwrap();
    run_then_stop(dir.path(), 2, 2).await;
    let (got, _) = restore_and_finish(dir.path(), 3).await;
    assert_eq!(got, expected(), "key groups moved to other workers with their state");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_newest_checkpoint_falls_back_to_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let last = run_then_stop(dir.path(), 2, 3).await;
    let newest = weibo::checkpoint::complete_checkpoints(dir.path());
    assert_eq!(newest[0].0, last);
    // Flip a byte in one of the state files it wrote (in `shared/`, named
    // after the checkpoint that wrote them, then the run).
    let infix = format!("-{last:020}-");
    let file = std::fs::read_dir(dir.path().join("shared"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains(&infix))
        .unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xFF;
    std::fs::write(&file, bytes).unwrap();
    let (got, _) = restore_and_finish(dir.path(), 2).await;
    assert_eq!(got, expected());
}

#[test]
fn restoring_a_pipeline_without_the_operator_of_its_state_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    weibo::testing::block_on(async { run_then_stop(dir.path(), 1, 1).await });
    let other = Job::new("sums").restore_from(dir.path()).with_max_key_groups(16);
    other
        .source(Generator::new(10, |i| i))
        .name("events")
        .key_by(|x: &u64| *x)
        .reduce(|a, b| a + b)
        .sink(CollectSink::new());
    let err = weibo::testing::block_on(other.run()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("the state (accumulator) of operator `sums`")
            && text.contains("allow_unrestored_state")
            && text.contains("chk-"),
        "{text}"
    );
}
