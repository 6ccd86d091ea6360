//! The book's "Wiring errors" chapter: the mistakes the compiler cannot see,
//! refused with `Error::Graph` before anything runs, and the job started
//! outside a tokio runtime (`Error::Runtime`).
//!
//! Run it with `cargo run -p weibo-examples --example book_wiring`.

// ANCHOR: imports
use std::error::Error;

use weibo::prelude::*;
// ANCHOR_END: imports

fn main() -> Result<(), Box<dyn Error>> {
    no_sink()?;
    unconsumed()?;
    unread_dead_letters()?;
    dropped_failures()?;
    too_many_partitions()?;
    same_names()?;
    outside_tokio()?;
    Ok(())
}

// ANCHOR: no_sink
fn no_sink() -> Result<(), Box<dyn Error>> {
    let job = Job::new("no-sink");
    let _doubled = job.source(IterSource::new(vec![1, 2, 3])).map(|x: i32| x * 2);
    let err = job.plan().err().ok_or("expected a wiring error")?;
    assert_eq!(err.to_string(), "invalid pipeline `no-sink`: the job has no sink: end a stream with `.sink(...)`");
    Ok(())
}
// ANCHOR_END: no_sink

// ANCHOR: unconsumed
fn unconsumed() -> Result<(), Box<dyn Error>> {
    let job = Job::new("half-sunk");
    let orders = job.source(IterSource::new(vec![250i64, -5, 100])).name("orders");
    orders.filter(|cents: &i64| *cents >= 0).name("paid").sink(Blackhole::new());
    let _refunds = orders.filter(|cents: &i64| *cents < 0).name("refunds"); // never sunk
    let err = job.plan().err().ok_or("expected a wiring error")?;
    assert!(matches!(err, weibo::Error::Graph { .. }));
    assert_eq!(
        err.to_string(),
        "invalid pipeline `half-sunk`: the output of `refunds` is not consumed, so its records would be lost: \
         end the stream with a sink (for example `.sink(weibo::sinks::Blackhole::new())` to discard on purpose)"
    );
    Ok(())
}
// ANCHOR_END: unconsumed

// ANCHOR: dead_letters
fn unread_dead_letters() -> Result<(), Box<dyn Error>> {
    let job = Job::new("unread-dead-letters");
    let (numbers, _dead) = job
        .source(IterSource::new(vec!["1".to_string(), "x".to_string()]))
        .process(on_error::DeadLetter, |s: &String| s.parse::<u32>());
    numbers.sink(Blackhole::new());
    let err = job.plan().err().ok_or("expected a wiring error")?;
    assert_eq!(
        err.to_string(),
        "invalid pipeline `unread-dead-letters`: the dead letters of `process` are not consumed, so they would be lost: \
         end the stream with a sink (for example `.sink(weibo::sinks::Blackhole::new())` to discard on purpose)"
    );
    Ok(())
}
// ANCHOR_END: dead_letters

// ANCHOR: dropped_failures
fn dropped_failures() -> Result<(), Box<dyn Error>> {
    // Under `on_error::Drop` (or `Fail`) `process` has no dead-letter output: only its results need a sink.
    let job = Job::new("drop-failures");
    job.source(IterSource::new(vec!["1".to_string(), "x".to_string()]))
        .process(on_error::Drop, |s: &String| s.parse::<u32>())
        .sink(Blackhole::new());
    job.plan()?;
    Ok(())
}
// ANCHOR_END: dropped_failures

// ANCHOR: partitions
fn too_many_partitions() -> Result<(), Box<dyn Error>> {
    let job = Job::new("too-wide").with_max_key_groups(16);
    job.source(IterSource::new(vec![1u32, 2, 3])).key_by(|x: &u32| *x).with_partitions(32).sink(Blackhole::new());
    let err = job.plan().err().ok_or("expected a wiring error")?;
    assert_eq!(
        err.to_string(),
        "invalid pipeline `too-wide`: `partition` runs with 32 partitions, but partitions must be between 1 and \
         the job's 16 key groups (raise it with `Job::with_max_key_groups`)"
    );
    Ok(())
}
// ANCHOR_END: partitions

// ANCHOR: names
fn same_names() -> Result<(), Box<dyn Error>> {
    let job = Job::new("same-names");
    let numbers = job.source(IterSource::new(vec![1u32])).name("numbers");
    numbers.map(|x: u32| x + 1).name("numbers").sink(Blackhole::new());
    let err = job.plan().err().ok_or("expected a wiring error")?;
    assert_eq!(
        err.to_string(),
        "invalid pipeline `same-names`: two operators are named `numbers`: operator names must be unique in a job"
    );
    Ok(())
}
// ANCHOR_END: names

// ANCHOR: runtime
fn outside_tokio() -> Result<(), Box<dyn Error>> {
    let job = Job::new("outside-tokio");
    job.source(IterSource::new(vec![1u32])).sink(Blackhole::new());
    let err = job.spawn().err().ok_or("expected an error")?; // no tokio runtime on this thread
    assert!(matches!(err, weibo::Error::Runtime { .. }));
    assert_eq!(
        err.to_string(),
        "job `outside-tokio` cannot start: a job runs on tokio: call `run`/`spawn` inside a tokio runtime \
         (for example under #[tokio::main])"
    );
    Ok(())
}
// ANCHOR_END: runtime
