//! Errors keep their cause and say who is to blame: a damaged checkpoint
//! keeps the decoder's error, a state directory that cannot be read keeps
//! the operating system's, a request a job cannot serve is refused, and
//! every wiring problem is reported at once.

use std::error::Error as _;
use std::time::Duration;

use weibo::error::Blame;
use weibo::sinks::CollectSink;
use weibo::sources::IterSource;
use weibo::{Error, Job};

fn counting(job: &Job, out: &CollectSink<(u32, u64)>) {
    job.source(IterSource::new(0..100u32)).key_by(|x: &u32| x % 7).fold(|| 0u64, |n, _| *n += 1).sink(out.clone());
}

#[test]
fn a_damaged_manifest_keeps_the_decoders_error() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("chk-00000000000000000001");
    std::fs::create_dir_all(&checkpoint).unwrap();
    std::fs::write(checkpoint.join("MANIFEST"), b"{ not json").unwrap();
    let job = Job::new("damaged").restore_from(&checkpoint);
    counting(&job, &CollectSink::new());
    let err = weibo::testing::block_on(job.run()).unwrap_err();
    assert_eq!(err.blame(), Blame::Checkpoint, "{err}");
    assert!(matches!(err, Error::Checkpoint { .. }), "{err:?}");
    let cause = err.source().expect("the decoder's error is kept");
    assert!(cause.downcast_ref::<serde_json::Error>().is_some(), "{cause:?}");
    let text = err.to_string();
    assert!(text.contains("chk-00000000000000000001") && text.contains("not a valid manifest"), "{text}");
    assert!(!text.contains(&cause.to_string()), "the message leaves its cause to source(): {text}");
    assert_eq!(err.report().to_string(), format!("{text}: {cause}"));
}

/// A reporter that walks `source()` (as anyhow's `{:#}` does) prints each
/// cause once, through a layer of context too, which keeps the blame of
/// the error beneath it.
#[test]
fn a_chain_walker_prints_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let err = weibo::state::FjallBackend::open(&file).unwrap_err().context("opening the state of job `orders`");
    assert_eq!(err.blame(), Blame::State, "{err}");
    assert!(matches!(err.find_root(), Error::State { .. }), "{err:?}");
    assert_eq!(err.to_string(), "opening the state of job `orders`");
    let mut chain = Vec::new();
    let mut link: Option<&dyn std::error::Error> = Some(&err);
    while let Some(e) = link {
        chain.push(e.to_string());
        link = e.source();
    }
    assert!(chain.len() >= 3, "context, the state error and the OS error: {chain:?}");
    for (i, outer) in chain.iter().enumerate() {
        for inner in chain.iter().skip(i + 1) {
            assert!(!outer.contains(inner.as_str()), "{outer:?} repeats its cause {inner:?}");
        }
    }
    assert_eq!(err.report().to_string(), chain.join(": "));
}

#[test]
fn a_state_directory_that_cannot_be_read_keeps_the_os_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let err = weibo::state::FjallBackend::open(&file).unwrap_err();
    assert_eq!(err.blame(), Blame::State, "{err}");
    let cause = err.source().expect("the I/O error is kept");
    assert!(cause.downcast_ref::<std::io::Error>().is_some(), "{cause:?}");
    assert!(err.to_string().contains("not-a-directory"), "{err}");
}

#[test]
fn requests_a_job_cannot_serve_are_refused() {
    weibo::testing::block_on(async {
        let job = Job::new("no-checkpoints");
        job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(1000.0))
            .sink(weibo::sinks::Blackhole::new());
        let handle = job.spawn().unwrap();
        let err = handle.savepoint("now").await.unwrap_err();
        assert!(matches!(err, Error::Refused { .. }), "{err:?}");
        assert_eq!(err.blame(), Blame::Request);
        assert!(err.to_string().contains("with_checkpoints"), "{err}");
        tokio::time::sleep(Duration::from_millis(10)).await;
        handle.cancel().await.unwrap();
    });
}

#[test]
fn every_wiring_problem_is_reported_at_once_and_blamed_on_the_wiring() {
    let job = Job::new("two-problems").with_max_key_groups(4);
    let s = job.source(IterSource::new(0..10u32));
    s.map(|x| x + 1); // never consumed
    s.key_by(|x: &u32| *x).with_partitions(9).reduce(|a, b| a + b).sink(CollectSink::new());
    let err = job.plan().unwrap_err();
    assert_eq!(err.blame(), Blame::Wiring);
    let text = err.to_string();
    assert!(text.contains("2 wiring problems"), "{text}");
    assert!(text.contains("the output of `map` is not consumed"), "{text}");
    assert!(text.contains("runs with 9 partitions"), "{text}");
}

#[test]
fn bad_input_is_blamed_on_the_data_and_names_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.jsonl");
    std::fs::write(&path, "{\"n\": 1}\n{\"n\": oops}\n").unwrap();
    #[derive(Clone, Debug, serde::Deserialize)]
    struct N {
        #[allow(dead_code)]
        n: u32,
    }
    let job = Job::new("bad-input");
    job.source(weibo::sources::FileSource::<N>::json_lines(&path)).sink(weibo::sinks::Blackhole::new());
    let err = weibo::testing::block_on(job.run()).unwrap_err();
    assert_eq!(err.blame(), Blame::Data, "{err}");
    let text = err.to_string();
    assert!(text.contains("in.jsonl") && text.contains("line 2"), "{text}");
}
