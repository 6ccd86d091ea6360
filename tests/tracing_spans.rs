//! Tracing spans a user's subscriber sees: each checkpoint (with its
//! kind), the wait for every task's part, each task's export (with job,
//! operator, instance, checkpoint id, alignment and pause), the manifest,
//! the commits and each transaction's commit; and a restore.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use weibo::Job;
use weibo::sinks::TxnFileSink;
use weibo::sources::Generator;

/// A span as the subscriber saw it open: its name, fields and parent's name.
type Seen = (String, BTreeMap<String, String>, Option<String>);

struct Recorder(Arc<Mutex<Vec<Seen>>>, Arc<Mutex<Vec<BTreeMap<String, String>>>>);

struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        attrs.record(&mut fields);
        let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.name().to_string());
        self.0.lock().unwrap().push((attrs.metadata().name().to_string(), fields.0, parent));
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        event.record(&mut fields);
        self.1.lock().unwrap().push(fields.0);
    }
}

/// Maxima of four keys over `numbers`, on two instances, into an
/// exactly-once file sink.
fn job(name: &str, dir: &std::path::Path, out: &std::path::Path, numbers: Generator<u64>) -> Job {
    let job = Job::new(name).with_checkpoints(dir, Duration::from_secs(3600)).with_max_key_groups(16);
    job.source(numbers)
        .name("numbers")
        .key_by(|x: &u64| x % 4)
        .with_partitions(2)
        .reduce(|a, b| a.max(b))
        .uid("maxima")
        .sink_exactly_once(TxnFileSink::json_lines(out))
        .uid("files");
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_restores_and_commits_open_spans_with_their_fields() {
    let (seen, events) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(Recorder(seen.clone(), events.clone())),
    )
    .unwrap();
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let report = job("traced", dir.path(), out.path(), Generator::new(2_000, |i| i)).run().await.unwrap();
    // The sink's transactions are counted too.
    let files = report.metrics.sinks.iter().find(|s| s.id == "files").expect("the sink's counters");
    assert!(files.committed >= 1 && files.failed == 0, "{files:?}");
    // Started again, it restores the final checkpoint; its metrics say
    // what the restore read and where the source is.
    let again = job("traced", dir.path(), out.path(), Generator::new(2_000, |i| i)).spawn().unwrap();
    weibo_tests::until_ended(&again).await;
    let text = again.prometheus_metrics();
    assert!(text.contains("# TYPE weibo_restore_entries gauge"), "{text}");
    assert!(text.contains(r#"weibo_source_position{job="traced",source="numbers",partition="0"} 2000"#), "{text}");
    again.wait().await.unwrap();

    let seen = seen.lock().unwrap().clone();
    let named = |name: &str| seen.iter().filter(|(n, _, _)| n == name).cloned().collect::<Vec<_>>();
    let field = |s: &Seen, f: &str| s.1.get(f).cloned().unwrap_or_default();

    let checkpoints = named("checkpoint");
    let last = checkpoints.iter().find(|c| field(c, "kind") == "\"final\"").expect("the final checkpoint's span");
    assert_eq!(field(last, "job"), "traced");
    let id = field(last, "checkpoint");
    assert!(id.parse::<u64>().is_ok(), "{last:?}");
    for (child, parent) in [
        ("checkpoint.acknowledge", "checkpoint"),
        ("checkpoint.manifest", "checkpoint"),
        ("checkpoint.commit", "checkpoint"),
    ] {
        let spans = named(child);
        assert!(!spans.is_empty(), "no `{child}` span: {seen:?}");
        assert!(spans.iter().all(|s| s.2.as_deref() == Some(parent)), "`{child}` opens inside `{parent}`: {spans:?}");
    }
    // Each keyed instance's part of the final checkpoint.
    let exports: Vec<Seen> = named("checkpoint.export")
        .into_iter()
        .filter(|e| field(e, "checkpoint") == id && field(e, "operator") == "maxima")
        .collect();
    let instances: std::collections::BTreeSet<String> = exports.iter().map(|e| field(e, "instance")).collect();
    assert_eq!(instances, ["0".to_string(), "1".to_string()].into(), "{exports:?}");
    assert!(
        exports
            .iter()
            .all(|e| field(e, "job") == "traced" && e.1.contains_key("alignment_ms") && e.1.contains_key("pause_ms"))
    );
    let commits = named("transaction.commit");
    assert!(
        commits.iter().any(|c| field(c, "sink") == "files" && c.2.as_deref() == Some("checkpoint.commit")),
        "{commits:?}"
    );
    let restores = named("restore");
    assert_eq!(restores.len(), 1, "{restores:?}");
    assert_eq!((field(&restores[0], "job"), field(&restores[0], "checkpoint")), ("traced".to_string(), id));
    // The restore's progress: every entry its files hold was read.
    let events = events.lock().unwrap().clone();
    let restored =
        events.iter().find(|e| e.get("message").is_some_and(|m| m == "restored")).expect("a `restored` line");
    let (entries, of) = (restored["entries"].parse::<u64>().unwrap(), restored["of"].parse::<u64>().unwrap());
    assert_eq!(entries, of, "{restored:?}");
    assert!(text.contains(&format!(r#"weibo_restore_entries{{job="traced"}} {entries}"#)), "{text}");
    assert!(entries >= 4, "the four keys' maxima at least: {restored:?}");
}

/// Restored from a savepoint, an exactly-once sink discards what its
/// instances had written after it (the epochs that follow are processed
/// again), and the job's metrics count those transactions as aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_counts_the_transactions_it_aborted() {
    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let slow = |dir: &std::path::Path, out: &std::path::Path| {
        job("aborting", dir, out, Generator::new(u64::MAX, |i| i).with_rate(20_000.0))
    };
    let handle = slow(dir.path(), out.path()).spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let savepoint = handle.savepoint("before").await.unwrap();
    // Both instances write into the epoch after the savepoint, then the
    // process dies.
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle.abort();
    let restored = slow(dir.path(), out.path()).restore_from(&savepoint).spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let files = restored.metrics().sinks.into_iter().find(|s| s.id == "files").expect("the sink's counters");
    assert_eq!(files.aborted, 2, "one open epoch per instance: {files:?}");
    assert!(
        restored
            .prometheus_metrics()
            .contains(r#"weibo_sink_transactions_aborted_total{job="aborting",sink="files"} 2"#)
    );
    restored.cancel().await.unwrap();
}
