// A list state's handle used as a value state's.
fn main() {
    let job = weibo::Job::new("handles");
    let words = job.source(weibo::sources::IterSource::new(vec!["a".to_string()]));
    let _ = words.key_by(|w: &String| w.clone()).process_with_state(
        weibo::on_error::Fail,
        |states| states.list::<u32>("seen"),
        |ctx, seen, _w| {
            let n = ctx.value(seen).get();
            ctx.emit(n);
        },
    );
}
