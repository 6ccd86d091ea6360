//! Keyed results against a naive computation: random inputs, shuffled, on
//! 1..8 partitions.

use std::collections::BTreeMap;

use proptest::prelude::*;
use weibo::sources::{Generator, IterSource};
use weibo::testing::{self, TestJob};
use weibo::{KeyedContext, on_error};
use weibo_tests::{Account, Event};

/// (account, running count, running sum) as reduce emits it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
struct Running {
    account: Account,
    count: u32,
    sum: i64,
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec((0u16..20, -1000i64..1000), 0..400).prop_map(|v| {
        v.into_iter().enumerate().map(|(i, (a, amount))| Event { account: Account(a), amount, seq: i as u32 }).collect()
    })
}

/// Per account, the running (count, sum) after each of its events, in input order.
fn naive_running(input: &[Event]) -> BTreeMap<Account, Vec<(u32, i64)>> {
    let mut out: BTreeMap<Account, Vec<(u32, i64)>> = BTreeMap::new();
    for e in input {
        let seq = out.entry(e.account).or_default();
        let (c, s) = seq.last().copied().unwrap_or((0, 0));
        seq.push((c + 1, s + e.amount));
    }
    out
}

fn group(output: Vec<Running>) -> BTreeMap<Account, Vec<(u32, i64)>> {
    let mut out: BTreeMap<Account, Vec<(u32, i64)>> = BTreeMap::new();
    for r in output {
        out.entry(r.account).or_default().push((r.count, r.sum));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// One source partition: every key's updates arrive in input order, so
    /// the emitted running values equal the naive prefix sums exactly.
    #[test]
    fn reduce_matches_prefix_sums_per_key(
        input in events().prop_shuffle(),
        partitions in 1usize..=8,
        max_key_groups in prop::sample::select(vec![8u16, 16, 128]),
        on_disk in prop::bool::weighted(0.25),
    ) {
        let expected = naive_running(&input);
        let dir = tempfile::tempdir().unwrap();
        let mut t = TestJob::new("oracle").configure(|j| {
            let j = j.with_max_key_groups(max_key_groups).with_batch_size(7);
            if on_disk { j.with_state_backend(weibo::state::FjallBackend::open(dir.path()).unwrap()) } else { j }
        });
        let out = t.input(input.clone())
            .map(|e: Event| Running { account: e.account, count: 1, sum: e.amount })
            .key_by(|r: &Running| r.account)
            .with_partitions(partitions)
            .reduce(|a, b| Running { account: a.account, count: a.count + b.count, sum: a.sum + b.sum });
        let got = t.collect(&out);
        let report = t.run().unwrap();
        prop_assert_eq!(group(got.values()), expected);
        prop_assert_eq!(report.metrics.operator("reduce").unwrap().records_in, input.len() as u64);
    }

    /// Several source partitions: order across partitions is free, but each
    /// key's final value and number of updates are fixed.
    #[test]
    fn reduce_final_values_with_partitioned_source(
        input in events(),
        source_partitions in 1usize..=4,
        partitions in 1usize..=8,
    ) {
        let expected = naive_running(&input);
        let shared = input.clone();
        let got = testing::run_job(move |job| {
            job.source(Generator::new(shared.len() as u64, move |i| shared[i as usize].clone()).with_partitions(source_partitions))
                .key_by(|e: &Event| e.account)
                .with_partitions(partitions)
                .fold(|| (0u32, 0i64), |acc: &mut (u32, i64), e: Event| { acc.0 += 1; acc.1 += e.amount; })
        }).unwrap();
        let mut last: BTreeMap<Account, (u32, i64)> = BTreeMap::new();
        for (account, (count, sum)) in got {
            let entry = last.entry(account).or_insert((0, 0));
            if count > entry.0 { *entry = (count, sum); }
        }
        let want: BTreeMap<Account, (u32, i64)> =
            expected.iter().map(|(k, v)| (*k, *v.last().unwrap())).collect();
        prop_assert_eq!(last, want);
    }

    /// Keyed process with state: first-seen deduplication against a naive pass.
    #[test]
    fn keyed_process_dedup_matches_naive(input in events(), partitions in 1usize..=8) {
        let mut seen = std::collections::BTreeSet::new();
        let mut expected: Vec<Event> = input.iter().filter(|e| seen.insert(e.account)).cloned().collect();
        expected.sort();
        let mut got = testing::run(input, move |s| {
            s.key_by(|e: &Event| e.account).with_partitions(partitions).process(
                on_error::Fail,
                |ctx: &mut KeyedContext<'_, Account, (), Event>, e: &Event| {
                    if ctx.state().is_none() {
                        *ctx.state() = Some(());
                        ctx.emit(e.clone());
                    }
                    Ok::<(), String>(())
                },
            )
        }).unwrap();
        got.sort();
        prop_assert_eq!(got, expected);
    }
}

#[test]
fn keyed_sink_receives_every_record_once() {
    let sink = weibo::sinks::CollectSink::new();
    let job = weibo::Job::new("keyed-sink");
    job.source(IterSource::new(0..1000u32)).key_by(|x: &u32| x % 17).with_partitions(3).sink(sink.clone());
    testing::block_on(job.run()).unwrap();
    let mut got = sink.values();
    got.sort_unstable();
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
}

#[test]
fn too_many_partitions_is_a_wiring_error() {
    let err = testing::run(vec![1u8], |s| s.key_by(|x: &u8| *x).with_partitions(200).reduce(|a, _| a)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, weibo::Error::Graph { .. }), "{text}");
    assert!(text.contains("200 partitions") && text.contains("with_max_key_groups"), "{text}");
}

/// Min and max amount per account, as an [`weibo::Aggregate`].
struct Range;

impl weibo::Aggregate<Event> for Range {
    type Acc = Option<(i64, i64)>;
    type Out = (i64, i64);
    fn create(&self) -> Self::Acc {
        None
    }
    fn add(&self, acc: &mut Self::Acc, e: Event) {
        *acc = Some(acc.map_or((e.amount, e.amount), |(lo, hi)| (lo.min(e.amount), hi.max(e.amount))));
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        if let Some((lo, hi)) = other {
            *acc = Some(acc.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
        }
    }
    fn result(&self, acc: &Self::Acc) -> (i64, i64) {
        acc.unwrap_or((0, 0))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn aggregate_matches_naive_min_max(input in events(), partitions in 1usize..=8) {
        let mut want: BTreeMap<Account, (i64, i64)> = BTreeMap::new();
        for e in &input {
            let r = want.entry(e.account).or_insert((e.amount, e.amount));
            *r = (r.0.min(e.amount), r.1.max(e.amount));
        }
        let got = testing::run(input.clone(), move |s| s.key_by(|e: &Event| e.account).with_partitions(partitions).aggregate(Range)).unwrap();
        prop_assert_eq!(got.len(), input.len(), "one result per record");
        let mut last: BTreeMap<Account, (i64, i64)> = BTreeMap::new();
        for (account, range) in got {
            last.insert(account, range);
        }
        prop_assert_eq!(last, want);
    }
}
