// A value type with no codec cannot cross the shuffle edge of `key_by`.
#[derive(Clone)]
struct Click {
    user: u64,
}

fn main() {
    let job = weibo::Job::new("clicks");
    let _ = job.source(weibo::sources::IterSource::new(vec![Click { user: 1 }])).key_by(|c: &Click| c.user);
}
