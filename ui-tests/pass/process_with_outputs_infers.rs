// A stateless process with side outputs needs no annotations: the record's
// type comes from the stream, the results' from `emit`, each side output's
// from its tag, and a closure that cannot fail returns nothing.
use weibo::on_error;
use weibo::process::OutputTag;

fn main() {
    let job = weibo::Job::new("outputs");
    let lines = job.source(weibo::sources::IterSource::new(vec!["3".to_string(), "-1".to_string()]));
    let negative = OutputTag::<i64>::new("negative");
    let words = OutputTag::<String>::new("words");
    // Infallible.
    let positive = lines.process_with_outputs(
        on_error::Fail,
        |outputs| (outputs.side_output(&negative), outputs.side_output(&words)),
        |ctx, (negative, words), line| match line.parse::<i64>() {
            Ok(n) if n < 0 => ctx.output(negative, n),
            Ok(n) => ctx.emit(n.unsigned_abs()),
            Err(_) => ctx.output(words, line.clone()),
        },
    );
    positive.side_output(&negative).sink(weibo::sinks::Blackhole::new());
    positive.side_output(&words).sink(weibo::sinks::Blackhole::new());
    positive.sink(weibo::sinks::Blackhole::new());
    // Fallible: the error type comes from the `Result` the closure returns.
    let (parsed, dead) = lines.process_with_outputs(
        on_error::DeadLetter,
        |outputs| outputs.side_output(&negative),
        |ctx, negative, line| {
            line.parse::<i64>().map(|n| if n < 0 { ctx.output(negative, n) } else { ctx.emit(n) })
        },
    );
    parsed.side_output(&negative).sink(weibo::sinks::Blackhole::new());
    parsed.sink(weibo::sinks::Blackhole::new());
    dead.sink(weibo::sinks::Blackhole::new());
}
