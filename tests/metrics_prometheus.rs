//! A job's `/metrics` scraped by a real Prometheus server (started here,
//! scraping every second): a records counter and the backpressure of the
//! edge into a deliberately slow operator, queried through Prometheus'
//! HTTP API, match the job's own snapshot within a scrape.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, missing_docs)]

use std::time::{Duration, Instant};

use weibo::Job;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo_tests::{Prometheus, http};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_counters_and_the_backpressure_the_job_reports() {
    let job = Job::new("scraped").with_admin("127.0.0.1:0").with_admin_token("scrape-token").with_channel_capacity(1);
    job.source(Generator::new(u64::MAX, |i| i).with_rate(50_000.0))
        .name("numbers")
        .key_by(|x: &u64| x % 4)
        .process(weibo::on_error::Fail, |ctx: &mut weibo::KeyedContext<'_, u64, u64, u64>, x: &u64| {
            // Slow on purpose: the edge into it fills, its sender blocks.
            if x.is_multiple_of(64) {
                std::thread::sleep(Duration::from_millis(1));
            }
            ctx.emit(*x);
            Ok::<(), String>(())
        })
        .name("slow")
        .sink(CollectSink::new());
    let handle = job.spawn().unwrap();
    let addr = handle.admin_addr().unwrap();

    // The endpoint itself: Prometheus' text format, behind the token.
    assert_eq!(http(addr, "GET", "/metrics", None, None).await.0, 401);
    let (status, text) = http(addr, "GET", "/metrics", Some("scrape-token"), None).await;
    assert_eq!(status, 200);
    assert!(text.contains("# TYPE weibo_operator_records_in_total counter"), "{text}");
    assert!(text.contains("# TYPE weibo_edge_blocked_seconds_total counter"), "{text}");
    assert!(text.contains(r#"weibo_operator_records_out_total{job="scraped",operator="numbers"}"#), "{text}");

    let prometheus = Prometheus::start(addr, Some("scrape-token")).await;
    // The job's own counters, sampled every 100 ms while Prometheus scrapes.
    let mut samples: Vec<(Instant, u64, f64)> = Vec::new();
    let sample = |h: &weibo::JobHandle| {
        let m = h.metrics();
        let read = m.operator("numbers").map_or(0, |o| o.records_out);
        let blocked = m.edges.iter().filter(|e| e.to.starts_with("slow")).map(|e| e.blocked.as_secs_f64()).sum();
        (Instant::now(), read, blocked)
    };
    let records = r#"weibo_operator_records_out_total{job="scraped",operator="numbers"}"#;
    let blocked = r#"sum(weibo_edge_blocked_seconds_total{job="scraped"})"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (scraped_records, scraped_blocked, queried_at) = loop {
        if Instant::now() > deadline {
            panic!("Prometheus scraped nothing in 30 s; its targets: {}", prometheus.targets().await);
        }
        samples.push(sample(&handle));
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Past a few scrapes, so that the newest sample is recent.
        if samples.len() < 40 {
            continue;
        }
        if let (Some(r), Some(b)) = (prometheus.query(records).await, prometheus.query(blocked).await) {
            break (r, b, Instant::now());
        }
    };
    samples.push(sample(&handle));
    // What Prometheus holds was scraped within the last interval (1 s) and
    // its timeout: between the job's values 2.5 s before the query and now.
    let (_, read_then, blocked_then) = *samples
        .iter()
        .rev()
        .find(|(at, _, _)| queried_at.duration_since(*at) >= Duration::from_millis(2_500))
        .unwrap();
    let (_, read_now, blocked_now) = *samples.last().unwrap();
    #[expect(clippy::cast_precision_loss)]
    let (read_then, read_now) = (read_then as f64, read_now as f64);
    assert!(
        read_then <= scraped_records && scraped_records <= read_now,
        "records: Prometheus has {scraped_records}, the job had {read_then} 2.5 s before and {read_now} now"
    );
    assert!(blocked_now > 0.0, "the slow operator's input edge was blocked");
    assert!(
        blocked_then <= scraped_blocked + 1e-9 && scraped_blocked <= blocked_now + 1e-9,
        "blocked: Prometheus has {scraped_blocked} s, the job had {blocked_then} s 2.5 s before and {blocked_now} s now"
    );
    handle.cancel().await.unwrap();
}
