//! Kafka connectors against a real Apache Kafka broker (started by
//! `kafka_broker`): round trips with keys, headers and timestamps, clear
//! errors for bad brokers, topics, records and transaction timeouts.
//!
//! The exactly-once scenarios are in `kafka_exactly_once.rs`, consumer
//! groups in `kafka_groups.rs`, throughput and latency in `kafka_bench.rs`.

use weibo_tests::kafka_common::*;

#[test]
fn a_round_trip_keeps_values_keys_headers_and_timestamps() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, output) = (unique("roundtrip-in"), unique("roundtrip-out"));
    create_topic(&input, 3);
    create_topic(&output, 2);
    let values: Vec<Vec<u8>> = (0..300u64).map(|n| serde_json::to_vec(&Payload { n }).unwrap()).collect();
    let keys: Vec<Vec<u8>> = (0..300u64).map(|n| format!("k{}", n % 10).into_bytes()).collect();
    let seqs: Vec<Vec<u8>> = (0..300u64).map(|n| n.to_string().into_bytes()).collect();
    let records: Vec<In<'_>> = (0..300usize)
        .map(|i| In {
            key: Some(&keys[i]),
            value: &values[i],
            headers: vec![("seq", &seqs[i][..]), ("origin", b"test")],
            timestamp: Some(1_700_000_000_000 + i as i64),
        })
        .collect();
    produce(&input, &records);

    let source = KafkaSource::builder(bootstrap(), [input.clone()], Json).until_end().build::<Payload>().unwrap();
    assert_eq!(source.kafka_partitions().len(), 3);
    let job = Job::new("roundtrip");
    job.source(source).map(|r: KafkaRecord<Payload>| Out { n: r.value.n * 2, key: r.key, headers: r.headers }).sink(
        KafkaSink::new(bootstrap(), output.clone(), Json)
            .with_key(|o: &Out| o.key.clone())
            .with_headers(|o: &Out| o.headers.clone()),
    );
    weibo::testing::block_on(job.run()).unwrap();

    let got = consume_all(&output, "read_committed");
    assert_eq!(got.len(), 300);
    let mut seen = BTreeMap::new();
    for m in &got {
        let out: Out = serde_json::from_slice(m.payload().unwrap()).unwrap();
        let n = out.n / 2;
        assert_eq!(out.n % 2, 0);
        assert_eq!(m.key(), Some(format!("k{}", n % 10).as_bytes()), "key of record {n}");
        let hs: Vec<(String, Vec<u8>)> =
            m.headers().unwrap().iter().map(|h| (h.key.to_string(), h.value.unwrap().to_vec())).collect();
        assert_eq!(hs, vec![("seq".to_string(), n.to_string().into_bytes()), ("origin".to_string(), b"test".to_vec())]);
        assert_eq!(m.timestamp().to_millis(), Some(1_700_000_000_000 + n as i64), "timestamp of record {n}");
        *seen.entry(n).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 300);
    assert!(seen.values().all(|c| *c == 1));
}

#[test]
fn unreachable_brokers_and_missing_topics_are_named() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let err = KafkaSource::builder("127.0.0.1:9", ["t"], Json)
        .with_connect_timeout(Duration::from_secs(2))
        .build::<Payload>()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot reach the Kafka brokers at 127.0.0.1:9"), "{err}");

    let missing = unique("missing");
    let err = KafkaSource::builder(bootstrap(), [missing.clone()], Json).build::<Payload>().unwrap_err().to_string();
    assert!(err.contains(&format!("topic `{missing}`")) && err.contains("does not exist"), "{err}");
}

#[test]
fn an_undecodable_record_is_named_or_skipped_by_policy() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let input = unique("bad-json");
    create_topic(&input, 1);
    let good = serde_json::to_vec(&Payload { n: 1 }).unwrap();
    let rec = |v: &'static [u8]| In { key: None, value: v, headers: vec![], timestamp: None };
    let good: &'static [u8] = Box::leak(good.into_boxed_slice());
    produce(&input, &[rec(good), rec(good), rec(b"{not json"), rec(good)]);

    let run = |policy: DecodeErrors| {
        let source = KafkaSource::builder(bootstrap(), [input.clone()], Json)
            .until_end()
            .with_decode_errors(policy)
            .build::<Payload>()
            .unwrap();
        let skipped = source.skipped();
        let mut t = weibo::testing::TestJob::new("bad-json");
        let s = t.job().source(source).map(|r: KafkaRecord<Payload>| r.offset);
        let got = t.collect(&s);
        (t.run().map(|_| got.values()), skipped.load(Ordering::Relaxed))
    };
    let (failed, _) = run(DecodeErrors::Fail);
    let err = failed.unwrap_err().to_string();
    assert!(err.contains(&format!("topic `{input}` partition 0 offset 2")) && err.contains("JSON"), "{err}");
    let (ok, skipped) = run(DecodeErrors::Skip);
    assert_eq!(ok.unwrap(), vec![0, 1, 3]);
    assert_eq!(skipped, 1);
}

#[test]
fn a_transaction_timeout_above_the_brokers_maximum_is_refused_naming_both() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let (input, output) = (unique("timeout-in"), unique("timeout-out"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    produce(&input, &[In { key: None, value: b"x", headers: vec![], timestamp: None }]);
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("too-long").with_checkpoints(dir.path().join("checkpoints"), Duration::from_secs(1));
    let source = KafkaSource::builder(bootstrap(), [input], weibo_connectors::kafka::Text).until_end().build().unwrap();
    job.source(source).map(|r: KafkaRecord<String>| r.value).sink_exactly_once(
        KafkaSink::new(bootstrap(), output, weibo_connectors::kafka::Text)
            .with_transactions("too-long", dir.path().join("redo"))
            .with_transaction_timeout(Duration::from_secs(20 * 60)),
    );
    let err = weibo::testing::block_on(job.run()).unwrap_err().to_string();
    assert!(err.contains("transaction.timeout.ms = 1200000 ms"), "{err}");
    assert!(err.contains("transaction.max.timeout.ms"), "{err}");
    eprintln!("{err}");
}

/// A Kafka source's consumer lag: each partition's end (its last stable
/// offset, from librdkafka's statistics) and read position in the job's
/// metrics, the lag above zero while a slow operator holds reading back,
/// and zero with the position at the end once everything is read.
#[test]
fn each_partitions_consumer_lag_is_in_the_metrics() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let input = unique("lag-in");
    create_topic(&input, 2);
    let values: Vec<Vec<u8>> = (0..2000u64).map(|n| serde_json::to_vec(&Payload { n }).unwrap()).collect();
    let keys: Vec<Vec<u8>> = (0..2000u64).map(|n| format!("k{n}").into_bytes()).collect();
    let records: Vec<In<'_>> = (0..2000usize)
        .map(|i| In { key: Some(&keys[i]), value: &values[i], headers: vec![], timestamp: None })
        .collect();
    produce(&input, &records);

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let source = KafkaSource::builder(bootstrap(), [input.clone()], Json).build::<Payload>().unwrap();
        let job = Job::new("lagging").with_batch_size(20).with_channel_capacity(1);
        job.source(source)
            .name("in")
            .map(|r: KafkaRecord<Payload>| {
                std::thread::sleep(Duration::from_millis(2)); // reads at most 500 records a second
                r.value.n
            })
            .sink(weibo::sinks::Blackhole::new())
            .name("out");
        let handle = job.spawn().unwrap();
        let lags = |h: &weibo::JobHandle| -> Vec<(Option<u64>, Option<u64>)> {
            h.metrics().tasks.iter().filter_map(|t| t.source.as_ref()).map(|s| (s.position, s.end_position)).collect()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut lagged = false;
        loop {
            let now = lags(&handle);
            assert_eq!(now.len(), 2, "one entry per partition: {now:?}");
            lagged |= now.iter().any(|(p, e)| matches!((p, e), (Some(p), Some(e)) if e > p));
            let read = handle.metrics().operator("out").unwrap().records_in;
            let ends: u64 = now.iter().filter_map(|(_, e)| *e).sum();
            if read == 2000 && ends == 2000 && now.iter().all(|(p, e)| p.is_some() && p == e) {
                break;
            }
            assert!(Instant::now() < deadline, "read {read} of 2000, positions and ends {now:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(lagged, "no partition was ever seen behind its end");
        let text = handle.prometheus_metrics();
        let zero_lags = text.lines().filter(|l| l.starts_with("weibo_source_lag{") && l.ends_with(" 0")).count();
        assert_eq!(zero_lags, 2, "{text}");
        handle.cancel().await.unwrap();
    });
}
