// Floats are never keys.
fn main() {
    let job = weibo::Job::new("prices");
    let _ = job.source(weibo::sources::IterSource::new(vec![(1.5f64, 2u32)])).key_by(|p: &(f64, u32)| p.0);
}
