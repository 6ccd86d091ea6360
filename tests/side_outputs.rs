//! Typed side outputs from a stateless `process`, and dead letters and
//! late records read as side outputs by their own tags: each a stream of
//! its own type, every record in exactly one place, barriers passed on to
//! every side output, and each misuse a wiring error naming it.

use std::time::Duration;

use weibo::process::OutputTag;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo::testing::TestJob;
use weibo::window::{Count, Tumbling};
use weibo::{DeadLetter, Job, on_error};

/// Lines: numbers, some negative, some not numbers at all.
fn lines() -> Vec<String> {
    (0..60)
        .map(|i| match i % 6 {
            1 => format!("-{i}"),
            4 => format!("x{i}"),
            _ => i.to_string(),
        })
        .collect()
}

/// A stateless `process` sends each record to exactly one of its results,
/// two side outputs of different types and its dead letters (read by their
/// tag); the operator counts what it emitted to each.
#[test]
fn a_stateless_process_splits_records_by_tag_and_type() {
    let mut t = TestJob::new("split");
    let negative = OutputTag::<i64>::new("negative");
    let zeros = OutputTag::<String>::new("zero");
    let positive = t
        .input(lines())
        .process_with_outputs(
            on_error::DeadLetter,
            |outputs| (outputs.side_output(&negative), outputs.side_output(&zeros)),
            |ctx, (negative, zeros), line: &String| {
                let n: i64 = line.parse().map_err(|_| format!("`{line}` is not a number"))?;
                match n {
                    0 => ctx.output(zeros, format!("zero at {line}")),
                    n if n < 0 => ctx.output(negative, n),
                    n => ctx.emit(u64::try_from(n).map_err(|e| e.to_string())?),
                }
                Ok::<(), String>(())
            },
        )
        .0
        .name("split");
    let (negatives, zeros, dead) = (
        positive.side_output(&negative),
        positive.side_output(&zeros),
        positive.side_output(&OutputTag::<DeadLetter<String>>::dead_letters()),
    );
    let plan = t.job().to_string();
    assert!(plan.contains("negative: i64") && plan.contains("zero: String"), "{plan}");
    let (positive, negatives, zeros, dead) =
        (t.collect(&positive), t.collect(&negatives), t.collect(&zeros), t.collect(&dead));
    let report = t.run().unwrap();

    let expected = lines();
    let numbers: Vec<i64> = expected.iter().filter_map(|l| l.parse().ok()).collect();
    assert_eq!(positive.sorted(), numbers.iter().filter(|n| **n > 0).map(|n| *n as u64).collect::<Vec<_>>());
    let mut want_negative: Vec<i64> = numbers.iter().filter(|n| **n < 0).copied().collect();
    want_negative.sort_unstable();
    assert_eq!(negatives.sorted(), want_negative);
    assert_eq!(zeros.values(), ["zero at 0"]);
    let letters = dead.values();
    let mut bad: Vec<String> = letters.iter().map(|d| d.record.clone()).collect();
    bad.sort();
    let mut want_bad: Vec<String> = expected.iter().filter(|l| l.starts_with('x')).cloned().collect();
    want_bad.sort();
    assert_eq!(bad, want_bad);
    assert!(letters.iter().all(|d| d.error.contains("is not a number") && d.operator == "split"), "{letters:?}");

    let split = report.metrics.operator("split").unwrap();
    assert_eq!(split.records_in, 60);
    assert_eq!(split.dead_lettered, want_bad.len() as u64);
    // Results and side outputs count as the operator's output.
    let sent = (positive.values().len() + negatives.values().len() + zeros.values().len()) as u64;
    assert_eq!(split.records_out, sent);
    assert_eq!(sent + split.dead_lettered, 60, "every record went to exactly one place");
}

/// The dead letters by tag are the same stream as the second one
/// `on_error::DeadLetter` returns, for the plain `process` too.
#[test]
fn dead_letters_by_tag_are_the_policys_second_stream() {
    let mut t = TestJob::new("dead");
    let (numbers, dead) = t.input(lines()).process(on_error::DeadLetter, |l: &String| l.parse::<i64>());
    let tagged = numbers.side_output(&OutputTag::<DeadLetter<String>>::dead_letters());
    let (numbers, dead, tagged) = (t.collect(&numbers), t.collect(&dead), t.collect(&tagged));
    t.run().unwrap();
    let records = |letters: Vec<DeadLetter<String>>| {
        let mut r: Vec<String> = letters.into_iter().map(|d| d.record).collect();
        r.sort();
        r
    };
    assert_eq!(numbers.values().len() + dead.values().len(), 60);
    assert!(!dead.values().is_empty());
    assert_eq!(records(dead.values()), records(tagged.values()));
}

/// A window's late records by tag are what `late_records` gives.
#[test]
fn late_records_by_tag() {
    let mut t = TestJob::new("late");
    let timed = t
        .input(vec![(100i64, 'a'), (5_000, 'b'), (20, 'c'), (5_100, 'd'), (30, 'e')])
        .with_timestamps(|r: &(i64, char)| r.0, weibo::time::WatermarkStrategy::monotonous());
    let counts = timed.key_by(|_: &(i64, char)| 0u8).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count);
    let late = t.collect(&counts.side_output(&OutputTag::<(i64, char)>::late_records()));
    let counts = t.collect(&counts);
    t.run().unwrap();
    assert_eq!(late.sorted(), [(20, 'c'), (30, 'e')]);
    assert_eq!(counts.values().iter().map(|r| r.value).sum::<u64>(), 3);
}

/// Each misuse of a tag is a wiring error that names it: a tag the
/// operator does not send to, the right tag read as another type, dead
/// letters of a `process` that does not dead-letter, a name declared twice
/// or taken by the operator's own outputs.
#[test]
fn misused_tags_are_wiring_errors() {
    let run = |wire: &dyn Fn(&mut TestJob)| -> String {
        let mut t = TestJob::new("misuse");
        wire(&mut t);
        t.run().map(|_| String::new()).unwrap_or_else(|e| e.to_string())
    };
    let stranger = OutputTag::<u32>::new("stranger");
    let err = run(&|t| {
        let out = t.input(vec![1u32]).process_with_outputs(on_error::Fail, |_| (), |ctx, (), x: &u32| ctx.emit(*x));
        let s = out.side_output(&stranger);
        t.collect(&s);
    });
    assert!(err.contains("side output `stranger` is not an output"), "{err}");

    let err = run(&|t| {
        let (out, _dead) = t.input(vec!["1".to_string()]).process(on_error::DeadLetter, |l: &String| l.parse::<u32>());
        let s = out.side_output(&OutputTag::<DeadLetter<u64>>::dead_letters());
        t.collect(&s);
    });
    assert!(
        err.contains("side output `dead letters` carries") && err.contains("DeadLetter<alloc::string::String>"),
        "{err}"
    );

    let err = run(&|t| {
        let out = t.input(vec!["1".to_string()]).process(on_error::Fail, |l: &String| l.parse::<u32>());
        let s = out.side_output(&OutputTag::<DeadLetter<String>>::dead_letters());
        t.collect(&s);
    });
    assert!(err.contains("dead letters are a side output only of a `process` under `on_error::DeadLetter`"), "{err}");

    for name in ["twice", "output", "dead letters"] {
        let err = run(&|t| {
            let (a, b) = (OutputTag::<u32>::new(name), OutputTag::<u32>::new("twice"));
            let out = t.input(vec![1u32]).process_with_outputs(
                on_error::Fail,
                |outputs| (outputs.side_output(&a), outputs.side_output(&b)),
                |ctx, _, x: &u32| ctx.emit(*x),
            );
            t.collect(&out);
        });
        assert!(err.contains("is declared twice or takes the name of another output"), "{name}: {err}");
    }
}

/// Sending to a tag the operator did not declare stops the job with an
/// error naming the tag (a record is never silently lost).
#[test]
fn sending_to_an_undeclared_tag_fails_the_job() {
    let mut t = TestJob::new("undeclared");
    let declared = OutputTag::<u32>::new("declared");
    let other = OutputTag::<u32>::new("other");
    let out = t.input(vec![1u32, 2]).process_with_outputs(
        on_error::Drop,
        |outputs| outputs.side_output(&declared),
        move |ctx, _declared, x: &u32| {
            ctx.output(&other, *x);
            ctx.emit(*x);
        },
    );
    t.collect(&out);
    let err = t.run().unwrap_err().to_string();
    assert!(err.contains("side output `other` was used on an operator that did not declare it"), "{err}");
}

/// Checkpoints complete while records go to side outputs: the barrier
/// goes down every side output (here to a keyed task beyond a hash edge,
/// which acknowledges a checkpoint only once it has it), and each
/// output's records arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_pass_through_side_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("sides-checkpointed").with_checkpoints(dir.path(), Duration::from_secs(3600));
    let odd = OutputTag::<String>::new("odd");
    let evens = job.source(Generator::new(u64::MAX, |i| i).with_rate(20_000.0)).process_with_outputs(
        on_error::Fail,
        |outputs| outputs.side_output(&odd),
        |ctx, odd, x: &u64| {
            if x % 2 == 1 {
                ctx.output(odd, format!("odd {x}"));
            } else {
                ctx.emit(*x);
            }
        },
    );
    let (even_sink, odd_sink) = (CollectSink::new(), CollectSink::new());
    // Across a hash edge: the keyed task acknowledges a checkpoint only once
    // the barrier has come down the side output.
    evens
        .side_output(&odd)
        .key_by(|s: &String| s.len() as u64)
        .with_partitions(2)
        .reduce(|_, latest| latest)
        .sink(odd_sink.clone());
    evens.sink(even_sink.clone());
    let handle = job.spawn().unwrap();
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(60), handle.checkpoint()).await.unwrap().unwrap();
    }
    handle.abort();
    assert!(even_sink.values().iter().all(|x| x % 2 == 0) && !even_sink.values().is_empty());
    assert!(odd_sink.values().iter().all(|s| s.starts_with("odd ")) && !odd_sink.values().is_empty());
}
