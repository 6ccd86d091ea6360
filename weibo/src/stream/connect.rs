//! Connected streams: two keyed streams of different types, one operator
//! that reads both with shared keyed state.

use std::sync::Arc;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::operator::connect::{CoProcess, Either, KeyedCoProcessFunction};
use crate::operator::function::{ProcessContext, ProcessOutcome, States, Timer};
use crate::stream::{KeyedStream, on_error};

/// Two keyed streams connected for one operator of two inputs (Flink's
/// `ConnectedStreams` of two keyed streams): made by
/// [`KeyedStream::connect`], run by a function with a case per input.
///
/// Both inputs are keyed by the same key type, and a key's records of
/// either input reach the same instance, with the same states and
/// timers. The operator's watermark is the minimum of both inputs' (an
/// input marked idle, or ended, holds nothing back); a checkpoint's
/// barrier is aligned across both; the operator ends when both inputs
/// have.
///
/// ```
/// use weibo::on_error;
///
/// // Orders wait for their customer's name; names are remembered.
/// let mut t = weibo::testing::TestJob::new("enrich");
/// let orders = t.input(vec![(1u32, 250u64), (2, 90), (1, 40)]).key_by(|o: &(u32, u64)| o.0);
/// let names = t.input(vec![(1u32, "Ada".to_string()), (2, "Lin".to_string())]).key_by(|c: &(u32, String)| c.0);
/// let enriched = orders.connect(&names).process_with_state(
///     on_error::Fail,
///     |states| (states.value::<String>("name"), states.list::<u64>("waiting")),
///     |ctx, (name, waiting), order| match ctx.value(name).get() {
///         Some(n) => ctx.emit((n, order.1)),
///         None => ctx.list(waiting).add(order.1),
///     },
///     |ctx, (name, waiting), customer| {
///         ctx.value(name).set(customer.1.clone());
///         for amount in ctx.list(waiting).get() {
///             ctx.emit((customer.1.clone(), amount));
///         }
///         ctx.list(waiting).clear();
///     },
/// );
/// let out = t.collect(&enriched);
/// t.run()?;
/// let mut got = out.values();
/// got.sort();
/// assert_eq!(got, [("Ada".to_string(), 40), ("Ada".to_string(), 250), ("Lin".to_string(), 90)]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct ConnectedStreams<K, A, B> {
    pub(crate) keyed: KeyedStream<K, Either<A, B>>,
}

impl<K, A, B> Clone for ConnectedStreams<K, A, B> {
    fn clone(&self) -> Self {
        Self { keyed: self.keyed.clone() }
    }
}

impl<K: Key, A: Data> KeyedStream<K, A> {
    /// Connects this keyed stream (the first input) with `other` (the
    /// second), keyed by the same key type, for one operator that reads
    /// both: see [`ConnectedStreams`]. The operator runs on the larger of
    /// the two streams' [`with_partitions`](Self::with_partitions), unless
    /// [`ConnectedStreams::with_partitions`] sets it.
    pub fn connect<B: Data>(&self, other: &KeyedStream<K, B>) -> ConnectedStreams<K, A, B> {
        let (first, second) = (self.key.clone(), other.key.clone());
        let left = self.upstream().map(Either::<A, B>::Left);
        let right = other.upstream().map(Either::<A, B>::Right);
        for (stream, name) in [(&left, "connect: first input"), (&right, "connect: second input")] {
            stream.lock().default_name(stream.node, name);
        }
        let keyed = left
            .merge(&right, "connect")
            .key_by(move |r: &Either<A, B>| match r {
                Either::Left(a) => first(a),
                Either::Right(b) => second(b),
            })
            .with_partitions(self.partitions.max(other.partitions));
        ConnectedStreams { keyed }
    }
}

impl<K: Key, A: Data, B: Data> ConnectedStreams<K, A, B> {
    /// Runs the operator on `n` instances (each owning a range of key
    /// groups).
    #[must_use]
    pub fn with_partitions(self, n: usize) -> Self {
        Self { keyed: self.keyed.with_partitions(n) }
    }

    /// A two-input function with named state as a type: `declare` gets the
    /// [`States`] to declare on and returns the function, which keeps the
    /// handles. Its dead letters are [`Either`]s.
    pub fn process_function<F, D, P>(&self, policy: P, declare: D) -> P::Output
    where
        D: FnOnce(&mut States<K>) -> F,
        F: KeyedCoProcessFunction<K, A, B>,
        P: on_error::OnError<Either<A, B>, F::Out>,
    {
        self.keyed.process_function(policy, |states| CoProcess(declare(states)))
    }

    /// A two-input function with named state, as closures: `declare`
    /// declares the states and returns their handles; `first` runs per
    /// record of the first input, `second` per record of the second, each
    /// with the key's context and the handles.
    pub fn process_with_state<S, U, R, D, F1, F2, P>(&self, policy: P, declare: D, first: F1, second: F2) -> P::Output
    where
        S: Send + Sync + 'static,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        D: FnOnce(&mut States<K>) -> S,
        F1: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &A) -> R + Send + Sync + 'static,
        F2: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &B) -> R + Send + Sync + 'static,
        P: on_error::OnError<Either<A, B>, U>,
    {
        self.process_with_state_and_timers(
            policy,
            declare,
            first,
            second,
            |_: &mut ProcessContext<'_, K, U>, _: &S, _| R::nothing(),
        )
    }

    /// Like [`process_with_state`](Self::process_with_state), with timers:
    /// `on_timer` runs, with the key's context and the handles, for each
    /// timer either side (or `on_timer`) set, when it fires.
    pub fn process_with_state_and_timers<S, U, R, D, F1, F2, G, P>(
        &self,
        policy: P,
        declare: D,
        first: F1,
        second: F2,
        on_timer: G,
    ) -> P::Output
    where
        S: Send + Sync + 'static,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        D: FnOnce(&mut States<K>) -> S,
        F1: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &A) -> R + Send + Sync + 'static,
        F2: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &B) -> R + Send + Sync + 'static,
        G: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, Timer) -> R + Send + Sync + 'static,
        P: on_error::OnError<Either<A, B>, U>,
    {
        let both = Arc::new((first, second));
        self.keyed.process_with_state_and_timers(
            policy,
            declare,
            move |ctx: &mut ProcessContext<'_, K, U>, states: &S, record: &Either<A, B>| match record {
                Either::Left(a) => (both.0)(ctx, states, a),
                Either::Right(b) => (both.1)(ctx, states, b),
            },
            on_timer,
        )
    }
}
