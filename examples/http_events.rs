//! Events to an HTTP endpoint: batches of JSON lines, retried through
//! failures, each request with an idempotency key; records the endpoint
//! refuses go to a file of dead letters.
//!
//! ```sh
//! cargo run --release -p weibo-examples --example http_events -- http://127.0.0.1:8080/events <state dir>
//! ```

// ANCHOR: imports
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use weibo::prelude::*;
use weibo_connectors::http::{BodyFormat, HttpSink, Refused};
// ANCHOR_END: imports

// ANCHOR: job
#[derive(Clone, Debug, Serialize)]
struct Event {
    id: u64,
    kind: &'static str,
}

fn job(url: &str, dir: &Path) -> weibo::Result<Job> {
    let job = Job::new("events-out").with_checkpoints(dir.join("checkpoints"), Duration::from_secs(5));
    let sink = HttpSink::builder(url)
        .with_format(BodyFormat::JsonLines)
        .with_batch_records(500)
        .with_linger(Duration::from_millis(200))
        .with_concurrency(4)
        .with_timeout(Duration::from_secs(10))
        .with_header("authorization", "Bearer change-me")
        // A 400, 413 or 422: the record, the status and the start of the
        // answer, one JSON line each. (FileSink starts the file anew at
        // each start; keep dead letters in Kafka or Postgres in production.)
        .with_refused(Refused::DeadLetter(Box::new(FileSink::json_lines(dir.join("refused.jsonl")))))
        .build()?;
    job.source(Generator::new(1_000_000, |i| Event { id: i, kind: if i % 3 == 0 { "click" } else { "view" } }))
        .name("events")
        .sink(sink)
        // The sink's name is part of every idempotency key: keep it stable.
        .name("to-collector");
    Ok(job)
}
// ANCHOR_END: job

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, dir] = args.as_slice() else {
        return Err("usage: http_events <url> <state dir>".into());
    };
    tokio::runtime::Runtime::new()?.block_on(job(url, Path::new(dir))?.run())?;
    Ok(())
}
