//! The three failure policies of `process`, each counting every record;
//! `process` and `try_filter` around records failing mid-batch;
//! `process_batch` with its records' times and positions, and its policies.

use weibo::testing::TestJob;
use weibo::{Error, KeyedContext, on_error};

/// 100 lines; every 7th is not a number.
fn lines() -> Vec<String> {
    (0..100).map(|i| if i % 7 == 3 { format!("bad-{i}") } else { i.to_string() }).collect()
}

fn bad_count() -> usize {
    (0..100).filter(|i| i % 7 == 3).count()
}

fn parse(line: &String) -> Result<u32, String> {
    line.parse::<u32>().map_err(|e| format!("`{line}` is not a number: {e}"))
}

#[test]
fn drop_policy_counts_what_it_drops() {
    let mut t = TestJob::new("drop");
    let out = t.input(lines()).process(on_error::Drop, parse).name("parse");
    let out = t.collect(&out);
    let report = t.run().unwrap();
    let parse = report.metrics.operator("parse").unwrap();
    assert_eq!(out.values().len(), 100 - bad_count());
    assert_eq!(parse.dropped, bad_count() as u64);
    assert_eq!(parse.records_in, 100);
    assert_eq!(parse.records_out + parse.dropped, 100, "every record is either emitted or counted as dropped");
}

#[test]
fn dead_letter_policy_keeps_record_error_and_position() {
    let mut t = TestJob::new("dead-letter");
    let input = t.input(lines()).name("lines");
    let (ok, dead) = input.process(on_error::DeadLetter, parse);
    let ok = t.collect(&ok);
    let dead = t.collect(&dead);
    let report = t.run().unwrap();
    let dead = dead.values();
    assert_eq!(ok.values().len() + dead.len(), 100);
    assert_eq!(dead.len(), bad_count());
    assert_eq!(report.metrics.operator("process").unwrap().dead_lettered, bad_count() as u64);
    for letter in &dead {
        let offset = letter.position.offset;
        assert_eq!(letter.record, format!("bad-{offset}"), "the record is the one at its offset");
        assert_eq!(letter.position.source, "lines");
        assert_eq!(letter.operator, "process");
        assert!(letter.error.contains("is not a number"), "{}", letter.error);
    }
}

#[test]
fn fail_policy_stops_the_job_naming_operator_source_and_offset() {
    let mut t = TestJob::new("fail");
    let out = t.input(lines()).name("lines").process(on_error::Fail, parse).name("parse");
    let collected = t.collect(&out);
    let err = t.run().unwrap_err();
    match &err {
        Error::RecordFailed { operator, position, message } => {
            assert_eq!(operator, "parse");
            assert_eq!(position.source, "lines");
            assert_eq!(position.offset, 3, "the first bad line");
            assert!(message.contains("bad-3"), "{message}");
        }
        other => panic!("expected RecordFailed, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("`parse`") && text.contains("`lines`") && text.contains("offset 3"), "{text}");
    assert!(collected.values().len() <= 3, "nothing after the failing record is emitted");
}

#[test]
fn a_dead_letter_stream_that_is_not_sunk_is_a_wiring_error() {
    let mut t = TestJob::new("unsunk");
    let (ok, _dead) = t.input(lines()).process(on_error::DeadLetter, parse);
    let _ = t.collect(&ok);
    let err = t.run().unwrap_err();
    assert!(matches!(err, Error::Graph { .. }), "{err}");
    assert!(err.to_string().contains("dead letters of `process` are not consumed"), "{err}");
}

/// Keyed `process` under the three policies: every record accounted for.
#[test]
fn keyed_process_policies_count_every_record() {
    // Sum per key; a negative amount is refused.
    fn sum(ctx: &mut KeyedContext<'_, u8, i64, (u8, i64)>, x: &i64) -> Result<(), String> {
        if *x < 0 {
            return Err(format!("negative amount {x}"));
        }
        let key = *ctx.key();
        let total = ctx.state().get_or_insert(0);
        *total += x;
        let out = (key, *total);
        ctx.emit(out);
        Ok(())
    }
    let input: Vec<i64> = (0..60).map(|i| if i % 5 == 0 { -i } else { i }).collect();
    let refused = input.iter().filter(|x| **x < 0).count();

    let mut t = TestJob::new("keyed-drop");
    let out = t
        .input(input.clone())
        .key_by(|x: &i64| (x.unsigned_abs() % 3) as u8)
        .with_partitions(2)
        .process(on_error::Drop, sum);
    let out = t.collect(&out);
    let m = t.run().unwrap().metrics;
    let op = m.operator("keyed_process").unwrap();
    assert_eq!(out.values().len() + op.dropped as usize, input.len());
    assert_eq!(op.dropped as usize, refused);

    let mut t = TestJob::new("keyed-dead");
    let (ok, dead) = t
        .input(input.clone())
        .key_by(|x: &i64| (x.unsigned_abs() % 3) as u8)
        .with_partitions(3)
        .process(on_error::DeadLetter, sum);
    let ok = t.collect(&ok);
    let dead = t.collect(&dead);
    t.run().unwrap();
    assert_eq!(ok.values().len() + dead.values().len(), input.len());
    let mut refused_records: Vec<i64> = dead.values().into_iter().map(|d| d.record).collect();
    refused_records.sort_unstable();
    let mut want: Vec<i64> = input.iter().copied().filter(|x| *x < 0).collect();
    want.sort_unstable();
    assert_eq!(refused_records, want);

    let mut t = TestJob::new("keyed-fail");
    let out = t.input(input).key_by(|x: &i64| (x.unsigned_abs() % 3) as u8).process(on_error::Fail, sum).name("sum");
    let _ = t.collect(&out);
    let err = t.run().unwrap_err();
    assert!(matches!(&err, Error::RecordFailed { operator, .. } if operator == "sum"), "{err}");
}

/// Records failing in the middle of a batch: those before and after
/// keep their order and their metadata, the failed ones become dead
/// letters naming their offsets (for `process`, whose results go out with
/// the batch's metadata until a record fails, and for `try_filter`).
#[test]
fn process_and_try_filter_keep_order_and_positions_around_failures() {
    let mut t = TestJob::new("failures");
    let input = t.input((0..20u32).collect::<Vec<_>>());
    let fails = |x: u32| x % 7 == 3;
    let (halves, dead) =
        input.process(on_error::DeadLetter, move |x: &u32| if fails(*x) { Err("seven") } else { Ok(x / 2) });
    let (evens, dead_evens) =
        input.try_filter(
            on_error::DeadLetter,
            move |x: &u32| if fails(*x) { Err("seven") } else { Ok(x.is_multiple_of(2)) },
        );
    let (halves, dead, evens, dead_evens) =
        (t.collect(&halves), t.collect(&dead), t.collect(&evens), t.collect(&dead_evens));
    t.run().unwrap();
    let ok: Vec<u32> = (0..20).filter(|x| !fails(*x)).collect();
    assert_eq!(halves.values(), ok.iter().map(|x| x / 2).collect::<Vec<_>>());
    assert_eq!(evens.values(), ok.iter().copied().filter(|x| x.is_multiple_of(2)).collect::<Vec<_>>());
    for letters in [dead.values(), dead_evens.values()] {
        let failed: Vec<(u32, u64)> = letters.iter().map(|d| (d.record, d.position.offset)).collect();
        assert_eq!(failed, vec![(3, 3), (10, 10), (17, 17)]);
    }
}

/// `process_batch` gives each result the event time and position of the
/// record it names, whatever the order or number of results per record.
#[test]
fn process_batch_results_take_their_records_time_and_position() {
    use weibo::BatchOutput;
    let input: Vec<(i64, u32)> = (0..50).map(|i| (1_000 + i * 10, i as u32)).collect();
    let out = weibo::testing::run_timed(input, |s| {
        // Record i gives i % 3 results, in reverse order of the batch.
        s.process_batch(on_error::Fail, |batch: &[u32], out: &mut BatchOutput<(u32, u32), String>| {
            for (i, v) in batch.iter().enumerate().rev() {
                for copy in 0..v % 3 {
                    out.emit(i, (*v, copy));
                }
            }
        })
        .key_by(|_: &(u32, u32)| 0u8)
        .process(on_error::Fail, |ctx: &mut KeyedContext<'_, u8, (), (u32, u32, i64)>, r: &(u32, u32)| {
            let ts = ctx.timestamp().unwrap_or(-1);
            ctx.emit((r.0, r.1, ts));
            Ok::<(), String>(())
        })
    })
    .unwrap();
    let mut got = out;
    got.sort();
    let mut want: Vec<(u32, u32, i64)> =
        (0..50u32).flat_map(|v| (0..v % 3).map(move |c| (v, c, 1_000 + i64::from(v) * 10))).collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn process_batch_failures_follow_the_policy() {
    use weibo::BatchOutput;
    let parse_all = |batch: &[String], out: &mut BatchOutput<u32, String>| {
        for (i, line) in batch.iter().enumerate() {
            match parse(line) {
                Ok(n) => out.emit(i, n),
                Err(e) => out.fail(i, e),
            }
        }
    };
    let mut t = TestJob::new("batch-dead-letter");
    let (ok, dead) = t.input(lines()).name("lines").process_batch(on_error::DeadLetter, parse_all);
    let (ok, dead) = (t.collect(&ok), t.collect(&dead));
    let report = t.run().unwrap();
    assert_eq!(ok.values().len(), 100 - bad_count());
    let dead = dead.values();
    assert_eq!(dead.len(), bad_count());
    assert_eq!((dead[0].record.as_str(), dead[0].position.offset), ("bad-3", 3));
    assert!(dead[0].error.contains("`bad-3` is not a number"), "{}", dead[0].error);
    assert_eq!(report.metrics.operator("process_batch").unwrap().dead_lettered, bad_count() as u64);

    let mut t = TestJob::new("batch-drop");
    let ok = t.input(lines()).process_batch(on_error::Drop, parse_all).name("parse");
    let ok = t.collect(&ok);
    let report = t.run().unwrap();
    assert_eq!(ok.values().len(), 100 - bad_count());
    assert_eq!(report.metrics.operator("parse").unwrap().dropped, bad_count() as u64);

    let mut t = TestJob::new("batch-fail");
    let ok = t.input(lines()).name("lines").process_batch(on_error::Fail, parse_all).name("parse");
    t.collect(&ok);
    match t.run().unwrap_err() {
        Error::RecordFailed { operator, position, message } => {
            assert_eq!((operator.as_str(), position.source.as_str(), position.offset), ("parse", "lines", 3));
            assert!(message.contains("bad-3"), "{message}");
        }
        other => panic!("expected RecordFailed, got {other:?}"),
    }

    // A result for a record the batch does not have is the function's bug:
    // the job fails saying so.
    let mut t = TestJob::new("batch-stray");
    let ok = t
        .input(lines())
        .process_batch(on_error::Fail, |batch: &[String], out: &mut BatchOutput<usize, String>| {
            out.emit(batch.len(), 0)
        })
        .name("stray");
    t.collect(&ok);
    let err = t.run().unwrap_err().to_string();
    assert!(err.contains("`stray`: the batch function gave record"), "{err}");
}
