// Two keyed streams connected by keys of two types: the records of one key
// could never meet those of the other.
fn main() {
    let job = weibo::Job::new("enrich");
    let orders = job.source(weibo::sources::IterSource::new(vec![(1u32, 250u64)]));
    let names = job.source(weibo::sources::IterSource::new(vec![("1".to_string(), "Ada".to_string())]));
    let _ = orders
        .key_by(|o: &(u32, u64)| o.0)
        .connect(&names.key_by(|c: &(String, String)| c.0.clone()));
}
