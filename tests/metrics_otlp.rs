//! A job's instruments exported over OTLP (`Job::with_otlp`, HTTP with
//! protobuf) to a receiver started here, which decodes every request with
//! the OpenTelemetry protocol's own types: the exports carry the job's
//! name as service, the instruments by name and unit, and the last one,
//! sent when the job's handle is dropped, the job's final counts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as Number;
use prost::Message as _;
use weibo::Job;
use weibo::sinks::Blackhole;
use weibo::sources::Generator;

type Received = Arc<Mutex<Vec<(String, ExportMetricsServiceRequest)>>>;

/// An OTLP/HTTP receiver on a free loopback port: keeps every request's
/// path and decoded body, answers 200.
async fn receiver() -> (std::net::SocketAddr, Received) {
    let received: Received = Arc::default();
    let keep = received.clone();
    let addr = weibo_tests::http_server(move |message| {
        let path = message.first_line.split(' ').nth(1).unwrap_or_default().to_string();
        let request = ExportMetricsServiceRequest::decode(&message.body[..]).expect("an OTLP metrics request");
        keep.lock().unwrap().push((path, request));
        let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        std::future::ready(Some(answer.to_string()))
    })
    .await;
    (addr, received)
}

/// The value of `metric` with attribute `key` = `value` in `request`, if
/// it is there.
fn point(request: &ExportMetricsServiceRequest, metric: &str, key: &str, value: &str) -> Option<(f64, String)> {
    for resource in &request.resource_metrics {
        for scope in &resource.scope_metrics {
            for m in scope.metrics.iter().filter(|m| m.name == metric) {
                let points = match &m.data {
                    Some(Data::Sum(s)) => &s.data_points,
                    Some(Data::Gauge(g)) => &g.data_points,
                    _ => continue,
                };
                for p in points {
                    let matches = p.attributes.iter().any(|a| {
                        a.key == key
                            && matches!(a.value.as_ref().and_then(|v| v.value.as_ref()), Some(AnyValue::StringValue(s)) if s == value)
                    });
                    if matches {
                        #[expect(clippy::cast_precision_loss)]
                        let v = match p.value {
                            Some(Number::AsInt(i)) => i as f64,
                            Some(Number::AsDouble(d)) => d,
                            None => continue,
                        };
                        return Some((v, m.unit.clone()));
                    }
                }
            }
        }
    }
    None
}

fn service(request: &ExportMetricsServiceRequest) -> Option<String> {
    request.resource_metrics.iter().flat_map(|r| r.resource.iter()).flat_map(|r| r.attributes.iter()).find_map(|a| {
        match (a.key.as_str(), a.value.as_ref().and_then(|v| v.value.as_ref())) {
            ("service.name", Some(AnyValue::StringValue(s))) => Some(s.clone()),
            _ => None,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_instruments_reach_an_otlp_receiver_and_the_last_export_has_the_final_counts() {
    let (addr, received) = receiver().await;
    // ANCHOR: with_otlp
    let endpoint = format!("http://{addr}/v1/metrics"); // a collector's: http://127.0.0.1:4318/v1/metrics
    let job = Job::new("exported").with_otlp(endpoint, Duration::from_millis(200));
    // ANCHOR_END: with_otlp
    job.source(Generator::new(60_000, |i| i).with_rate(30_000.0)).name("numbers").sink(Blackhole::new());
    let handle = job.spawn().unwrap();
    // Exports while the job runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while received.lock().unwrap().len() < 3 {
        assert!(std::time::Instant::now() < deadline, "fewer than 3 exports in 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    weibo_tests::until_ended(&handle).await;
    let fin = handle.metrics().operator("numbers").unwrap().records_out;
    assert_eq!(fin, 60_000);
    let before = received.lock().unwrap().len();
    // Dropping the handle exports once more, with the final counts.
    drop(handle);
    let all = received.lock().unwrap().clone();
    assert!(all.len() > before, "no export when the handle was dropped");
    for (path, request) in &all {
        assert_eq!(path, "/v1/metrics");
        assert_eq!(service(request).as_deref(), Some("exported"));
    }
    let (read, unit) = point(&all.last().unwrap().1, "weibo.operator.records_out", "operator", "numbers").unwrap();
    assert_eq!((read, unit.as_str()), (60_000.0, "{record}"));
    // Earlier exports saw the count grow.
    let seen: Vec<f64> = all
        .iter()
        .filter_map(|(_, r)| point(r, "weibo.operator.records_out", "operator", "numbers").map(|p| p.0))
        .collect();
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert!(seen.first().is_some_and(|first| *first < 60_000.0), "the first export was before the end: {seen:?}");
    assert!(
        point(&all.last().unwrap().1, "weibo.job.uptime", "job", "exported").is_some_and(|(s, u)| s > 0.0 && u == "s")
    );
}

#[test]
fn an_endpoint_the_exporter_refuses_fails_the_spawn_naming_it() {
    weibo::testing::block_on(async {
        let job = Job::new("bad-endpoint").with_otlp("not a url", Duration::from_secs(1));
        job.source(Generator::new(10, |i| i)).sink(Blackhole::new());
        let Err(err) = job.spawn() else { panic!("the endpoint was taken") };
        assert!(err.to_string().contains("not a url"), "{err}");
    });
}
