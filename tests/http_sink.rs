//! The HTTP sink against a local server that fails on purpose: 5xx, 429
//! with `Retry-After`, answers slower than the client's timeout (after
//! taking the batch), dropped connections, and a 400 for one record. Every
//! record must arrive at least once and, deduplicated by the idempotency
//! key, exactly once; the refused record must be dead-lettered (or fail
//! the job, naming it). A job restored twice from one savepoint must send
//! the same keys for the same records.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo::{DeadLetter, Job};
use weibo_connectors::http::{BodyFormat, HttpSink, Refused};
use weibo_tests::Message;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Event {
    id: u64,
    name: String,
}

const POISON: u64 = 4242;

fn event(i: u64) -> Event {
    Event { id: i, name: format!("event {i} — ünïcode") }
}

/// How the server misbehaves, by the number of the request (from 0).
#[derive(Clone, Copy)]
struct Faults {
    /// Misbehave at all.
    on: bool,
}

#[derive(Default)]
struct Seen {
    requests: u64,
    /// Every accepted body's record ids, by idempotency key.
    by_key: BTreeMap<String, Vec<u64>>,
    /// How many times a key's body was accepted (repeats included).
    accepted: HashMap<String, u32>,
    /// When each key was last answered 429, and when it came again.
    throttled: HashMap<String, (Instant, Option<Instant>)>,
    /// Keys that arrived with another body than the first time.
    conflicts: Vec<String>,
    content_types: BTreeSet<String>,
}

struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    _rt: tokio::runtime::Runtime,
}

/// A runtime of its own for a server (the job under test runs on another),
/// with `workers` threads.
fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap()
}

fn start(faults: Faults) -> Server {
    let rt = runtime(2);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let state = Arc::clone(&seen);
    let addr = rt.block_on(weibo_tests::http_server(move |request| answer(request, Arc::clone(&state), faults)));
    Server { addr, seen, _rt: rt }
}

/// The answer to one request (`None`: the connection is dropped on
/// purpose).
async fn answer(request: Message, seen: Arc<Mutex<Seen>>, faults: Faults) -> Option<String> {
    let key = request.header("idempotency-key").to_string();
    let n = {
        let mut s = seen.lock().unwrap();
        s.requests += 1;
        s.content_types.insert(request.header("content-type").to_string());
        if let Some((_, again)) = s.throttled.get_mut(&key) {
            again.get_or_insert_with(Instant::now);
        }
        s.requests - 1
    };
    let ids: Vec<u64> = serde_json::from_slice::<Vec<Event>>(&request.body).unwrap().iter().map(|e| e.id).collect();
    let respond = |status: &str, extra: &str, text: &str| {
        format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n{extra}\r\n{text}", text.len())
    };
    if faults.on && n % 11 == 4 {
        // Drop the connection without an answer.
        return None;
    }
    let reply = if ids.contains(&POISON) {
        respond("400 Bad Request", "", &format!("bad record {POISON}"))
    } else if faults.on && n % 7 == 1 {
        respond("503 Service Unavailable", "", "boom")
    } else if faults.on && n % 7 == 3 && n < 40 {
        seen.lock().unwrap().throttled.insert(key.clone(), (Instant::now(), None));
        respond("429 Too Many Requests", "retry-after: 1\r\n", "slow down")
    } else {
        {
            let mut s = seen.lock().unwrap();
            let first = s.by_key.entry(key.clone()).or_insert_with(|| ids.clone()).clone();
            if first != ids {
                s.conflicts.push(key.clone());
            }
            *s.accepted.entry(key.clone()).or_insert(0) += 1;
        }
        if faults.on && n % 7 == 5 {
            // Taken, but answered after the client gave up.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
        }
        respond("200 OK", "", "ok")
    };
    Some(reply)
}

fn sink(server: &Server, refused: Refused<Event>) -> HttpSink<Event> {
    HttpSink::builder(format!("http://{}/events", server.addr))
        .with_batch_records(97)
        .with_concurrency(4)
        .with_timeout(Duration::from_millis(500))
        .with_linger(Duration::from_secs(60))
        .with_refused(refused)
        .build()
        .unwrap()
}

#[test]
fn through_failures_every_record_arrives_and_the_keys_make_it_exactly_once() {
    let n = 6_000;
    let server = start(Faults { on: true });
    let dead = CollectSink::<DeadLetter<Event>>::new();
    let job = Job::new("http");
    job.source(Generator::new(n, event).with_partitions(2))
        .name("events")
        .sink(sink(&server, Refused::DeadLetter(Box::new(dead.clone()))));
    weibo::testing::block_on(job.run()).unwrap();

    let s = server.seen.lock().unwrap();
    assert!(s.conflicts.is_empty(), "keys sent again with other records: {:?}", s.conflicts);
    let mut once: Vec<u64> = s.by_key.values().flatten().copied().collect();
    once.sort_unstable();
    let expected: Vec<u64> = (0..n).filter(|i| *i != POISON).collect();
    assert_eq!(once, expected, "deduplicated by key, every record but the refused one exactly once");
    let repeats: u32 = s.accepted.values().map(|c| c - 1).sum();
    assert!(repeats > 0, "some batches were taken twice (answered too late) and the keys caught it");
    // Retry-After: 1 was honoured.
    assert!(!s.throttled.is_empty());
    for (key, (at, again)) in &s.throttled {
        let again = again.unwrap_or_else(|| panic!("{key} never came again after its 429"));
        assert!(again.duration_since(*at) >= Duration::from_millis(950), "{key} came back after {:?}", again - *at);
    }
    assert_eq!(s.content_types, BTreeSet::from(["application/json".to_string()]));

    let letters = dead.values();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].record, event(POISON));
    assert!(letters[0].error.contains("HTTP 400 Bad Request: bad record 4242"), "{}", letters[0].error);
    assert_eq!(letters[0].position.source, "events");
    assert_eq!(letters[0].position.offset, POISON);
    // The refused batch was split until the record was alone: its key ends
    // in halves.
    assert!(s.by_key.keys().any(|k| k.ends_with(".0") || k.ends_with(".1")));
}

#[test]
fn a_refused_record_fails_the_job_naming_it_without_a_dead_letter_sink() {
    let server = start(Faults { on: false });
    let job = Job::new("http-strict");
    job.source(Generator::new(5_000, event)).name("events").sink(sink(&server, Refused::Fail));
    let err = weibo::testing::block_on(job.run()).expect_err("the 400 fails the job").to_string();
    assert!(
        err.contains("the endpoint refused the record from source `events` partition 0 offset 4242: HTTP 400 Bad Request: bad record 4242"),
        "{err}"
    );
}

#[test]
fn json_lines_go_out_as_such() {
    let raw = start_raw();
    let job = Job::new("http-lines");
    job.source(Generator::new(300, event)).sink(
        HttpSink::builder(format!("http://{}/events", raw.0))
            .with_format(BodyFormat::JsonLines)
            .with_batch_records(1_000)
            .build()
            .unwrap(),
    );
    weibo::testing::block_on(job.run()).unwrap();
    let bodies = raw.1.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1);
    let (content_type, body) = &bodies[0];
    assert_eq!(content_type, "application/x-ndjson");
    let lines: Vec<Event> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines, (0..300).map(event).collect::<Vec<_>>());
}

/// A server that answers 200 to anything, keeping each request's content
/// type and body.
type Bodies = Arc<Mutex<Vec<(String, String)>>>;

fn start_raw() -> (SocketAddr, Bodies, tokio::runtime::Runtime) {
    let rt = runtime(1);
    let bodies: Bodies = Arc::default();
    let keep = Arc::clone(&bodies);
    let addr = rt.block_on(weibo_tests::http_server(move |request: Message| {
        let content_type = request.header("content-type").to_string();
        keep.lock().unwrap().push((content_type, String::from_utf8(request.body).unwrap()));
        std::future::ready(Some("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_string()))
    }));
    (addr, bodies, rt)
}

#[test]
fn a_job_restored_twice_from_one_savepoint_sends_the_same_keys_for_the_same_records() {
    let dir = tempfile::tempdir().unwrap();
    let n = 200_000;
    let first = start(Faults { on: false });
    let job = Job::new("http-restore").with_checkpoints(dir.path(), Duration::from_secs(3600));
    // Odd ids: no poison among them.
    let odd = |i: u64| event(2 * i + 1);
    job.source(Generator::new(n, odd).with_rate(20_000.0)).name("events").sink(sink(&first, Refused::Fail)).name("out");
    let savepoint = weibo_tests::savepoint_midway(job, Duration::from_millis(700));
    let mut runs = Vec::new();
    for _ in 0..2 {
        let server = start(Faults { on: false });
        let job = Job::new("http-restore").restore_from(&savepoint);
        job.source(Generator::new(n, odd)).name("events").sink(sink(&server, Refused::Fail)).name("out");
        weibo::testing::block_on(job.run()).unwrap();
        let by_key = server.seen.lock().unwrap().by_key.clone();
        runs.push(by_key);
    }
    assert!(runs[0].len() > 100, "{} requests", runs[0].len());
    assert_eq!(runs[0].len(), runs[1].len());
    for ((k0, v0), (k1, v1)) in runs[0].iter().zip(&runs[1]) {
        assert_eq!((k0, v0), (k1, v1), "the same records under the same keys");
    }
    assert!(runs[0].keys().all(|k| k.starts_with("http-restore/out/0/")), "{:?}", runs[0].keys().next());
    let first_run = first.seen.lock().unwrap().by_key.clone();
    let resumed: u64 = runs[0].values().flatten().copied().min().unwrap();
    assert!(resumed > 1, "the restored job started after the savepoint's position");
    // What the first run sent after its savepoint, before it stopped, went
    // under the same keys as the restored runs' for the same records (an
    // endpoint drops those repeats): never another batch under one of them.
    for (key, ids) in &first_run {
        if let Some(again) = runs[0].get(key) {
            assert!(again == ids, "{key}: other records than the first run's");
        }
    }
}

/// A server that answers every request with `answer` (a status line and
/// headers), counting requests.
fn start_answering(answer: &'static str) -> (SocketAddr, Arc<Mutex<u32>>, tokio::runtime::Runtime) {
    let rt = runtime(1);
    let count = Arc::new(Mutex::new(0));
    let seen = Arc::clone(&count);
    let addr = rt.block_on(weibo_tests::http_server(move |_| {
        *seen.lock().unwrap() += 1;
        std::future::ready(Some(format!("{answer}\r\ncontent-length: 4\r\n\r\nnope")))
    }));
    (addr, count, rt)
}

#[test]
fn an_endpoint_that_redirects_or_refuses_the_credentials_fails_the_job_without_splitting_batches() {
    for answer in
        ["HTTP/1.1 401 Unauthorized", "HTTP/1.1 301 Moved Permanently\r\nlocation: http://127.0.0.1:9/elsewhere"]
    {
        let (addr, count, _rt) = start_answering(answer);
        let dead = CollectSink::<DeadLetter<Event>>::new();
        let job = Job::new("http-wrong");
        job.source(Generator::new(1_000, event)).sink(
            HttpSink::builder(format!("http://user:secret@{addr}/events?token=abc"))
                .with_batch_records(500)
                .with_concurrency(1)
                .with_refused(Refused::DeadLetter(Box::new(dead.clone())))
                .build()
                .unwrap(),
        );
        let err = weibo::testing::block_on(job.run()).expect_err("a wrong endpoint fails the job").to_string();
        assert!(err.contains("not about the records"), "{err}");
        assert!(!err.contains("secret") && !err.contains("token=abc"), "credentials in the error: {err}");
        assert!(dead.values().is_empty(), "no record is dead-lettered for the endpoint's fault");
        assert!(*count.lock().unwrap() <= 2, "batches were not split: {} requests", count.lock().unwrap());
    }
}
