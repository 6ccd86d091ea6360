//! A job's `/metrics` scraped by a real Prometheus server (started here,
//! scraping every second): a records counter and the backpressure of the
//! edge into a deliberately slow operator, queried through Prometheus'
//! HTTP API, match the job's own snapshot within a scrape.

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
            // A millisecond every 32 records is at most 32,000 records a
            // second, below the source's 50,000 (every 64, 78% busy, left
            // the edge unblocked in one run on a fast machine). The sleep
            // goes through `weibo::blocking`, as the book asks of blocking
            // code: a bare sleep holds its worker thread, and the source's
            // task, woken onto that thread when this task takes a batch,
            // then ran only between this task's batches, in lockstep with
            // it. Rate-limited, it then found room on the edge each time and
            // never waited, so `blocked` stayed zero (one run in five with
            // the machine loaded).
            if x.is_multiple_of(32) {
                weibo::blocking(|| std::thread::sleep(Duration::from_millis(1)));
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
    // The job's own counters, sampled every 100 ms (with the wall-clock
    // time) while Prometheus scrapes.
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let sample = |h: &weibo::JobHandle| {
        let m = h.metrics();
        let read = m.operator("numbers").map_or(0, |o| o.records_out);
        let blocked = m.edges.iter().filter(|e| e.to.starts_with("slow")).map(|e| e.blocked.as_secs_f64()).sum::<f64>();
        (now(), read, blocked)
    };
    let records = r#"weibo_operator_records_out_total{job="scraped",operator="numbers"}"#;
    let blocked = r#"sum(weibo_edge_blocked_seconds_total{job="scraped"})"#;
    let mut samples: Vec<(f64, u64, f64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    // The newest scrape's values and time (every series of a scrape has its time).
    let (scraped_records, scraped_blocked, scraped_at) = loop {
        if Instant::now() > deadline {
            panic!("Prometheus scraped nothing in 30 s; its targets: {}", prometheus.targets().await);
        }
        samples.push(sample(&handle));
        tokio::time::sleep(Duration::from_millis(100)).await;
        if samples.len() < 30 {
            continue;
        }
        let at = prometheus.query(&format!("timestamp({records})")).await;
        let (r, b) = (prometheus.query(records).await, prometheus.query(blocked).await);
        if let (Some(at), Some(r), Some(b)) = (at, r, b)
            && prometheus.query(&format!("timestamp({records})")).await == Some(at)
        {
            break (r, b, at);
        }
    };
    // The job's values a little before and a little after the scrape
    // bracket what Prometheus holds.
    while now() < scraped_at + 0.3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    samples.push(sample(&handle));
    let (_, read_before, blocked_before) =
        *samples.iter().rev().find(|(t, _, _)| *t <= scraped_at - 0.3).expect("a sample from before the scrape");
    let (_, read_after, blocked_after) =
        *samples.iter().find(|(t, _, _)| *t >= scraped_at + 0.3).expect("a sample from after the scrape");
    #[expect(clippy::cast_precision_loss)]
    let (read_before, read_after) = (read_before as f64, read_after as f64);
    assert!(
        read_before <= scraped_records && scraped_records <= read_after,
        "records: Prometheus has {scraped_records} at {scraped_at}, the job had {read_before} just before and {read_after} just after"
    );
    assert!(
        blocked_after > 0.0,
        "the slow operator's input edge was never blocked; (time, records read, blocked s): {samples:?}; edges: {:?}",
        handle.metrics().edges
    );
    let m = handle.metrics();
    let into_slow: Vec<_> = m.edges.iter().filter(|e| e.to.starts_with("slow")).collect();
    assert!(!into_slow.is_empty() && into_slow.iter().all(|e| e.capacity == 1), "{into_slow:?}");
    assert!(
        blocked_before <= scraped_blocked + 1e-9 && scraped_blocked <= blocked_after + 1e-9,
        "blocked: Prometheus has {scraped_blocked} s at {scraped_at}, the job had {blocked_before} s just before and {blocked_after} s just after"
    );
    handle.cancel().await.unwrap();
}

/// An edge into an operator that stops reading fills up: its channel's
/// fill in the snapshot and in the scrape text is its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_edge_shows_as_full() {
    let held = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let hold = held.clone();
    let job = Job::new("full-edge").with_channel_capacity(4);
    job.source(Generator::new(u64::MAX, |i| i))
        .name("numbers")
        .key_by(|x: &u64| x % 4)
        .process(weibo::on_error::Fail, move |ctx: &mut weibo::KeyedContext<'_, u64, u64, u64>, x: &u64| {
            // Stops reading until released: its input edge fills.
            while hold.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            ctx.emit(*x);
            Ok::<(), String>(())
        })
        .name("held")
        .sink(weibo::sinks::Blackhole::new());
    let handle = job.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let full = loop {
        let m = handle.metrics();
        if let Some(e) = m.edges.iter().find(|e| e.to == "held[0]" && e.queued == e.capacity) {
            break e.clone();
        }
        assert!(Instant::now() < deadline, "the edge never filled: {:?}", m.edges);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(full.capacity, 4);
    let text = handle.prometheus_metrics();
    assert!(
        text.contains(
            r#"weibo_edge_queued{job="full-edge",edge="numbers[0] -> held[0]",from="numbers[0]",to="held[0]"} 4"#
        ),
        "{text}"
    );
    assert!(text.contains(
        r#"weibo_edge_capacity{job="full-edge",edge="numbers[0] -> held[0]",from="numbers[0]",to="held[0]"} 4"#
    ));
    held.store(false, std::sync::atomic::Ordering::Relaxed);
    handle.cancel().await.unwrap();
}
