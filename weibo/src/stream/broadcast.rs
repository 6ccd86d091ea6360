//! A keyed stream connected with a broadcast stream: rules, configuration
//! or reference data sent to every instance of one keyed operator and kept
//! in its broadcast state.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::codec::Data;
use crate::codec::key::Key;
use crate::operator::broadcast::{BroadcastContext, BroadcastReadContext, BroadcastStates};
use crate::operator::connect::Either;
use crate::operator::function::{self, BroadcastFn, ClosureFunction, ProcessContext, ProcessOutcome, States, Timer};
use crate::stream::connect::tag_and_merge;
use crate::stream::{KeyedStream, Stream, function_node_on, on_error};

/// A keyed stream and a broadcast stream connected for one operator:
/// made by [`KeyedStream::connect_broadcast`] (Flink's `connect` of a
/// keyed stream with a `BroadcastStream`, run by a
/// `KeyedBroadcastProcessFunction`).
///
/// Every record of the broadcast stream reaches every instance of the
/// operator, where a function with no key writes the instance's copy of
/// the broadcast states (declared with
/// [`States::broadcast`](crate::process::States::broadcast)); each record
/// of the keyed stream reaches the instance of its key, where a function
/// reads the broadcast states and reads and writes its key's states. The
/// broadcast states are checkpointed with the operator, and a restore
/// gives every instance (however many there are now) the copies the
/// instances wrote before.
///
/// - The operator's watermark is the lower of both inputs' (an idle or
///   ended input holds nothing back); checkpoint barriers are aligned
///   across both.
/// - Nothing orders a broadcast record before or after the keyed records
///   around it: a rule applies to the keyed records that reach the
///   instance after it. To apply rules by event time, keep the keyed
///   records in state and act on them in a timer.
/// - Every instance applies the broadcast records to its copy: a
///   broadcast function must update the broadcast states the same way on
///   every instance, from the record alone (as in Flink). A result it
///   emits comes out once per instance.
///
/// ```
/// use weibo::on_error;
///
/// // Readings above their sensor kind's threshold; the thresholds come as
/// // a stream of (kind, threshold) rules.
/// let mut t = weibo::testing::TestJob::new("alerts");
/// let thresholds = t.input(vec![("temp".to_string(), 30u32)]);
/// let readings = t
///     .input(vec![(1u32, "temp".to_string(), 25u32), (2, "temp".to_string(), 35)])
///     .key_by(|r: &(u32, String, u32)| r.0)
///     .with_partitions(2);
/// let alerts = readings.connect_broadcast(&thresholds).process_with_state(
///     on_error::Fail,
///     |states| states.broadcast::<String, u32>("thresholds"),
///     |ctx, thresholds, reading| {
///         if ctx.broadcast(thresholds).get(&reading.1).is_some_and(|limit| reading.2 > limit) {
///             ctx.emit(reading.0);
///         }
///     },
///     |ctx, thresholds, rule| ctx.broadcast(thresholds).put(rule.0.clone(), rule.1),
/// );
/// let out = t.collect(&alerts);
/// t.run()?;
/// // The rule may reach an instance after the readings it should judge:
/// // the readings come after it here only if the rules input runs first.
/// assert!(out.values().iter().all(|sensor| *sensor == 2));
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct BroadcastConnectedStreams<K, A, B> {
    /// Both inputs' records, tagged.
    upstream: Stream<Either<A, B>>,
    /// Keys the first input's records to their instance, sends the second
    /// input's to every instance.
    router: Arc<dyn crate::operator::factory::RouterFactory>,
    partitions: usize,
    _types: PhantomData<fn() -> K>,
}

impl<K, A, B> Clone for BroadcastConnectedStreams<K, A, B> {
    fn clone(&self) -> Self {
        Self {
            upstream: self.upstream.clone(),
            router: self.router.clone(),
            partitions: self.partitions,
            _types: PhantomData,
        }
    }
}

impl<K: Key, A: Data> KeyedStream<K, A> {
    /// Connects this keyed stream with `broadcast`, whose records reach
    /// every instance of the operator: see [`BroadcastConnectedStreams`].
    /// The operator runs on this stream's
    /// [`with_partitions`](Self::with_partitions), unless
    /// [`BroadcastConnectedStreams::with_partitions`] sets it.
    pub fn connect_broadcast<B: Data>(&self, broadcast: &Stream<B>) -> BroadcastConnectedStreams<K, A, B> {
        let (upstream, _) =
            tag_and_merge(self.upstream(), broadcast, ["keyed input", "broadcast input"], "connect_broadcast");
        let key = self.key.clone();
        BroadcastConnectedStreams {
            upstream,
            router: crate::operator::exchange::broadcast_router::<A, B, K, _>(Arc::new(move |a: &A| key(a))),
            partitions: self.partitions,
            _types: PhantomData,
        }
    }
}

impl<K: Key, A: Data, B: Data> BroadcastConnectedStreams<K, A, B> {
    /// Runs the operator on `n` instances (each owning a range of key
    /// groups, each with its copy of the broadcast states).
    #[must_use]
    pub fn with_partitions(self, n: usize) -> Self {
        Self { partitions: n, ..self }
    }

    /// The operator, as closures: `declare` declares the states (broadcast
    /// and keyed) and returns their handles; `keyed` runs per record of the
    /// keyed input, with its key's context; `on_broadcast` per record of
    /// the broadcast input, on every instance, with a context that writes
    /// the broadcast states. Dead letters, under `policy`, are [`Either`]s.
    pub fn process_with_state<S, U, R, D, F1, F2, P>(
        &self,
        policy: P,
        declare: D,
        keyed: F1,
        on_broadcast: F2,
    ) -> P::Output
    where
        S: Send + Sync + 'static,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        D: FnOnce(&mut States<K>) -> S,
        F1: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &A) -> R + Send + Sync + 'static,
        F2: for<'c> Fn(&mut BroadcastContext<'c, K, U>, &S, &B) -> R + Send + Sync + 'static,
        P: on_error::OnError<Either<A, B>, U>,
    {
        self.process_with_state_and_timers(
            policy,
            declare,
            keyed,
            on_broadcast,
            |_: &mut ProcessContext<'_, K, U>, _: &S, _| R::nothing(),
        )
    }

    /// Like [`process_with_state`](Self::process_with_state), with timers:
    /// `on_timer` runs, with the key's context and the handles, for each
    /// timer the keyed function (or `on_timer`) set, when it fires.
    pub fn process_with_state_and_timers<S, U, R, D, F1, F2, G, P>(
        &self,
        policy: P,
        declare: D,
        keyed: F1,
        on_broadcast: F2,
        on_timer: G,
    ) -> P::Output
    where
        S: Send + Sync + 'static,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        D: FnOnce(&mut States<K>) -> S,
        F1: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &A) -> R + Send + Sync + 'static,
        F2: for<'c> Fn(&mut BroadcastContext<'c, K, U>, &S, &B) -> R + Send + Sync + 'static,
        G: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, Timer) -> R + Send + Sync + 'static,
        P: on_error::OnError<Either<A, B>, U>,
    {
        let mut states = States::new();
        let handles = Arc::new(declare(&mut states));
        broadcast_node(
            (&self.upstream, self.router.clone(), self.partitions),
            policy,
            (states, handles),
            (keyed, on_broadcast, on_timer),
        )
    }
}

/// The node of an operator with a broadcast input, fed by `upstream`
/// through `router` on `partitions` instances: `main` runs per record of
/// the first input (with its key's context; of key `()` when it has no
/// key), `on_broadcast` per record of the broadcast input on every
/// instance, `on_timer` per timer, each with the `handles` to `states`.
fn broadcast_node<K, A, B, S, U, R, F1, F2, G, P>(
    (upstream, router, partitions): (&Stream<Either<A, B>>, Arc<dyn crate::operator::factory::RouterFactory>, usize),
    policy: P,
    (states, handles): (States<K>, Arc<S>),
    (main, on_broadcast, on_timer): (F1, F2, G),
) -> P::Output
where
    K: Key,
    A: Data,
    B: Data,
    S: Send + Sync + 'static,
    U: Clone + Send + 'static,
    R: ProcessOutcome + 'static,
    F1: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &A) -> R + Send + Sync + 'static,
    F2: for<'c> Fn(&mut BroadcastContext<'c, K, U>, &S, &B) -> R + Send + Sync + 'static,
    G: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, Timer) -> R + Send + Sync + 'static,
    P: on_error::OnError<Either<A, B>, U>,
{
    let for_broadcast = handles.clone();
    let on_broadcast: BroadcastFn<K, Either<A, B>, U> = Arc::new(move |ctx, record| match record {
        Either::Right(b) => on_broadcast(ctx, &for_broadcast, b).failure().map_or(Ok(()), Err),
        Either::Left(_) => {
            Err("a record of the first input came as a broadcast one (a bug in the routing)".to_string())
        }
    });
    let function = ClosureFunction::new(
        handles,
        move |ctx: &mut ProcessContext<'_, K, U>, states: &Arc<S>, record: &Either<A, B>| match record {
            Either::Left(a) => main(ctx, states, a),
            Either::Right(_) => R::nothing(),
        },
        move |ctx: &mut ProcessContext<'_, K, U>, states: &Arc<S>, timer: Timer| on_timer(ctx, states, timer),
    );
    let policy = policy.policy();
    let factory = function::factory::<K, Either<A, B>, _>(policy, Arc::new(function), &states, Some(on_broadcast));
    function_node_on::<K, Either<A, B>, U, P>((upstream, router, partitions), policy, factory, &states)
}

/// A stream that is not keyed and a broadcast stream connected for one
/// operator: made by [`Stream::connect_broadcast`] (Flink's `connect` of a
/// non-keyed stream with a `BroadcastStream`, run by a
/// `BroadcastProcessFunction`).
///
/// As for [`BroadcastConnectedStreams`], every record of the broadcast
/// stream reaches every instance, where a function writes the instance's
/// copy of the broadcast states; each record of the main stream reaches
/// one instance (in turn: the main input is spread evenly over the
/// instances, so records of one partition may change order), where a
/// function reads the broadcast states. There is no key, so no keyed state
/// and no timers; the broadcast states are checkpointed and restored onto
/// any number of instances, and the operator's watermark and barriers are
/// those of any two-input operator.
///
/// ```
/// use weibo::on_error;
///
/// // Words, masked when they are on a block list that comes as a stream.
/// let mut t = weibo::testing::TestJob::new("mask");
/// let blocked = t.input(vec!["darn".to_string()]);
/// let words = t.input(vec!["well".to_string(), "darn".to_string()]);
/// let masked = words.connect_broadcast(&blocked).with_partitions(2).process_with_state(
///     on_error::Fail,
///     |states| states.broadcast::<String, ()>("blocked"),
///     |ctx, blocked, word| {
///         let shown = if ctx.broadcast(blocked).contains(word) { "****".to_string() } else { word.clone() };
///         ctx.emit(shown);
///     },
///     |ctx, blocked, word| ctx.broadcast(blocked).put(word.clone(), ()),
/// );
/// let out = t.collect(&masked);
/// t.run()?;
/// // The block list may reach an instance after the words it should mask.
/// assert!(out.values().iter().any(|w| w == "well"));
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct BroadcastStreams<A, B> {
    /// Both inputs' records, tagged.
    upstream: Stream<Either<A, B>>,
    partitions: usize,
}

impl<A, B> Clone for BroadcastStreams<A, B> {
    fn clone(&self) -> Self {
        Self { upstream: self.upstream.clone(), partitions: self.partitions }
    }
}

impl<A: Data> Stream<A> {
    /// Connects this stream with `broadcast`, whose records reach every
    /// instance of the operator: see [`BroadcastStreams`]. The operator
    /// runs on one instance unless [`BroadcastStreams::with_partitions`]
    /// says otherwise.
    pub fn connect_broadcast<B: Data>(&self, broadcast: &Stream<B>) -> BroadcastStreams<A, B> {
        let (upstream, _) = tag_and_merge(self, broadcast, ["main input", "broadcast input"], "connect_broadcast");
        BroadcastStreams { upstream, partitions: 1 }
    }
}

impl<A: Data, B: Data> BroadcastStreams<A, B> {
    /// Runs the operator on `n` instances, each with its copy of the
    /// broadcast states.
    #[must_use]
    pub fn with_partitions(self, n: usize) -> Self {
        Self { partitions: n, ..self }
    }

    /// The operator, as closures: `declare` declares the broadcast states
    /// (and side outputs) and returns their handles; `main` runs per
    /// record of the main input, with a context that reads the broadcast
    /// states; `on_broadcast` per record of the broadcast input, on every
    /// instance, with a context that writes them. Dead letters, under
    /// `policy`, are [`Either`]s.
    pub fn process_with_state<S, U, R, D, F1, F2, P>(
        &self,
        policy: P,
        declare: D,
        main: F1,
        on_broadcast: F2,
    ) -> P::Output
    where
        S: Send + Sync + 'static,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        D: FnOnce(&mut BroadcastStates) -> S,
        F1: for<'c> Fn(&mut BroadcastReadContext<'c, U>, &S, &A) -> R + Send + Sync + 'static,
        F2: for<'c> Fn(&mut BroadcastContext<'c, (), U>, &S, &B) -> R + Send + Sync + 'static,
        P: on_error::OnError<Either<A, B>, U>,
    {
        let mut declared = BroadcastStates { states: States::new() };
        let handles = Arc::new(declare(&mut declared));
        broadcast_node(
            (&self.upstream, crate::operator::exchange::spread_broadcast_router::<A, B>(), self.partitions),
            policy,
            (declared.states, handles),
            (
                move |ctx: &mut ProcessContext<'_, (), U>, states: &S, a: &A| main(&mut ctx.unkeyed(), states, a),
                on_broadcast,
                |_: &mut ProcessContext<'_, (), U>, _: &S, _: Timer| R::nothing(),
            ),
        )
    }
}
