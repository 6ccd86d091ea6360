// A sink built for `u64` on a stream of `String`.
fn main() {
    let job = weibo::Job::new("lines");
    let numbers = weibo::sinks::CollectSink::<u64>::new();
    job.source(weibo::sources::IterSource::new(vec!["a".to_string()])).sink(numbers);
}
