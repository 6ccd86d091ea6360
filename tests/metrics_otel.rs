//! The job's instruments through OpenTelemetry: a job given a meter
//! (`Job::with_meter`) registers observable instruments with it, and a
//! meter provider's reader collects the values the job's own snapshot has,
//! with the book's names, units and attributes.

use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use weibo::Job;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;

/// The value a collection holds for instrument `name` at the data point
/// whose attribute `key` is `value`, with its unit.
fn collected(exporter: &InMemoryMetricExporter, name: &str, key: &str, value: &str) -> Option<(f64, String)> {
    let all = exporter.get_finished_metrics().unwrap();
    let last = all.last()?;
    for scope in last.scope_metrics() {
        for m in scope.metrics().filter(|m| m.name() == name) {
            let has = |attrs: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
                for kv in attrs {
                    if kv.key.as_str() == key && kv.value.as_str() == value {
                        return true;
                    }
                }
                false
            };
            #[expect(clippy::cast_precision_loss)]
            let found = match m.data() {
                AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                    sum.data_points().find(|p| has(&mut p.attributes())).map(|p| p.value() as f64)
                }
                AggregatedMetrics::F64(MetricData::Sum(sum)) => {
                    sum.data_points().find(|p| has(&mut p.attributes())).map(|p| p.value())
                }
                AggregatedMetrics::F64(MetricData::Gauge(gauge)) => {
                    gauge.data_points().find(|p| has(&mut p.attributes())).map(|p| p.value())
                }
                _ => None,
            };
            if let Some(v) = found {
                return Some((v, m.unit().to_string()));
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meter_provider_collects_what_the_job_counted() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder().with_reader(PeriodicReader::builder(exporter.clone()).build()).build();
    let dir = tempfile::tempdir().unwrap();
    let job =
        Job::new("metered").with_checkpoints(dir.path(), Duration::from_secs(3600)).with_meter(provider.meter("weibo"));
    job.source(Generator::new(5_000, |i| i))
        .name("numbers")
        .key_by(|x: &u64| x % 4)
        .reduce(|a, b| a + b)
        .name("sums")
        .sink(CollectSink::new());
    let handle = job.spawn().unwrap();
    // Ended, its counters are final: a collection now has them exactly.
    weibo_tests::until_ended(&handle).await;
    let snapshot = handle.metrics();
    provider.force_flush().unwrap();
    let (read, unit) = collected(&exporter, "weibo.operator.records_out", "operator", "numbers").unwrap();
    #[expect(clippy::cast_precision_loss)]
    let want = snapshot.operator("numbers").unwrap().records_out as f64;
    assert_eq!((read, unit.as_str()), (want, "{record}"));
    let (summed, _) = collected(&exporter, "weibo.operator.records_in", "operator", "sums").unwrap();
    assert_eq!(summed, 5_000.0);
    let (completed, _) = collected(&exporter, "weibo.checkpoint.completed", "job", "metered").unwrap();
    assert!(completed >= 1.0, "the final checkpoint");
    let blocked = snapshot.edges.iter().map(|e| e.blocked.as_secs_f64()).sum::<f64>();
    let edge = &snapshot.edges[0];
    let (first_blocked, unit) =
        collected(&exporter, "weibo.edge.blocked", "edge", &format!("{} -> {}", edge.from, edge.to)).unwrap();
    assert_eq!((first_blocked, unit.as_str()), (edge.blocked.as_secs_f64(), "s"));
    assert!(first_blocked <= blocked);
    handle.wait().await.unwrap();
    provider.shutdown().unwrap();
}
