//! What the tests of two-input operators (joins, broadcast state) share:
//! two inputs made from one harness input of `Either`s, so that a test
//! decides the order in which the operator sees the records of both; two
//! sides in time order as a proptest strategy; and the interleaving of
//! two sides with the watermark two sources would give.

use proptest::prelude::*;
use weibo::Stream;
use weibo::process::Either;
use weibo::record::Timestamp;
use weibo::testing::RunningHarness;

/// The records of `input` in two streams: the `Left`s and the `Right`s.
pub fn split<A: weibo::Data, B: weibo::Data>(input: &Stream<Either<A, B>>) -> (Stream<A>, Stream<B>) {
    let left = input.flat_map(|e: Either<A, B>| match e {
        Either::Left(a) => vec![a],
        Either::Right(_) => vec![],
    });
    let right = input.flat_map(|e: Either<A, B>| match e {
        Either::Left(_) => vec![],
        Either::Right(b) => vec![b],
    });
    (left, right)
}

/// A side: up to 23 records in time order (steps of 0 to 30 ms from
/// 1 000), keys 0 to 3, as (key, time).
pub fn side() -> impl Strategy<Value = Vec<(u8, i64)>> {
    proptest::collection::vec((0u8..4, 0i64..30), 0..24).prop_map(|steps| {
        let mut at = 1_000;
        steps
            .into_iter()
            .map(|(key, step)| {
                at += step;
                (key, at)
            })
            .collect()
    })
}

/// Pushes `lefts` and `rights` (each in time order, with their times) into
/// `run`, taking from one side or the other as `order` says (cycled; a
/// side that has ended gives way), and after each record the watermark two
/// sources would give: the lower of the sides' latest times minus one,
/// where a side not seen yet holds it back and one that has ended does not.
///
/// # Panics
/// When the harness refuses a record or a watermark (a test's failure).
pub fn interleave<A: Clone + Send + 'static, B: Clone + Send + 'static>(
    run: &mut RunningHarness<Either<A, B>>,
    lefts: &[(A, Timestamp)],
    rights: &[(B, Timestamp)],
    order: &[bool],
) {
    let (mut li, mut ri) = (0, 0);
    let (mut left_seen, mut right_seen) = (None, None);
    let mut turns = order.iter().copied().cycle();
    while li < lefts.len() || ri < rights.len() {
        let take_left = ri >= rights.len() || (li < lefts.len() && turns.next().unwrap_or(true));
        let (record, at) = match (take_left, lefts.get(li), rights.get(ri)) {
            (true, Some((l, at)), _) => {
                li += 1;
                left_seen = Some(*at);
                (Either::Left(l.clone()), *at)
            }
            (false, _, Some((r, at))) => {
                ri += 1;
                right_seen = Some(*at);
                (Either::Right(r.clone()), *at)
            }
            _ => unreachable!("a side is taken only while it has records"),
        };
        run.push(record, at).expect("the harness takes the record");
        let mark =
            |seen: Option<Timestamp>, ended: bool| if ended { i64::MAX } else { seen.map_or(i64::MIN, |t| t - 1) };
        let wm = mark(left_seen, li >= lefts.len()).min(mark(right_seen, ri >= rights.len()));
        if wm != i64::MIN && wm != i64::MAX {
            run.watermark(wm).expect("the harness takes the watermark");
        }
    }
}
