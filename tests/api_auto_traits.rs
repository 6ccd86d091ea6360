//! Pins the auto traits of public handles: a change here is a breaking change.

fn send<T: Send>() {}
fn sync<T: Sync>() {}
fn static_error<T: std::error::Error + Send + Sync + 'static>() {}

#[test]
fn public_handles_keep_their_auto_traits() {
    send::<weibo::Job>();
    sync::<weibo::Job>();
    send::<weibo::Stream<String>>();
    sync::<weibo::Stream<String>>();
    send::<weibo::KeyedStream<u64, String>>();
    sync::<weibo::KeyedStream<u64, String>>();
    send::<weibo::JobHandle>();
    sync::<weibo::JobHandle>();
    send::<weibo::JobReport>();
    send::<weibo::sinks::CollectSink<String>>();
    sync::<weibo::sinks::CollectSink<String>>();
    send::<weibo::testing::TestJob>();
    static_error::<weibo::Error>();
    static_error::<weibo::codec::CodecError>();
    static_error::<weibo::key::KeyDecodeError>();
}

/// A job can be built on one thread and run on another (e.g. `tokio::spawn`).
#[test]
fn a_job_future_is_send() {
    fn send_future<F: std::future::Future + Send>(_: F) {}
    let job = weibo::Job::new("send");
    job.source(weibo::sources::IterSource::new(vec![1u8])).sink(weibo::sinks::CollectSink::new());
    send_future(job.run());
}
