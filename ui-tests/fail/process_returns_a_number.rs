// A keyed process closure that returns a number instead of `()` or a
// `Result`.
fn main() {
    let job = weibo::Job::new("counts");
    let words = job.source(weibo::sources::IterSource::new(vec!["a".to_string()]));
    let _ = words.key_by(|w: &String| w.clone()).process(weibo::on_error::Fail, |ctx, _w| {
        ctx.emit(1u64);
        ctx.state().get_or_insert(0u32);
        1
    });
}
