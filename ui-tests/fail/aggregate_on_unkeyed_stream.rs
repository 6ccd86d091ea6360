// `aggregate` and `with_partitions` need a keyed stream.
fn main() {
    let job = weibo::Job::new("sums");
    let numbers = job.source(weibo::sources::IterSource::new(vec![1u64, 2, 3]));
    let _ = numbers.clone().with_partitions(4);
    let _ = numbers.aggregate(());
}
