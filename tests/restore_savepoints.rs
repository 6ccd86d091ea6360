//! Savepoints: a named savepoint outlives retention and restores with
//! another partition count; savepoints need checkpoints and a plain name.

use std::time::Duration;

use weibo::Job;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo_tests::restore::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_savepoint_outlives_retention_and_restores_with_another_partition_count() {
    let dir = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let handle = job(dir.path(), 2, 3_000.0, &out).with_retained_checkpoints(1).spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let savepoint = handle.savepoint("before-rescale").await.unwrap();
    assert_eq!(savepoint, dir.path().join("savepoints").join("before-rescale"));
    let err = handle.savepoint("before-rescale").await.unwrap_err();
    assert!(err.to_string().contains("exists already"), "{err}");
    let at = handle.last_checkpoint().unwrap();
    // Let retention (keep 1) go past the savepoint's checkpoint.
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if handle.last_checkpoint().is_some_and(|n| n >= at.get() + 2) {
            break;
        }
    }
    handle.abort();
    assert_eq!(weibo::checkpoint::complete_checkpoints(dir.path()).len(), 1, "retention kept one checkpoint");
    assert!(savepoint.join("MANIFEST").is_file(), "but not at the savepoint's expense");

    // Restore the savepoint into a job with 3 partitions (and a fresh checkpoint directory).
    let other = tempfile::tempdir().unwrap();
    let out = CollectSink::new();
    let restored = job(other.path(), 3, 1e9, &out).restore_from(&savepoint);
    let report = restored.run().await.unwrap();
    assert_eq!(finals(out.values()), expected());
    assert!(report.metrics.operator("events").unwrap().records_out < EVENTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoints_need_checkpoints_and_a_plain_name() {
    let plain = Job::new("plain");
    plain.source(Generator::new(1_000_000, |i| i).with_rate(1000.0)).sink(CollectSink::new());
    let handle = plain.spawn().unwrap();
    let err = handle.savepoint("x").await.unwrap_err();
    assert!(err.to_string().contains("with_checkpoints"), "{err}");
    let err = handle.savepoint("../escape").await.unwrap_err();
    assert!(err.to_string().contains("savepoint name"), "{err}");
    handle.abort();
}
