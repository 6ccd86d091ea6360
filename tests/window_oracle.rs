//! Every window kind against a naive batch computation of the same
//! semantics: random out-of-order input, every watermark strategy bound,
//! allowed lateness, 1..4 partitions and any batch size. The naive model
//! judges record `i` under the watermark of records `0..i`, exactly as the
//! design defines it, and reports late records too.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use weibo::testing::TestJob;
use weibo::time::WatermarkStrategy;
use weibo::window::{Session, Sliding, Tumbling, Window, WindowContext, WindowResult};

use weibo_tests::window_model::{Ev, Firing, Kind, Naive, naive};

fn input() -> impl Strategy<Value = Vec<Ev>> {
    prop::collection::vec((0u8..4, 0i64..6, 0i64..40, -50i64..50), 0..120).prop_map(|steps| {
        let mut base = -60i64;
        steps
            .into_iter()
            .enumerate()
            .map(|(i, (key, step, back, value))| {
                base += step;
                Ev { key, ts: base - back, value, seq: i as u32 }
            })
            .collect()
    })
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        (prop::sample::select(vec![1i64, 10, 25]), 0i64..10)
            .prop_map(|(size, o)| Kind::Tumbling { size, offset: o % size }),
        (prop::sample::select(vec![(20i64, 5i64), (20, 10), (10, 10), (6, 15)]), 0i64..5)
            .prop_map(|((size, slide), offset)| Kind::Sliding { size, slide, offset }),
        prop::sample::select(vec![1i64, 5, 10]).prop_map(|gap| Kind::Session { gap }),
    ]
}

#[allow(clippy::too_many_arguments)]
fn run(
    input: &[Ev],
    bound: i64,
    lateness: i64,
    kind: Kind,
    partitions: usize,
    batch: usize,
    with_late: bool,
    on_disk: bool,
) -> (Naive, u64) {
    let ms = |v: i64| Duration::from_millis(v as u64);
    let dir = tempfile::tempdir().unwrap();
    let mut t = TestJob::new("windows").configure(|j| {
        let j = j.with_batch_size(batch);
        if on_disk { j.with_state_backend(weibo::state::FjallBackend::open(dir.path()).unwrap()) } else { j }
    });
    let keyed = t
        .input(input.to_vec())
        .with_timestamps(|e: &Ev| e.ts, WatermarkStrategy::bounded_out_of_orderness(ms(bound)))
        .key_by(|e: &Ev| e.key)
        .with_partitions(partitions);
    let windowed = match kind {
        Kind::Tumbling { size, offset } => keyed.window(Tumbling::of(ms(size)).with_offset(ms(offset))),
        Kind::Sliding { size, slide, offset } => keyed.window(Sliding::of(ms(size), ms(slide)).with_offset(ms(offset))),
        Kind::Session { gap } => keyed.window(Session::with_gap(ms(gap))),
    }
    .allowed_lateness(ms(lateness));
    let out = windowed.process(|ctx: &WindowContext<'_, u8>, evs: &[Ev], out: &mut Vec<Firing>| {
        let mut seqs: Vec<u32> = evs.iter().map(|e| e.seq).collect();
        seqs.sort_unstable();
        out.push((*ctx.key, ctx.window.start, ctx.window.end, seqs));
    });
    let late = with_late.then(|| t.collect(&out.late_records()));
    let firings = t.collect(&out);
    let report = t.run().unwrap();
    let late_count = report.metrics.operator("window_process").unwrap().late;
    let mut got = Naive { firings: firings.sorted(), late: Vec::new() };
    if let Some(late) = late {
        got.late = late.values().into_iter().map(|e| e.seq).collect();
        got.late.sort_unstable();
    }
    (got, late_count)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn window_firings_and_late_records_match_the_naive_model(
        input in input(),
        bound in prop::sample::select(vec![0i64, 3, 20]),
        lateness in prop::sample::select(vec![0i64, 7, 30]),
        kind in kind(),
        partitions in 1usize..=4,
        batch in prop::sample::select(vec![1usize, 3, 64]),
        with_late in any::<bool>(),
        on_disk in prop::bool::weighted(0.25),
    ) {
        let want = naive(&input, bound, lateness, kind);
        let (got, late_count) = run(&input, bound, lateness, kind, partitions, batch, with_late, on_disk);
        prop_assert_eq!(&got.firings, &want.firings);
        prop_assert_eq!(late_count as usize, want.late.len());
        if with_late {
            prop_assert_eq!(&got.late, &want.late);
        }
    }
}

/// `reduce` and `aggregate` agree with `process` on the same windows.
#[test]
fn incremental_functions_agree_with_process() {
    let input: Vec<Ev> =
        (0..300).map(|i| Ev { key: (i % 3) as u8, ts: i64::from(i) * 7 % 500, value: i64::from(i), seq: i }).collect();
    let ms = Duration::from_millis;
    let build = |t: &mut TestJob| {
        t.input(input.clone())
            .with_timestamps(|e: &Ev| e.ts, WatermarkStrategy::bounded_out_of_orderness(ms(500)))
            .key_by(|e: &Ev| e.key)
            .with_partitions(2)
            .window(Sliding::of(ms(100), ms(50)))
    };
    let mut t = TestJob::new("three-ways");
    let reduced = build(&mut t).reduce(|a, b| Ev { value: a.value + b.value, ..a }).into_stream();
    let reduced = t.collect(&reduced);
    let counted = build(&mut t).aggregate(weibo::window::Count).into_stream();
    let counted = t.collect(&counted);
    let processed = build(&mut t)
        .process(|ctx: &WindowContext<'_, u8>, evs: &[Ev], out| {
            out.push((*ctx.key, ctx.window, evs.len() as u64, evs.iter().map(|e| e.value).sum::<i64>()));
        })
        .into_stream();
    let processed = t.collect(&processed);
    t.run().unwrap();
    let mut a: Vec<(u8, Window, u64, i64)> = Vec::new();
    let counts: BTreeMap<(u8, Window), u64> =
        counted.values().into_iter().map(|r: WindowResult<u8, u64>| ((r.key, r.window), r.value)).collect();
    for r in reduced.values() {
        a.push((r.key, r.window, counts[&(r.key, r.window)], r.value.value));
    }
    a.sort();
    let mut b = processed.values();
    b.sort();
    assert_eq!(a.len(), counts.len());
    assert_eq!(a, b);
}
