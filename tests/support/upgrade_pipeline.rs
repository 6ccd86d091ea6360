//! The pipeline of `tests/upgrade.rs`, the same in the build that wrote the
//! fixture `tests/fixtures/upgrade-442b4bc/` and in this one: its records
//! are std types only, so that no type name depends on the crate that
//! defines the pipeline. It uses every kind of state a checkpoint holds:
//! keyed values (`fold`), aligned windows with lateness (their firing
//! record), windows that keep their elements (`process`), sessions, and
//! timers; and a dead-letter output.

use std::time::Duration;

use weibo::Job;
use weibo::sinks::CollectSink;
use weibo::sources::Generator;
use weibo::time::WatermarkStrategy;
use weibo::window::{Count, Session, Tumbling, WindowContext, WindowResult};

/// Events in all; 10 keys.
pub const EVENTS: u64 = 20_000;

/// Event `i`: (key, event time in ms). 10 ms apart, with a pause of 1 s
/// after every 1,000 events, so that sessions close.
pub fn event(i: u64) -> (u64, u64) {
    (i % 10, i * 10 + (i / 1000) * 1000)
}

/// What the pipeline emits, by output.
pub struct Outputs {
    pub counts: CollectSink<(u64, u64)>,
    pub tumbling: CollectSink<WindowResult<u64, u64>>,
    pub sessions: CollectSink<WindowResult<u64, (u64, u64)>>,
    pub sizes: CollectSink<(u64, i64, u64)>,
    pub dead: CollectSink<weibo::DeadLetter<(u64, u64)>>,
}

/// Builds the pipeline into `job`; `rate` paces the source (events per
/// second).
pub fn pipeline(job: &Job, rate: Option<f64>) -> Outputs {
    let out = Outputs {
        counts: CollectSink::new(),
        tumbling: CollectSink::new(),
        sessions: CollectSink::new(),
        sizes: CollectSink::new(),
        dead: CollectSink::new(),
    };
    let mut generator = Generator::new(EVENTS, event);
    if let Some(rate) = rate {
        generator = generator.with_rate(rate);
    }
    let events = job.source(generator).with_timestamps(|e: &(u64, u64)| e.1 as i64, WatermarkStrategy::monotonous());
    let (ok, dead) = events.process(weibo::on_error::DeadLetter, |e: &(u64, u64)| {
        if e.0 == 7 && e.1 % 1000 == 70 { Err("every tenth event of key 7") } else { Ok(*e) }
    });
    dead.sink(out.dead.clone());
    let keyed = ok.key_by(|e: &(u64, u64)| e.0);
    keyed.fold(|| 0u64, |n, _| *n += 1).sink(out.counts.clone());
    keyed
        .window(Tumbling::of(Duration::from_secs(1)))
        .allowed_lateness(Duration::from_millis(500))
        .aggregate(Count)
        .sink(out.tumbling.clone());
    keyed
        .window(Session::with_gap(Duration::from_millis(500)))
        .reduce(|a, b| (a.0, a.1.max(b.1)))
        .sink(out.sessions.clone());
    keyed
        .window(Tumbling::of(Duration::from_secs(2)))
        .process(|ctx: &WindowContext<'_, u64>, values: &[(u64, u64)], out: &mut Vec<(u64, i64, u64)>| {
            out.push((*ctx.key, ctx.window.start, values.len() as u64));
        })
        .sink(out.sizes.clone());
    out
}
