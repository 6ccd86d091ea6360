//! Window functions: what a window computes from its records.

use std::marker::PhantomData;

use super::contents::Elements;
use super::{Window, WindowResult};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::operator::Aggregate;

/// Counts records: an [`Aggregate`] for any record type.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Count, Tumbling};
/// let out = weibo::testing::run_timed(vec![(1, 'a'), (2, 'b'), (3, 'a')], |s| {
///     s.key_by(|c: &char| *c).window(Tumbling::of(Duration::from_secs(1))).aggregate(Count).into_stream()
/// })?;
/// let mut counts: Vec<(char, u64)> = out.iter().map(|r| (r.key, r.value)).collect();
/// counts.sort();
/// assert_eq!(counts, vec![('a', 2), ('b', 1)]);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Count;

impl<T> Aggregate<T> for Count {
    type Acc = u64;
    type Out = u64;
    fn create(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, _value: T) {
        *acc += 1;
    }
    fn merge(&self, acc: &mut u64, other: u64) {
        *acc += other;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
}

/// What a window `process` function sees besides the elements.
///
/// ```
/// use std::time::Duration;
/// use weibo::window::{Tumbling, WindowContext};
/// let out = weibo::testing::run_timed(vec![(10, 3u32), (20, 4)], |s| {
///     s.key_by(|_: &u32| "all".to_string())
///         .window(Tumbling::of(Duration::from_secs(1)))
///         .process(|ctx: &WindowContext<'_, String>, values: &[u32], out: &mut Vec<String>| {
///             out.push(format!("{} {}..{}: {}", ctx.key, ctx.window.start, ctx.window.end, values.iter().sum::<u32>()));
///         })
///         .into_stream()
/// })?;
/// assert_eq!(out, vec!["all 0..1000: 7".to_string()]);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Debug)]
pub struct WindowContext<'a, K> {
    /// The key.
    pub key: &'a K,
    /// The window that fired.
    pub window: Window,
}

/// A window function: how records fold into a window and what it emits.
pub(crate) trait WindowFn<K, T>: Send + Sync + 'static {
    type Acc: Data;
    type Out: Clone + Send + 'static;
    fn add(&self, acc: &mut Option<Self::Acc>, value: T);
    fn merge(&self, into: &mut Self::Acc, other: Self::Acc);
    fn fire(&self, key: &K, window: Window, acc: &Self::Acc, out: &mut Vec<Self::Out>);
    /// Told of each record too late for any window (a join counts it per
    /// input).
    fn late(&self, value: &T) {
        let _ = value;
    }
}

pub(crate) struct ReduceFn<F>(pub(crate) F);

impl<K: Key, T: Data, F: Fn(T, T) -> T + Send + Sync + 'static> WindowFn<K, T> for ReduceFn<F> {
    type Acc = T;
    type Out = WindowResult<K, T>;
    #[inline]
    fn add(&self, acc: &mut Option<T>, value: T) {
        *acc = Some(match acc.take() {
            Some(a) => (self.0)(a, value),
            None => value,
        });
    }
    fn merge(&self, into: &mut T, other: T) {
        let a = into.clone();
        *into = (self.0)(a, other);
    }
    #[inline]
    fn fire(&self, key: &K, window: Window, acc: &T, out: &mut Vec<Self::Out>) {
        out.push(WindowResult { key: key.clone(), window, value: acc.clone() });
    }
}

pub(crate) struct AggregateFn<G>(pub(crate) G);

impl<K: Key, T, G: Aggregate<T>> WindowFn<K, T> for AggregateFn<G> {
    type Acc = G::Acc;
    type Out = WindowResult<K, G::Out>;
    #[inline]
    fn add(&self, acc: &mut Option<G::Acc>, value: T) {
        let a = acc.get_or_insert_with(|| self.0.create());
        self.0.add(a, value);
    }
    fn merge(&self, into: &mut G::Acc, other: G::Acc) {
        self.0.merge(into, other);
    }
    #[inline]
    fn fire(&self, key: &K, window: Window, acc: &G::Acc, out: &mut Vec<Self::Out>) {
        out.push(WindowResult { key: key.clone(), window, value: self.0.result(acc) });
    }
}

pub(crate) struct ProcessFn<F, U>(pub(crate) F, pub(crate) PhantomData<fn() -> U>);

impl<K, T, U, F> WindowFn<K, T> for ProcessFn<F, U>
where
    K: Key,
    T: Data,
    U: Clone + Send + 'static,
    F: Fn(&WindowContext<'_, K>, &[T], &mut Vec<U>) + Send + Sync + 'static,
{
    type Acc = Elements<T>;
    type Out = U;
    fn add(&self, acc: &mut Option<Elements<T>>, value: T) {
        acc.get_or_insert_with(|| Elements(Vec::new())).0.push(value);
    }
    fn merge(&self, into: &mut Elements<T>, other: Elements<T>) {
        into.0.extend(other.0);
    }
    fn fire(&self, key: &K, window: Window, acc: &Elements<T>, out: &mut Vec<U>) {
        (self.0)(&WindowContext { key, window }, &acc.0, out);
    }
}

/// The window function of window joins and co-groups: a window keeps the
/// records of both inputs, in arrival order, and on firing `F` sees each
/// side's records apart.
pub(crate) struct CoGroupFn<F, L, R, U>(
    pub(crate) F,
    /// What the operator's metrics count of each input.
    pub(crate) std::sync::Arc<crate::metrics::TwoInputCounters>,
    pub(crate) PhantomData<fn(L, R) -> U>,
);

impl<K, L, R, U, F> WindowFn<K, crate::operator::connect::Either<L, R>> for CoGroupFn<F, L, R, U>
where
    K: Key,
    L: Data,
    R: Data,
    U: Clone + Send + 'static,
    F: Fn(&WindowContext<'_, K>, &[&L], &[&R], &mut Vec<U>) + Send + Sync + 'static,
{
    type Acc = Elements<crate::operator::connect::Either<L, R>>;
    type Out = U;
    fn add(&self, acc: &mut Option<Self::Acc>, value: crate::operator::connect::Either<L, R>) {
        acc.get_or_insert_with(|| Elements(Vec::new())).0.push(value);
    }
    fn merge(&self, into: &mut Self::Acc, other: Self::Acc) {
        into.0.extend(other.0);
    }
    fn fire(&self, key: &K, window: Window, acc: &Self::Acc, out: &mut Vec<U>) {
        use crate::operator::connect::Either;
        let (mut left, mut right) = (Vec::new(), Vec::new());
        for record in &acc.0 {
            match record {
                Either::Left(l) => left.push(l),
                Either::Right(r) => right.push(r),
            }
        }
        (self.0)(&WindowContext { key, window }, &left, &right, out);
    }
    fn late(&self, value: &crate::operator::connect::Either<L, R>) {
        let side = match value {
            crate::operator::connect::Either::Left(_) => 0,
            crate::operator::connect::Either::Right(_) => 1,
        };
        crate::metrics::TwoInputCounters::add(&self.1.late, side, 1);
    }
}
