//! A job's `tracing` spans exported as OpenTelemetry traces: the
//! `tracing-opentelemetry` layer on the subscriber, the SDK's tracer with
//! an in-memory exporter. Checkpoint spans arrive with their fields as
//! attributes and their parents, in one trace per checkpoint.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use tracing_subscriber::layer::SubscriberExt as _;
use weibo::Job;
use weibo::sinks::TxnFileSink;
use weibo::sources::Generator;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_spans_reach_an_opentelemetry_exporter_with_their_fields_and_parents() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_span_processor(SimpleSpanProcessor::new(exporter.clone())).build();
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("weibo")));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let (dir, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let job = Job::new("traced-otel").with_checkpoints(dir.path(), Duration::from_secs(3600));
    job.source(Generator::new(1_000, |i| i))
        .key_by(|x: &u64| x % 4)
        .reduce(|a, b| a.max(b))
        .uid("maxima")
        .sink_exactly_once(TxnFileSink::json_lines(out.path()))
        .uid("files");
    job.run().await.unwrap();
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let attribute = |span: &opentelemetry_sdk::trace::SpanData, key: &str| {
        span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.to_string())
    };
    let checkpoint = spans
        .iter()
        .find(|s| s.name == "checkpoint" && attribute(s, "kind").as_deref() == Some("final"))
        .unwrap_or_else(|| {
            panic!("no final checkpoint span among {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>())
        });
    assert_eq!(attribute(checkpoint, "job").as_deref(), Some("traced-otel"));
    let trace = checkpoint.span_context.trace_id();
    for child in ["checkpoint.acknowledge", "checkpoint.manifest", "checkpoint.commit"] {
        let span = spans
            .iter()
            .find(|s| s.name == child && s.span_context.trace_id() == trace)
            .unwrap_or_else(|| panic!("no `{child}` span in the final checkpoint's trace"));
        assert_eq!(span.parent_span_id, checkpoint.span_context.span_id(), "`{child}` is the checkpoint's child");
    }
    let commit = spans.iter().find(|s| s.name == "transaction.commit").expect("a transaction's span");
    assert_eq!(attribute(commit, "sink").as_deref(), Some("files"));
}
