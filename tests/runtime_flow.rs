//! The runtime's flow control: bounded edges and their backpressure
//! metrics, the buffer timeout that flushes quiet streams, and how a job
//! stops on errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use weibo::sinks::{Blackhole, CollectSink, Sink, SinkBatch, SinkWriter};
use weibo::sources::{Generator, IterSource};
use weibo::{Error, Job};

/// A sink that takes `delay` per batch: a slow downstream.
#[derive(Clone)]
struct Slow {
    delay: Duration,
    count: Arc<AtomicU64>,
}

impl Sink<u64> for Slow {
    fn default_name(&self) -> String {
        "slow".into()
    }
    fn open(&self, _: usize, _: usize) -> weibo::Result<Box<dyn SinkWriter<u64>>> {
        Ok(Box::new(self.clone()))
    }
}

impl SinkWriter<u64> for Slow {
    fn write(&mut self, batch: &mut SinkBatch<'_, u64>) -> weibo::Result<()> {
        std::thread::sleep(self.delay);
        self.count.fetch_add(batch.drain().count() as u64, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_sink_blocks_senders_and_the_blocked_time_is_visible_while_running() {
    let count = Arc::new(AtomicU64::new(0));
    let slow = Slow { delay: Duration::from_millis(5), count: count.clone() };
    let job = Job::new("backpressure").with_batch_size(64).with_channel_capacity(1);
    job.source(Generator::new(20_000, |i| i))
        .name("numbers")
        .key_by(|x: &u64| x % 7)
        .with_partitions(2)
        .reduce(|a, b| a + b)
        .sink(slow);
    let handle = job.spawn().unwrap();
    // Read metrics from the running job.
    let mut running = None;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let m = handle.metrics();
        if m.operator("reduce").is_some_and(|o| o.records_in > 0) && !handle.is_finished() {
            running = Some(m);
            break;
        }
    }
    let running = running.expect("metrics of the running job showed progress");
    assert!(running.operator("reduce").unwrap().records_in < 20_000, "read while running");
    let report = handle.wait().await.unwrap();
    let m = report.metrics;
    assert_eq!(m.operator("reduce").unwrap().records_in, 20_000);
    assert_eq!(count.load(Ordering::Relaxed), 20_000);
    assert_eq!(m.edges.len(), 2, "numbers[0] -> reduce[0], numbers[0] -> reduce[1]");
    assert_eq!(m.edges.iter().map(|e| e.records).sum::<u64>(), 20_000);
    assert!(m.total_blocked() > Duration::ZERO, "the source must have waited on full edges: {m}");
    for e in &m.edges {
        assert_eq!(e.from, "numbers[0]");
        assert!(e.to.starts_with("reduce["), "{}", e.to);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_stream_is_flushed_by_the_buffer_timeout() {
    // 5 events per second: a batch of 1024 would take minutes to fill.
    let out = CollectSink::new();
    let job = Job::new("quiet").with_buffer_timeout(Duration::from_millis(20));
    job.source(Generator::new(1_000, |i| i).with_rate(5.0))
        .key_by(|x: &u64| *x)
        .with_partitions(2)
        .reduce(|a, _| a)
        .sink(out.clone());
    let handle = job.spawn().unwrap();
    let mut arrived = false;
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if !out.values().is_empty() {
            arrived = true;
            break;
        }
    }
    assert!(!handle.is_finished(), "the source is still producing");
    handle.abort();
    assert!(arrived, "records crossed the keyed edge long before a batch was full");
}

#[test]
fn a_panicking_user_function_fails_the_job_with_its_message() {
    let err = weibo::testing::run(vec![1u32, 2, 3], |s| s.map(|x: u32| if x == 2 { panic!("boom at {x}") } else { x }))
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(&err, Error::Panicked { task, .. } if task == "values[0]"), "{err:?}");
    assert!(text.contains("boom at 2"), "{text}");
}

#[test]
fn spawning_outside_a_runtime_is_a_clear_error() {
    let job = Job::new("no-runtime");
    job.source(IterSource::new(vec![1])).sink(CollectSink::new());
    let err = job.spawn().unwrap_err();
    assert!(matches!(err, Error::Runtime { .. }) && err.to_string().contains("tokio runtime"), "{err}");
}

#[test]
fn a_job_without_a_sink_is_a_wiring_error() {
    let job = Job::new("no-sink");
    let _ = job.source(IterSource::new(vec![1])).map(|x: i32| x + 1);
    let err = weibo::testing::block_on(job.run()).unwrap_err();
    assert!(err.to_string().contains("no sink"), "{err}");
}

#[test]
fn duplicate_operator_names_are_refused() {
    let job = Job::new("dupes");
    let s = job.source(IterSource::new(vec![1])).map(|x: i32| x).name("step");
    s.map(|x: i32| x).name("step").sink(CollectSink::new());
    let err = weibo::testing::block_on(job.run()).unwrap_err();
    assert!(err.to_string().contains("two operators are named `step`"), "{err}");
}

#[test]
fn fan_out_sends_every_record_to_both_branches() {
    let a = CollectSink::new();
    let b = CollectSink::new();
    let job = Job::new("fan-out");
    let s = job.source(IterSource::new(0..500u32));
    s.filter(|x: &u32| x.is_multiple_of(2)).sink(a.clone());
    s.key_by(|x: &u32| *x).with_partitions(3).reduce(|x, _| x).sink(b.clone());
    weibo::testing::block_on(job.run()).unwrap();
    assert_eq!(a.values().len(), 250);
    let mut got = b.values();
    got.sort_unstable();
    assert_eq!(got, (0..500).collect::<Vec<_>>());
}

#[test]
fn a_zero_buffer_timeout_flushes_every_step_and_finishes() {
    let out = CollectSink::new();
    let job = Job::new("no-buffering").with_buffer_timeout(Duration::ZERO).with_batch_size(16);
    job.source(IterSource::new(0..300u32))
        .key_by(|x: &u32| x % 5)
        .with_partitions(2)
        .reduce(|a, b| a.max(b))
        .sink(out.clone());
    weibo::testing::block_on(job.run()).unwrap();
    let mut got = out.values();
    got.sort_unstable();
    assert_eq!(got, (0..300).collect::<Vec<_>>(), "max per key equals each record, which arrive in order");
}

/// Records which (instance, parallelism) each opened writer got.
#[derive(Clone, Default)]
struct Instances(Arc<std::sync::Mutex<Vec<(usize, usize)>>>);

impl Sink<u32> for Instances {
    fn default_name(&self) -> String {
        "instances".into()
    }
    fn open(&self, instance: usize, parallelism: usize) -> weibo::Result<Box<dyn SinkWriter<u32>>> {
        self.0.lock().unwrap().push((instance, parallelism));
        Sink::<u32>::open(&Blackhole::new(), instance, parallelism)
    }
}

#[test]
fn sink_instances_are_numbered_across_the_heads_that_reach_them() {
    let seen = Instances::default();
    let job = Job::new("numbering");
    let one = job.source(IterSource::new(0..10u32)).name("one");
    let three = job.source(Generator::new(30, |i| i as u32).with_partitions(3)).name("three");
    one.union(&three).sink(seen.clone());
    weibo::testing::block_on(job.run()).unwrap();
    let mut got = seen.0.lock().unwrap().clone();
    got.sort_unstable();
    assert_eq!(got, vec![(0, 4), (1, 4), (2, 4), (3, 4)]);
}

#[test]
fn a_stream_nobody_consumes_is_a_wiring_error() {
    let job = Job::new("dangling");
    let s = job.source(IterSource::new(vec![1u8])).name("numbers");
    s.sink(CollectSink::new());
    let _forgotten = s.map(|x: u8| x + 1).name("plus-one");
    let err = weibo::testing::block_on(job.run()).unwrap_err();
    assert!(err.to_string().contains("the output of `plus-one` is not consumed"), "{err}");
}

/// Log lines at `warn` and above, captured for the tests that look for a
/// warning (the subscriber is global: tasks run on the runtime's threads).
fn captured_warnings() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<&'static std::sync::Mutex<Vec<u8>>> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log: &'static std::sync::Mutex<Vec<u8>> = Box::leak(Box::new(std::sync::Mutex::new(Vec::new())));
        struct Capture(&'static std::sync::Mutex<Vec<u8>>);
        impl std::io::Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || Capture(log))
            .try_init();
        log
    })
}

#[test]
fn blocking_code_in_an_operator_and_a_slow_alignment_are_warned_of_naming_the_task() {
    let log = captured_warnings();
    // Partition 0's records sleep 150 ms a batch (a synchronous call in
    // `map`), partition 1's do not: the keyed task waits for partition 0's
    // barriers far longer than the 50 ms interval.
    let job = Job::new("blocking")
        .with_checkpoints(tempfile::tempdir().unwrap().keep(), Duration::from_millis(50))
        .with_batch_size(8);
    job.source(Generator::new(200, |i| i).with_partitions(2))
        .name("numbers")
        .map(|i: u64| {
            if i.is_multiple_of(16) {
                std::thread::sleep(Duration::from_millis(150));
            }
            i
        })
        .name("lookup")
        .key_by(|i: &u64| i % 3)
        .reduce(|a, b| a + b)
        .name("sums")
        .sink(Blackhole::new());
    weibo::testing::block_on(job.run()).unwrap();
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(
        text.contains("held the task far longer than the buffer timeout") && text.contains("numbers[0]"),
        "a warning names the blocked task: {text}"
    );
    assert!(text.contains("lookup"), "and its operators: {text}");
    assert!(text.contains("aligning the checkpoint's barrier took longer") && text.contains("sums["), "{text}");
}

/// A keyed worker's input edges share the channel capacity: each holds
/// its share (at least 2), so that what is in flight grows with the
/// parallelism, not with its square.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edges_into_a_worker_share_the_channel_capacity() {
    // Source partitions, keyed partitions, capacity, the capacity each
    // edge into a worker gets.
    for (sources, keyed, capacity, each) in [(1, 1, 8, 8), (2, 2, 8, 4), (3, 2, 8, 3), (16, 2, 8, 2), (2, 3, 1, 1)] {
        let job = Job::new("shared").with_channel_capacity(capacity);
        job.source(Generator::new(u64::MAX, |i| i).with_partitions(sources).with_rate(1000.0))
            .key_by(|x: &u64| x % 7)
            .with_partitions(keyed)
            .reduce(|a, b| a + b)
            .sink(Blackhole::new());
        let handle = job.spawn().unwrap();
        let edges = handle.metrics().edges;
        handle.abort();
        assert_eq!(edges.len(), sources * keyed, "{edges:?}");
        assert!(
            edges.iter().all(|e| e.capacity == each),
            "{sources} sources, {keyed} workers, capacity {capacity}: {:?}",
            edges.iter().map(|e| e.capacity).collect::<Vec<_>>()
        );
    }
}

/// Counts the records a sink gets and the largest batch it got them in.
#[derive(Clone, Default)]
struct Batches {
    records: Arc<AtomicU64>,
    largest: Arc<AtomicU64>,
}

impl<T: Send + 'static> Sink<T> for Batches {
    fn default_name(&self) -> String {
        "batches".into()
    }
    fn open(&self, _: usize, _: usize) -> weibo::Result<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(self.clone()))
    }
}

impl<T> SinkWriter<T> for Batches {
    fn write(&mut self, batch: &mut SinkBatch<'_, T>) -> weibo::Result<()> {
        let n = batch.drain().count() as u64;
        self.records.fetch_add(n, Ordering::Relaxed);
        self.largest.fetch_max(n, Ordering::Relaxed);
        Ok(())
    }
}

/// 10,000 keys in one window (tumbling, or a session each) fire at the end
/// of the input; their results go out in batches of the job's batch size,
/// not in one batch of 10,000.
#[test]
fn a_window_of_many_keys_fires_a_batch_at_a_time() {
    use weibo::time::WatermarkStrategy;
    use weibo::window::{Session, Tumbling};
    for session in [false, true] {
        let batches = Batches::default();
        let job = Job::new("wide-window").with_batch_size(64);
        let keyed = job
            .source(IterSource::new(0..10_000u64))
            .with_timestamps(|_: &u64| 0, WatermarkStrategy::monotonous())
            .key_by(|x: &u64| *x);
        if session {
            keyed.window(Session::with_gap(Duration::from_secs(1))).reduce(|a, _| a).sink(batches.clone());
        } else {
            keyed.window(Tumbling::of(Duration::from_secs(1))).reduce(|a, _| a).sink(batches.clone());
        }
        weibo::testing::block_on(job.run()).unwrap();
        assert_eq!(batches.records.load(Ordering::Relaxed), 10_000, "session: {session}");
        let largest = batches.largest.load(Ordering::Relaxed);
        assert!(largest <= 64, "session: {session}: a batch of {largest} results");
    }
}
