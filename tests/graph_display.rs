//! The logical graph and the fused plan print as readable text, pinned by
//! snapshots.

use weibo::sinks::{Blackhole, Stdout};
use weibo::sources::{Generator, IterSource};
use weibo::{Job, on_error};
use weibo_tests::{Account, Event};

fn job() -> Job {
    let job = Job::new("accounts").with_max_key_groups(64);
    let events = job
        .source(
            Generator::new(1000, |i| Event { account: Account((i % 10) as u16), amount: i as i64, seq: i as u32 })
                .with_partitions(2),
        )
        .name("events");
    let extra = job.source(IterSource::new(vec![Event { account: Account(1), amount: 5, seq: 0 }])).name("corrections");
    let (valid, dead) = events
        .union(&extra)
        .filter(|e: &Event| e.amount != 0)
        .process(on_error::DeadLetter, |e: &Event| if e.amount > 0 { Ok(e.clone()) } else { Err("negative") });
    dead.sink(Blackhole::new()).name("dead-letters");
    valid
        .key_by(|e: &Event| e.account)
        .with_partitions(3)
        .fold(|| 0i64, |sum: &mut i64, e: Event| *sum += e.amount)
        .name("balance")
        .map(|(account, sum): (Account, i64)| format!("{account:?}={sum}"))
        .sink(Stdout);
    job
}

#[test]
fn logical_graph_display() {
    insta::assert_snapshot!(job().to_string());
}

#[test]
fn fused_plan_display() {
    insta::assert_snapshot!(job().plan().unwrap());
}

/// Every wiring problem of a job is reported at once, each with its fix.
#[test]
fn every_wiring_problem_is_reported_at_once() {
    let job = weibo::Job::new("two-problems");
    let numbers = job.source(weibo::sources::IterSource::new(0..10u32)).name("numbers");
    // Not consumed.
    let _ = numbers.map(|n| n + 1).name("plus");
    // Named as another operator.
    numbers.sink(weibo::sinks::Blackhole::new()).name("numbers");
    let err = job.plan().unwrap_err().to_string();
    assert!(err.contains("2 wiring problems"), "{err}");
    assert!(err.contains("(1)") && err.contains("two operators are named `numbers`"), "{err}");
    assert!(err.contains("(2)") && err.contains("the output of `plus` is not consumed"), "{err}");
}

/// A `process` without a dead-letter output (`Drop`, `Fail`) shows none;
/// one with `DeadLetter` shows it.
#[test]
fn only_a_process_that_dead_letters_shows_a_dead_letter_output() {
    let job = Job::new("policies");
    let numbers = job.source(IterSource::new(0..10u32)).name("numbers");
    let failing = numbers.process(on_error::Fail, |n: &u32| Ok::<u32, String>(n + 1)).name("failing");
    let dropping = failing.process(on_error::Drop, |n: &u32| Ok::<u32, String>(n + 1)).name("dropping");
    let (kept, dead) = dropping.process(on_error::DeadLetter, |n: &u32| Ok::<u32, String>(n + 1));
    let kept = kept.name("lettering");
    kept.sink(Blackhole::new());
    dead.sink(Blackhole::new());
    let text = job.to_string();
    let line = |name: &str| text.lines().find(|l| l.contains(&format!("`{name}`"))).unwrap().to_string();
    assert!(!line("failing").contains("dead letters"), "{text}");
    assert!(!line("dropping").contains("dead letters"), "{text}");
    assert!(line("lettering").contains("dead letters: DeadLetter<u32>"), "{text}");
}
