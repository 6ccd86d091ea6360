//! The book's "Wiring errors" chapter: the mistakes the compiler cannot see,
//! refused with `Error::Graph` before anything runs.
//!
//! Run it with `cargo run -p weibo-examples --example book_wiring`.

use std::error::Error;

use weibo::sinks::Blackhole;
use weibo::sources::IterSource;
use weibo::{Job, on_error};

fn main() -> Result<(), Box<dyn Error>> {
    no_sink()?;
    unread_dead_letters()?;
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
         sink them (for example `.sink(FileSink::json_lines(...))`)"
    );
    Ok(())
}
// ANCHOR_END: dead_letters

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
    assert!(err.to_string().ends_with("call `run`/`spawn` inside a tokio runtime (for example under #[tokio::main])"));
    Ok(())
}
// ANCHOR_END: runtime
