// `reduce` needs a keyed stream.
fn main() {
    let job = weibo::Job::new("sums");
    let _ = job.source(weibo::sources::IterSource::new(vec![1u64, 2, 3])).reduce(|a: u64, b: u64| a + b);
}
