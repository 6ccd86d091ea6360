//! Connected streams: two streams of different types, one operator that
//! reads both. Keyed, with shared keyed state ([`ConnectedStreams`]); or
//! not, as a stateless function with a case per input ([`CoStreams`]).

use std::fmt::Display;
use std::sync::Arc;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::graph::TwoInputNodes;
use crate::metrics::TwoInputCounters;
use crate::operator::connect::{CoProcess, Either, KeyedCoProcessFunction};
use crate::operator::function::{ProcessContext, ProcessOutcome, States, Timer};
use crate::stream::{KeyedStream, Stream, on_error};

/// Two streams of different types connected, not keyed (Flink's
/// `ConnectedStreams` of two non-keyed streams, run by a `CoMapFunction`,
/// `CoFlatMapFunction` or a stateless `CoProcessFunction`): made by
/// [`Stream::connect`].
///
/// The operator is stateless and runs where each input's records are, in
/// that input's chain: a record of either input goes through the case for
/// its input as soon as it arrives, in its input's order, with no shuffle
/// (so neither type needs a codec). Its watermark is the minimum of both
/// inputs' (an idle or ended input holds nothing back), as for a
/// [`union`](Stream::union); it ends when both inputs have. State shared
/// by both inputs is keyed: [`key_by`](Self::key_by) both sides.
///
/// ```
/// // Temperatures in Celsius from one feed, in Fahrenheit from another.
/// let mut t = weibo::testing::TestJob::new("readings");
/// let celsius = t.input(vec![21.5f64, 19.0]);
/// let fahrenheit = t.input(vec![("kitchen".to_string(), 68.0f64)]);
/// let readings = celsius.connect(&fahrenheit).map(|c| c, |(_, f)| (f - 32.0) * 5.0 / 9.0);
/// let out = t.collect(&readings);
/// t.run()?;
/// let mut got = out.values();
/// got.sort_by(f64::total_cmp);
/// assert_eq!(got, [19.0, 20.0, 21.5]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct CoStreams<A, B> {
    first: Stream<A>,
    second: Stream<B>,
}

impl<A, B> Clone for CoStreams<A, B> {
    fn clone(&self) -> Self {
        Self { first: self.first.clone(), second: self.second.clone() }
    }
}

impl<A: Clone + Send + 'static> Stream<A> {
    /// Connects this stream (the first input) with `other` (the second),
    /// of another type, for one stateless operator with a case per input:
    /// see [`CoStreams`]. To share state between the two, key both
    /// ([`CoStreams::key_by`], or [`KeyedStream::connect`]).
    pub fn connect<B: Clone + Send + 'static>(&self, other: &Stream<B>) -> CoStreams<A, B> {
        CoStreams { first: self.clone(), second: other.clone() }
    }
}

impl<A: Clone + Send + 'static, B: Clone + Send + 'static> CoStreams<A, B> {
    /// Both inputs' records, tagged by the input they came from.
    fn tagged(&self) -> Stream<Either<A, B>> {
        let left = self.first.map(Either::<A, B>::Left);
        let right = self.second.map(Either::<A, B>::Right);
        for (stream, name) in [(&left, "connect: first input"), (&right, "connect: second input")] {
            stream.lock().default_name(stream.node, name);
        }
        // Not a two-input operator's metrics: the case of each input runs
        // in that input's chain, counted there.
        left.merge(&right, "connect")
    }

    /// Maps each record of the first input with `first`, each of the
    /// second with `second`, to one stream of their common result.
    pub fn map<U, F1, F2>(&self, first: F1, second: F2) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F1: Fn(A) -> U + Send + Sync + 'static,
        F2: Fn(B) -> U + Send + Sync + 'static,
    {
        self.tagged().map(move |r| match r {
            Either::Left(a) => first(a),
            Either::Right(b) => second(b),
        })
    }

    /// Turns each record of the first input into zero or more results with
    /// `first`, each of the second with `second`.
    pub fn flat_map<U, I1, I2, F1, F2>(&self, first: F1, second: F2) -> Stream<U>
    where
        U: Clone + Send + 'static,
        I1: IntoIterator<Item = U>,
        I2: IntoIterator<Item = U>,
        F1: Fn(A) -> I1 + Send + Sync + 'static,
        F2: Fn(B) -> I2 + Send + Sync + 'static,
    {
        self.tagged().flat_map(move |r| -> Vec<U> {
            match r {
                Either::Left(a) => first(a).into_iter().collect(),
                Either::Right(b) => second(b).into_iter().collect(),
            }
        })
    }

    /// A fallible function per input: `policy` says what happens to a
    /// record either fails on (its dead letters are [`Either`]s, as
    /// [`Stream::process`] says).
    ///
    /// ```
    /// use weibo::{on_error, process::Either};
    /// let mut t = weibo::testing::TestJob::new("parse");
    /// let text = t.input(vec!["7".to_string(), "x".to_string()]);
    /// let numbers = t.input(vec![3u64]);
    /// let (parsed, dead) = text.connect(&numbers).process(
    ///     on_error::DeadLetter,
    ///     |s: &String| s.parse::<u64>(),
    ///     |n: &u64| Ok(*n),
    /// );
    /// let parsed = t.collect(&parsed);
    /// let dead = t.collect(&dead);
    /// t.run()?;
    /// let mut got = parsed.values();
    /// got.sort();
    /// assert_eq!(got, [3, 7]);
    /// assert_eq!(dead.values()[0].record, Either::Left("x".to_string()));
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn process<U, E, F1, F2, P>(&self, policy: P, first: F1, second: F2) -> P::Output
    where
        U: Clone + Send + 'static,
        E: Display,
        F1: Fn(&A) -> Result<U, E> + Send + Sync + 'static,
        F2: Fn(&B) -> Result<U, E> + Send + Sync + 'static,
        P: on_error::OnError<Either<A, B>, U>,
    {
        self.tagged().process(policy, move |r: &Either<A, B>| match r {
            Either::Left(a) => first(a),
            Either::Right(b) => second(b),
        })
    }

    /// Keys both inputs, the first by `first`, the second by `second`, to
    /// the same key type: the keyed [`ConnectedStreams`], whose operator
    /// shares its key's states and timers between the two inputs.
    pub fn key_by<K, F1, F2>(&self, first: F1, second: F2) -> ConnectedStreams<K, A, B>
    where
        K: Key,
        A: Data,
        B: Data,
        F1: Fn(&A) -> K + Send + Sync + 'static,
        F2: Fn(&B) -> K + Send + Sync + 'static,
    {
        self.first.key_by(first).connect(&self.second.key_by(second))
    }
}

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
    /// What the operator counts of its inputs (see [`TwoInputCounters`]).
    pub(crate) counters: Arc<TwoInputCounters>,
}

impl<K, A, B> Clone for ConnectedStreams<K, A, B> {
    fn clone(&self) -> Self {
        Self { keyed: self.keyed.clone(), counters: self.counters.clone() }
    }
}

/// Tags `first`'s records `Left` and `second`'s `Right`, named by
/// `labels` (`connect: <label>` in the plan), and merges them for one
/// operator of two inputs (`what`, named in wiring errors); the graph
/// remembers the three nodes, for the operator's metrics. Returns the
/// union and the operator's counters.
pub(crate) fn tag_and_merge<A, B>(
    first: &Stream<A>,
    second: &Stream<B>,
    labels: [&'static str; 2],
    what: &str,
) -> (Stream<Either<A, B>>, Arc<TwoInputCounters>)
where
    A: Clone + Send + 'static,
    B: Clone + Send + 'static,
{
    let left = first.map(Either::<A, B>::Left);
    let right = second.map(Either::<A, B>::Right);
    for (stream, label) in [(&left, labels[0]), (&right, labels[1])] {
        stream.lock().default_name(stream.node, &format!("connect: {label}"));
    }
    let union = left.merge(&right, what);
    let counters = Arc::new(TwoInputCounters::default());
    union.lock().two_inputs.push(TwoInputNodes {
        union: union.node,
        tags: [left.node, right.node],
        labels,
        states: [None, None],
        counters: counters.clone(),
    });
    (union, counters)
}

/// Names the states the records of each input of the operator over
/// `union` wait in, for its metrics.
pub(crate) fn waiting_in<T>(union: &Stream<T>, states: [Option<&'static str>; 2]) {
    if let Some(t) = union.lock().two_inputs.iter_mut().find(|t| t.union == union.node) {
        t.states = states;
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
        let (union, counters) =
            tag_and_merge(self.upstream(), other.upstream(), ["first input", "second input"], "connect");
        let keyed = union
            .key_by(move |r: &Either<A, B>| match r {
                Either::Left(a) => first(a),
                Either::Right(b) => second(b),
            })
            .with_partitions(self.partitions.max(other.partitions));
        ConnectedStreams { keyed, counters }
    }
}

impl<K: Key, A: Data, B: Data> ConnectedStreams<K, A, B> {
    /// Runs the operator on `n` instances (each owning a range of key
    /// groups).
    #[must_use]
    pub fn with_partitions(self, n: usize) -> Self {
        Self { keyed: self.keyed.with_partitions(n), counters: self.counters }
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
