//! Throughput and latency of Kafka → Kafka pipes (ignored by default;
//! run with `cargo test --release -p weibo-tests --test kafka_bench --
//! --ignored --nocapture`).
//!
//! Compared side by side: a raw rdkafka pipe, Weibo at-least-once, and
//! Weibo exactly-once.

use weibo_tests::kafka_common::*;

// ---- benchmark ----------------------------------------------------------------

/// Kafka → Kafka throughput on the test broker: a hand-written rdkafka
/// consume → produce pipe, Weibo at least once, Weibo exactly once with a
/// checkpoint every second; records of 100 bytes. Run in release:
///
/// ```sh
/// cargo test --release -p weibo-tests --test kafka -- --ignored --nocapture kafka_pipe_throughput
/// ```
///
/// `WEIBO_KAFKA_BENCH_RECORDS` (default 1,000,000) and `WEIBO_KAFKA_BENCH_REPS`
/// (default 3) size it; it prints every run and the medians.
#[test]
#[ignore = "a benchmark: run it in release, by name"]
fn kafka_pipe_throughput() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let n: usize = env_or("WEIBO_KAFKA_BENCH_RECORDS", 1_000_000);
    let reps: usize = env_or("WEIBO_KAFKA_BENCH_REPS", 3);
    let input = bench_input(n);

    let mut results: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for rep in 0..reps {
        for kind in PIPES {
            let output = unique("bench-out");
            create_topic(&output, 4);
            let dir = tempfile::tempdir().unwrap();
            let t = Instant::now();
            copy(kind, &input, &output, n, dir.path());
            let secs = t.elapsed().as_secs_f64();
            let got = count_records(&output);
            assert_eq!(got, n, "{kind} wrote every record");
            eprintln!("rep {rep}: {kind}: {n} records in {secs:.2} s = {:.0} records/s", n as f64 / secs);
            results.entry(kind).or_default().push(n as f64 / secs);
        }
    }
    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let raw = median(&results["raw rdkafka pipe"]);
    for (kind, v) in &results {
        eprintln!("median {kind}: {:.0} records/s ({:.0}% of the raw pipe)", median(v), 100.0 * median(v) / raw);
    }
}

/// A benchmark setting from the environment.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A new 4-partition topic holding `n` records of 100 bytes, keyed by
/// `i % 1000`.
fn bench_input(n: usize) -> String {
    let input = unique("bench-in");
    create_topic(&input, 4);
    let payloads: Vec<Vec<u8>> = (0..n).map(|i| format!("{i:0>100}").into_bytes()).collect();
    let keys: Vec<Vec<u8>> = (0..n).map(|i| (i % 1000).to_string().into_bytes()).collect();
    let records: Vec<In<'_>> =
        (0..n).map(|i| In { key: Some(&keys[i]), value: &payloads[i], headers: vec![], timestamp: None }).collect();
    let t = Instant::now();
    produce(&input, &records);
    eprintln!("produced {n} records of 100 bytes in {:.2?}", t.elapsed());
    input
}

/// The pipelines the benchmarks compare.
const PIPES: [&str; 3] = ["raw rdkafka pipe", "weibo at-least-once", "weibo exactly-once (1 s checkpoints)"];

/// Copies the first `n` records of `input` to `output` with pipeline `kind`.
fn copy(kind: &str, input: &str, output: &str, n: usize, dir: &Path) {
    if kind == PIPES[0] {
        raw_pipe(input, output, n, &AtomicBool::new(false));
    } else {
        weibo::testing::block_on(bench_job(kind, input, output, dir, true).run()).unwrap();
    }
}

/// A Weibo copy of `input` to `output`, at least or exactly once.
fn bench_job(kind: &str, input: &str, output: &str, dir: &Path, bounded: bool) -> Job {
    let mut source = KafkaSource::builder(bootstrap(), [input.to_string()], weibo_connectors::kafka::Bytes);
    if bounded {
        source = source.until_end();
    }
    let source = source.build::<Vec<u8>>().unwrap();
    let key = |r: &(Option<Vec<u8>>, Vec<u8>)| r.0.clone();
    if kind == PIPES[1] {
        let job = Job::new("bench-alo");
        job.source(source)
            .map(|r: KafkaRecord<Vec<u8>>| (r.key, r.value))
            .sink(KafkaSink::new(bootstrap(), output, KeyedBytes).with_key(key));
        job
    } else {
        let job = Job::new("bench-eos").with_checkpoints(dir.join("cp"), Duration::from_secs(1));
        job.source(source).map(|r: KafkaRecord<Vec<u8>>| (r.key, r.value)).sink_exactly_once(
            KafkaSink::new(bootstrap(), output, KeyedBytes)
                .with_transactions(format!("{output}-txn"), dir.join("redo"))
                .with_key(key),
        );
        job
    }
}

/// End-to-end latency on the test broker, for each pipeline of
/// `kafka_pipe_throughput`: first its maximum rate (copying
/// `WEIBO_KAFKA_BENCH_RECORDS` records, default 300,000), then, for
/// `WEIBO_KAFKA_LATENCY_SECS` seconds (default 15), input produced at half
/// that rate (`WEIBO_KAFKA_LATENCY_SHARE`, default 0.5); a record's latency is from just before it is handed to the
/// input's producer to when a `read_committed` consumer of the output has
/// it. The first 3 seconds are not counted. Run in release:
///
/// ```sh
/// cargo test --release -p weibo-tests --test kafka -- --ignored --nocapture kafka_pipe_latency
/// ```
#[test]
#[ignore = "a benchmark: run it in release, by name"]
fn kafka_pipe_latency() {
    if std::env::var("WEIBO_KAFKA_CHILD").is_ok() {
        return;
    }
    let n: usize = env_or("WEIBO_KAFKA_BENCH_RECORDS", 300_000);
    let secs: u64 = env_or("WEIBO_KAFKA_LATENCY_SECS", 15);
    let share: f64 = env_or("WEIBO_KAFKA_LATENCY_SHARE", 0.5);
    let input = bench_input(n);
    let mut report = Vec::new();
    for kind in PIPES {
        let output = unique("lat-max-out");
        create_topic(&output, 4);
        let dir = tempfile::tempdir().unwrap();
        let t = Instant::now();
        copy(kind, &input, &output, n, dir.path());
        let max = n as f64 / t.elapsed().as_secs_f64();
        let rate = max * share;
        let (lat, sent) = latency_run(kind, rate, Duration::from_secs(secs));
        let pct = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
        let line = format!(
            "{kind}: max {max:.0} records/s; at {rate:.0} records/s ({} counted of {sent} sent): \
             p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms",
            lat.len(),
            pct(0.5),
            pct(0.99),
            pct(0.999),
            pct(1.0)
        );
        eprintln!("{line}");
        report.push(line);
    }
    for line in report {
        eprintln!("{line}");
    }
}

fn now_micros() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Runs pipeline `kind` on fresh topics while producing `rate` records/s
/// for `length`; returns the sorted latencies in microseconds of the
/// records sent after the first 3 seconds, and how many were sent in all.
fn latency_run(kind: &str, rate: f64, length: Duration) -> (Vec<u64>, usize) {
    let (input, output) = (unique("lat-in"), unique("lat-out"));
    create_topic(&input, 4);
    create_topic(&output, 4);
    let dir = tempfile::tempdir().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (pipe, job) = if kind == PIPES[0] {
        let (i, o, s) = (input.clone(), output.clone(), std::sync::Arc::clone(&stop));
        (Some(std::thread::spawn(move || raw_pipe(&i, &o, usize::MAX, &s))), None)
    } else {
        let _guard = runtime.enter();
        (None, Some(bench_job(kind, &input, &output, dir.path(), false).spawn().unwrap()))
    };
    // The reader: latency of every record sent after the warm-up.
    let warm = now_micros() + 3_000_000;
    let (o, s) = (output.clone(), std::sync::Arc::clone(&stop));
    let reader = std::thread::spawn(move || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", unique("lat-reader"))
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "5")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for part in 0..4 {
            tpl.add_partition_offset(&o, part, Offset::Beginning).unwrap();
        }
        c.assign(&tpl).unwrap();
        let mut lat = Vec::new();
        while !s.load(Ordering::Relaxed) {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
                let now = now_micros();
                let sent: u64 = std::str::from_utf8(&m.payload().unwrap()[..16]).unwrap().parse().unwrap();
                if sent >= warm {
                    lat.push(now.saturating_sub(sent));
                }
            }
        }
        lat
    });
    // The writer: `rate` records per second, in steps of a millisecond.
    let p: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap()).set("linger.ms", "1").create().unwrap();
    let started = Instant::now();
    let mut sent = 0usize;
    while started.elapsed() < length {
        let due = (started.elapsed().as_secs_f64() * rate) as usize;
        while sent < due {
            let payload = format!("{:016}{:0>84}", now_micros(), sent);
            let key = (sent % 1000).to_string();
            send(&p, BaseRecord::<'_, str, str>::to(&input).payload(payload.as_str()).key(key.as_str()));
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    p.flush(Duration::from_secs(30)).unwrap();
    // Time for the last records to come through (a checkpoint or two).
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let mut lat = reader.join().unwrap();
    if let Some(pipe) = pipe {
        pipe.join().unwrap();
    }
    if let Some(job) = job {
        runtime.block_on(job.cancel()).unwrap();
    }
    lat.sort_unstable();
    assert!(!lat.is_empty(), "{kind}: no record came through");
    (lat, sent)
}

/// The value's bytes as they are; the key goes through `with_key`.
struct KeyedBytes;

impl weibo_connectors::kafka::Format<(Option<Vec<u8>>, Vec<u8>)> for KeyedBytes {
    fn name(&self) -> &'static str {
        "bytes"
    }

    fn decode(&self, bytes: &[u8]) -> Result<(Option<Vec<u8>>, Vec<u8>), String> {
        Ok((None, bytes.to_vec()))
    }

    fn encode(&self, value: &(Option<Vec<u8>>, Vec<u8>), out: &mut Vec<u8>) -> Result<(), String> {
        out.extend_from_slice(&value.1);
        Ok(())
    }
}

/// The baseline: one consumer reading every partition, one idempotent
/// producer, no framework; copies `n` records or until `stop`.
fn raw_pipe(input: &str, output: &str, n: usize, stop: &AtomicBool) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("raw"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for part in 0..4 {
        tpl.add_partition_offset(input, part, Offset::Beginning).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut done = 0;
    while done < n && !stop.load(Ordering::Relaxed) {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let mut rec: BaseRecord<'_, [u8], [u8]> =
                    BaseRecord::to(output).payload(m.payload().unwrap_or_default());
                if let Some(k) = m.key() {
                    rec = rec.key(k);
                }
                send(&p, rec);
                done += 1;
            }
            Some(Err(e)) => panic!("{e}"),
            None => {}
        }
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

/// How many records `topic` holds (high watermarks summed; the topic is
/// written by one producer without transactions aborted).
fn count_records(topic: &str) -> usize {
    consume_all(topic, "read_committed").len()
}
