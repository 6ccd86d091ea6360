//! File sources and sinks: offsets, line endings, and errors that name the
//! file and the position.

use std::io::Write;

use weibo::sinks::FileSink;
use weibo::sources::FileSource;
use weibo::{Error, testing};
use weibo_tests::{Account, Event};

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::File::create(&path).unwrap().write_all(text.as_bytes()).unwrap();
    path
}

#[test]
fn lines_carry_their_byte_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "in.txt", "alpha\r\nbeta\n\ngamma");
    let mut t = testing::TestJob::new("lines");
    let src = t.job().source(FileSource::lines(&path));
    // Turn each line into (line, offset) through a dead-letter side output.
    let (ok, dead) = src.process(weibo::on_error::DeadLetter, |_l: &String| Err::<(), _>("probe"));
    ok.sink(weibo::sinks::Blackhole::new());
    let dead = t.collect(&dead);
    t.run().unwrap();
    let got: Vec<(String, u64)> = dead.values().into_iter().map(|d| (d.record, d.position.offset)).collect();
    assert_eq!(got, vec![("alpha".into(), 0), ("beta".into(), 7), (String::new(), 12), ("gamma".into(), 13)]);
}

#[test]
fn json_lines_round_trip_through_the_file_sink() {
    let dir = tempfile::tempdir().unwrap();
    let input: Vec<Event> =
        (0..50).map(|i| Event { account: Account(i % 4), amount: i64::from(i) * 3, seq: u32::from(i) }).collect();
    let first = dir.path().join("first.jsonl");
    let job = weibo::Job::new("write");
    job.source(weibo::sources::IterSource::new(input.clone())).sink(FileSink::json_lines(&first));
    testing::block_on(job.run()).unwrap();

    let mut back = testing::run_job(|job| job.source(FileSource::<Event>::json_lines(&first))).unwrap();
    back.sort();
    let mut want = input;
    want.sort();
    assert_eq!(back, want);
}

#[test]
fn a_bad_json_line_names_file_line_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let first = r#"{"account":1,"amount":2,"seq":0}"#;
    let path = write(&dir, "bad.jsonl", &format!("{first}\n{{\"account\":oops}}\n"));
    let err = testing::run_job(|job| job.source(FileSource::<Event>::json_lines(&path))).unwrap_err();
    match &err {
        Error::Input { position, message } => {
            assert_eq!(
                position.offset,
                first.len() as u64 + 1,
                "the second line starts after the first and its newline"
            );
            assert!(
                message.contains("line 2") && message.contains("bad.jsonl") && message.contains("invalid JSON"),
                "{message}"
            );
        }
        other => panic!("expected Input, got {other:?}"),
    }
}

#[test]
fn a_line_that_is_not_utf8_is_refused_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latin1.txt");
    std::fs::write(&path, b"ok\ncaf\xe9\n").unwrap();
    let err = testing::run_job(|job| job.source(FileSource::lines(&path))).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("offset 3") && text.contains("line 2") && text.contains("not UTF-8"), "{text}");
}

#[test]
fn a_missing_file_names_its_path() {
    let err = testing::run_job(|job| job.source(FileSource::lines("/no/such/dir/input.txt"))).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(err.to_string().contains("/no/such/dir/input.txt"), "{err}");
}

#[test]
fn a_file_sink_used_by_a_second_job_starts_the_file_anew() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.jsonl");
    let sink = FileSink::json_lines(&path);
    for (run, n) in [(1, 5u32), (2, 3u32)] {
        let job = weibo::Job::new(format!("run-{run}"));
        job.source(weibo::sources::IterSource::new(0..n)).sink(sink.clone());
        testing::block_on(job.run()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), n as usize, "run {run} wrote a fresh file: {text:?}");
    }
}
