// Keyed process closures need no annotations: the context's types come
// from the stream, the state's and output's from their use, and a closure
// that cannot fail returns nothing.
use weibo::on_error;

fn main() {
    let job = weibo::Job::new("closures");
    let clicks = job.source(weibo::sources::IterSource::new(vec![("u1".to_string(), 3u32)]));
    let keyed = clicks.key_by(|c: &(String, u32)| c.0.clone());
    // One state slot, infallible.
    let totals = keyed.process(on_error::Fail, |ctx, c| {
        let total = ctx.state().get_or_insert(0u32);
        *total += c.1;
        let total = *total;
        let line = format!("{}: {total}", ctx.key());
        ctx.emit(line);
    });
    totals.sink(weibo::sinks::Blackhole::new());
    // Fallible: the error type comes from the `Err` it returns.
    let checked = keyed.process(on_error::Drop, |ctx, c| {
        if c.1 == 0 {
            return Err(format!("no clicks from {}", c.0));
        }
        *ctx.state().get_or_insert(0u64) += 1;
        ctx.emit(c.1);
        Ok(())
    });
    checked.sink(weibo::sinks::Blackhole::new());
    // No state at all: `process_with_state` declaring none.
    let stateless = keyed.process_with_state(on_error::Fail, |_| (), |ctx, (), c| ctx.emit(c.1));
    stateless.sink(weibo::sinks::Blackhole::new());
    // Named states.
    let named = keyed.process_with_state(
        on_error::Fail,
        |states| (states.list::<u32>("clicks"), states.map::<String, u64>("per_page")),
        |ctx, (clicks, pages), c| {
            ctx.list(clicks).add(c.1);
            ctx.map(pages).update(c.0.clone(), |n| *n = Some(n.unwrap_or(0) + 1));
            let seen = ctx.list(clicks).get().len();
            ctx.emit(seen);
        },
    );
    named.sink(weibo::sinks::Blackhole::new());
}
