//! The typed DSL: [`Stream<T>`] and [`KeyedStream<K, T>`].
//!
//! A stream is only an address in the job's graph (node and port) with a
//! phantom type; every operator adds a node whose closure is stored erased.
//! Types are checked here, by the compiler; the runtime only sees bytes at
//! node boundaries.

#[cfg(feature = "admin")]
pub(crate) mod admin;
pub(crate) mod async_io;
pub(crate) mod broadcast;
pub(crate) mod connect;
pub(crate) mod job;
pub(crate) mod join;
pub(crate) mod window;

use std::fmt::Display;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use crate::checkpoint::commit::{Committer, Prepared};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::graph::{EdgeKind, Graph, Input, Node, NodeId, Op, Port, TypedPort};
use crate::operator::exchange::key_router;
use crate::operator::factory::{ChainFactory, KeyedFactory};
use crate::operator::function::{self, ClosureFunction, KeyedProcessFunction, ProcessContext, ProcessOutcome};
use crate::operator::function::{States, Timer};
use crate::operator::keyed::KeyedContext;
use crate::operator::outputs::{self, OutputContext, OutputTag, Outputs};
use crate::operator::policy::Policy;
use crate::operator::{keyed, stateless, watermarks};
use crate::record::Timestamp;
use crate::runtime::config::JobConfig;
use crate::sinks::{Sink, SinkCommitter, TwoPhaseCommitSink};
use crate::time::WatermarkStrategy;

pub use crate::operator::policy::DeadLetter;
pub use crate::operator::stateless::BatchOutput;

/// What `process` does with a record its function fails on.
///
/// - [`on_error::Drop`]: drop it and count it (`dropped` in the operator's metrics).
/// - [`on_error::DeadLetter`]: send it, with the error and its source
///   position, to a second stream of [`DeadLetter`]s that must be sunk.
/// - [`on_error::Fail`]: stop the job with an error naming the operator and
///   the record's source position.
///
/// ```
/// use weibo::on_error;
/// // Drop: failing records are counted and dropped.
/// let out = weibo::testing::run(vec!["1", "x", "3"], |s| {
///     s.map(str::to_string).process(on_error::Drop, |t: &String| t.parse::<u32>())
/// })?;
/// assert_eq!(out, vec![1, 3]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub mod on_error {
    use super::{DeadLetter as Letter, Stream};

    #[doc(hidden)]
    pub use crate::operator::policy::Policy;

    /// Drop failing records, counting them.
    ///
    /// ```
    /// let out = weibo::testing::run(vec![2u32, 0, 4], |s| {
    ///     s.process(weibo::on_error::Drop, |x: &u32| 100u32.checked_div(*x).ok_or("division by zero"))
    /// })?;
    /// assert_eq!(out, vec![50, 25]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Drop;
    /// Send failing records to a dead-letter stream.
    ///
    /// ```
    /// let mut t = weibo::testing::TestJob::new("dead-letters");
    /// let (ok, dead) = t.input(vec![2u32, 0]).process(weibo::on_error::DeadLetter, |x: &u32| {
    ///     100u32.checked_div(*x).ok_or("division by zero")
    /// });
    /// let (ok, dead) = (t.collect(&ok), t.collect(&dead));
    /// t.run()?;
    /// assert_eq!(ok.values(), vec![50]);
    /// let letter = &dead.values()[0];
    /// assert_eq!((letter.record, letter.error.as_str(), letter.position.offset), (0, "division by zero", 1));
    /// # Ok::<(), weibo::Error>(())
    /// ```
    #[derive(Clone, Copy, Debug, Default)]
    pub struct DeadLetter;
    /// Stop the job at the first failing record.
    ///
    /// ```
    /// let err = weibo::testing::run(vec![2u32, 0], |s| {
    ///     s.process(weibo::on_error::Fail, |x: &u32| 100u32.checked_div(*x).ok_or("division by zero"))
    /// })
    /// .unwrap_err();
    /// assert!(matches!(err, weibo::Error::RecordFailed { .. }), "{err}");
    /// assert!(err.to_string().contains("division by zero"));
    /// ```
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Fail;

    mod sealed {
        pub trait Sealed {}
        impl Sealed for super::Drop {}
        impl Sealed for super::DeadLetter {}
        impl Sealed for super::Fail {}
    }

    /// A failure policy; see the [module documentation](self).
    ///
    /// ```
    /// fn parse<P: weibo::on_error::OnError<String, u32>>(s: &weibo::Stream<String>, policy: P) -> P::Output {
    ///     s.process(policy, |t: &String| t.parse::<u32>())
    /// }
    /// let out = weibo::testing::run(vec!["7".to_string()], |s| parse(&s, weibo::on_error::Drop))?;
    /// assert_eq!(out, vec![7]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub trait OnError<T, U>: sealed::Sealed {
        /// What `process` returns under this policy.
        type Output;
        #[doc(hidden)]
        fn policy(&self) -> Policy;
        #[doc(hidden)]
        fn output(ok: Stream<U>, dead: Stream<Letter<T>>) -> Self::Output;
    }

    impl<T, U> OnError<T, U> for Drop {
        type Output = Stream<U>;
        fn policy(&self) -> Policy {
            Policy::Drop
        }
        fn output(ok: Stream<U>, _dead: Stream<Letter<T>>) -> Stream<U> {
            ok
        }
    }

    impl<T, U> OnError<T, U> for Fail {
        type Output = Stream<U>;
        fn policy(&self) -> Policy {
            Policy::Fail
        }
        fn output(ok: Stream<U>, _dead: Stream<Letter<T>>) -> Stream<U> {
            ok
        }
    }

    impl<T, U> OnError<T, U> for DeadLetter {
        type Output = (Stream<U>, Stream<Letter<T>>);
        fn policy(&self) -> Policy {
            Policy::DeadLetter
        }
        fn output(ok: Stream<U>, dead: Stream<Letter<T>>) -> Self::Output {
            (ok, dead)
        }
    }
}

/// Stateful operators exist only on keyed streams.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not keyed: `{Self}::{Op}` needs a `KeyedStream`",
    label = "this stream has no key",
    note = "call `.key_by(|record| record.some_key)` first; per-key state and aggregation need to know the key of each record"
)]
/// ```
/// // `reduce` on a plain stream does not compile; key the stream first:
/// let out = weibo::testing::run(vec![1u32, 2, 3], |s| s.key_by(|_: &u32| 0u8).reduce(|a, b| a + b))?;
/// assert_eq!(out, vec![1, 3, 6]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub trait NeedsKeyedStream<Op> {}

/// Marker for [`NeedsKeyedStream`]: `reduce` (names the operation in the
/// compiler's message when it is called on a plain stream). Key the
/// stream first:
///
/// ```
/// let out = weibo::testing::run(vec![1u32, 2], |s| s.key_by(|_: &u32| 0u8).reduce(|a, b| a + b))?;
/// assert_eq!(out.len(), 2);
/// # Ok::<(), weibo::Error>(())
/// ```
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub enum reduce {}
/// Marker for [`NeedsKeyedStream`]: `fold` (names the operation in the
/// compiler's message when it is called on a plain stream). Key the
/// stream first:
///
/// ```
/// let out = weibo::testing::run(vec![1u32, 2], |s| s.key_by(|_: &u32| 0u8).fold(|| 0u32, |acc, x| *acc += x).map(|(_, n)| n))?;
/// assert_eq!(out.len(), 2);
/// # Ok::<(), weibo::Error>(())
/// ```
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub enum fold {}
/// Marker for [`NeedsKeyedStream`]: `aggregate` (names the operation in the
/// compiler's message when it is called on a plain stream). Key the
/// stream first:
///
/// ```
/// let out = weibo::testing::run(vec![1u32, 2], |s| s.key_by(|_: &u32| 0u8).aggregate(weibo::window::Count).map(|(_, n)| n as u32))?;
/// assert_eq!(out.len(), 2);
/// # Ok::<(), weibo::Error>(())
/// ```
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub enum aggregate {}
/// Marker for [`NeedsKeyedStream`]: `with_partitions` (names the operation in the
/// compiler's message when it is called on a plain stream). Key the
/// stream first:
///
/// ```
/// let out = weibo::testing::run(vec![1u32, 2], |s| s.key_by(|x: &u32| *x).with_partitions(2).reduce(|a, b| a + b))?;
/// assert_eq!(out.len(), 2);
/// # Ok::<(), weibo::Error>(())
/// ```
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub enum with_partitions {}

pub use crate::operator::Aggregate;

/// What the typed DSL builds: the job's graph, and how it runs. The
/// graph is reached through it directly (`pipeline.nodes`).
pub(crate) struct Pipeline {
    pub(crate) graph: Graph,
    pub(crate) config: JobConfig,
    /// Where the admin API listens, if it is on (`Job::with_admin`).
    #[cfg(feature = "admin")]
    pub(crate) admin: Option<admin::AdminOptions>,
    /// The group whose admin API serves the job (`Job::with_admin_group`).
    #[cfg(feature = "admin")]
    pub(crate) admin_group: Option<admin::AdminGroup>,
    /// The meter the job's instruments register with (`Job::with_meter`).
    #[cfg(feature = "otel")]
    pub(crate) meter: Option<opentelemetry::metrics::Meter>,
    /// Where the job exports its instruments over OTLP, and how often
    /// (`Job::with_otlp`).
    #[cfg(feature = "otlp")]
    pub(crate) otlp: Option<(String, std::time::Duration)>,
}

impl std::ops::Deref for Pipeline {
    type Target = Graph;
    fn deref(&self) -> &Graph {
        &self.graph
    }
}

impl std::ops::DerefMut for Pipeline {
    fn deref_mut(&mut self) -> &mut Graph {
        &mut self.graph
    }
}

/// A stream of records of type `T`.
///
/// Streams come from [`Job::source`](crate::Job::source) and from operators
/// on other streams; cloning a stream does not copy records, it names the
/// same output again (consuming it twice sends every record to both).
///
/// ```
/// let out = weibo::testing::run(vec![1u32, 2, 3, 4], |s: weibo::Stream<u32>| {
///     s.filter(|x| x % 2 == 0).map(|x| x * 10)
/// })?;
/// assert_eq!(out, vec![20, 40]);
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct Stream<T> {
    pub(crate) graph: Arc<Mutex<Pipeline>>,
    pub(crate) node: NodeId,
    pub(crate) port: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Stream<T> {
    fn clone(&self) -> Self {
        Self { graph: self.graph.clone(), node: self.node, port: self.port, _t: PhantomData }
    }
}

impl<T> std::fmt::Debug for Stream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("node", &self.node)
            .field("port", &self.port)
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

pub(crate) fn port<T: Clone + Send + 'static>(label: &'static str, must_consume: bool) -> Port {
    Port {
        type_name: std::any::type_name::<T>(),
        ty: TypedPort::<T>::shared(),
        must_consume,
        label: label.into(),
        tag: None,
    }
}

/// The ports of the side outputs `outputs` declares. Side outputs nothing
/// reads are dropped, as in Flink: declaring one is not a promise to read
/// it.
fn side_ports(outputs: &Outputs) -> impl Iterator<Item = Port> + '_ {
    outputs.side_outputs().map(|(name, type_name, ty, tag)| Port {
        type_name,
        ty,
        must_consume: false,
        label: name.to_string().into(),
        tag: Some(tag),
    })
}

/// The dead-letter port of a `process` under `policy`: read with
/// [`OutputTag::dead_letters`] as well as from the pair `on_error::DeadLetter`
/// returns (under another policy nothing is sent there, and the tag finds
/// no port).
pub(crate) fn dead_letters<T: Clone + Send + 'static>(policy: Policy) -> Port {
    let dead = policy == Policy::DeadLetter;
    Port { tag: dead.then_some(outputs::DEAD_LETTERS), ..port::<DeadLetter<T>>("dead letters", dead) }
}

impl<T> Stream<T> {
    pub(crate) fn new(graph: Arc<Mutex<Pipeline>>, node: NodeId, port: usize) -> Self {
        Self { graph, node, port, _t: PhantomData }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Pipeline> {
        self.graph.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, node: Node) -> NodeId {
        self.lock().add(node)
    }

    fn forward(&self) -> Input {
        Input { from: self.node, port: self.port, kind: EdgeKind::Forward }
    }

    /// Names the operator that produces this stream (names show in the
    /// graph, in metrics and in errors, and must be unique in a job).
    ///
    /// # Panics
    /// Never; a duplicate name is reported when the job is planned or run.
    ///
    /// ```
    /// let job = weibo::Job::new("named");
    /// let doubled = job.source(weibo::sources::IterSource::new(vec![1u32])).map(|x| x * 2).name("double");
    /// doubled.sink(weibo::sinks::Blackhole::new());
    /// assert!(job.to_string().contains("map `double`"));
    /// ```
    #[must_use]
    pub fn name(self, name: &str) -> Self {
        let result = self.lock().rename(self.node, name);
        if let Err(message) = result {
            self.lock().wiring_errors.push(message);
        }
        self
    }

    /// Gives the operator that produces this stream a stable id: what
    /// checkpoints and savepoints file its state (a source's positions)
    /// under, and what a restore matches it by. Without one, the id is
    /// the operator's name. Keep the id when the operator is renamed or
    /// the pipeline around it changes, and its state restores into it;
    /// ids are unique in a job (the book's "Savepoints and upgrades"
    /// chapter shows an upgrade).
    ///
    /// # Panics
    /// Never; a duplicate or empty id is reported when the job is planned
    /// or run.
    ///
    /// ```
    /// let job = weibo::Job::new("ids");
    /// let totals = job
    ///     .source(weibo::sources::IterSource::new(vec![1u32, 2]))
    ///     .key_by(|x: &u32| x % 2)
    ///     .reduce(|a, b| a + b)
    ///     .uid("totals")
    ///     .name("running totals");
    /// totals.sink(weibo::sinks::Blackhole::new());
    /// assert!(job.to_string().contains("reduce `running totals` [id totals]"));
    /// ```
    #[must_use]
    pub fn uid(self, id: &str) -> Self {
        let result = self.lock().set_uid(self.node, id);
        if let Err(message) = result {
            self.lock().wiring_errors.push(message);
        }
        self
    }

    /// Declares the version of the state of the operator that produces
    /// this stream (1 unless set). A restore compares the layout of each
    /// state with the one recorded, and this version with the recorded
    /// one: bump it when the *meaning* of a state changes and its layout
    /// does not (a count of cents that was a count of euros), and the
    /// restore goes through the migration the job offers
    /// (`Job::with_state_migration`) or is refused, instead of reading old
    /// values as new ones. A savepoint of a later version than the job's is
    /// refused. Timers and what Weibo keeps for itself are not versioned.
    ///
    /// # Panics
    /// Never; on an operator that keeps no state, it is a wiring error
    /// reported when the job is planned or run.
    ///
    /// ```
    /// let job = weibo::Job::new("versions");
    /// let totals = job
    ///     .source(weibo::sources::IterSource::new(vec![1u32, 2]))
    ///     .key_by(|x: &u32| x % 2)
    ///     .reduce(|a, b| a + b)
    ///     .uid("totals")
    ///     .state_version(2);
    /// totals.sink(weibo::sinks::Blackhole::new());
    /// assert!(job.to_string().contains("[id totals, state version 2]"));
    /// ```
    #[must_use]
    pub fn state_version(self, version: u32) -> Self {
        let result = self.lock().set_state_version(self.node, version);
        if let Err(message) = result {
            self.lock().wiring_errors.push(message);
        }
        self
    }
}

impl<T> Stream<T> {
    /// The side output `tag` of the function whose results this stream is
    /// (a keyed or stateless process function that declared it with
    /// [`States::side_output`] or [`Outputs::side_output`]; the dead
    /// letters of a `process` under `on_error::DeadLetter`, with
    /// [`OutputTag::dead_letters`]), as a stream of its own type.
    ///
    /// # Panics
    /// Never; a tag the operator does not send to is a wiring error,
    /// reported when the job is planned or run.
    pub fn side_output<V: Clone + Send + 'static>(&self, tag: &OutputTag<V>) -> Stream<V> {
        let mut pipeline = self.lock();
        let ports = pipeline.nodes.get(self.node).map(|n| n.outputs.as_slice()).unwrap_or_default();
        let found = ports.iter().position(|p| p.tag == Some(tag.id())).map(|i| (i, ports.get(i).map(|p| p.type_name)));
        let error = match found {
            Some((port, Some(type_name))) if type_name == std::any::type_name::<V>() => {
                drop(pipeline);
                return Stream::new(self.graph.clone(), self.node, port);
            }
            Some((_, type_name)) => format!(
                "side output `{}` carries `{}`, not `{}`",
                tag.name(),
                type_name.unwrap_or_default(),
                std::any::type_name::<V>()
            ),
            None if tag.id() == outputs::DEAD_LETTERS => "dead letters are a side output only of a `process` under \
                 `on_error::DeadLetter`: call `side_output` on the results of one"
                .to_string(),
            None => format!(
                "side output `{}` is not an output of the operator this stream comes from: call `side_output` on the \
                 stream the function that declared it returned",
                tag.name()
            ),
        };
        pipeline.wiring_errors.push(error);
        drop(pipeline);
        Stream::new(self.graph.clone(), self.node, usize::MAX)
    }
}

impl<T: Clone + Send + 'static> Stream<T> {
    fn stateless<U: Clone + Send + 'static>(&self, kind: &'static str, factory: Arc<dyn ChainFactory>) -> Stream<U> {
        let node = self.add(Node {
            kind,
            name: kind.to_string(),
            uid: None,
            state_version: 1,
            named: false,
            stateful: false,
            detail: String::new(),
            inputs: vec![self.forward()],
            outputs: vec![port::<U>("output", true)],
            op: Op::Chain(factory),
        });
        Stream::new(self.graph.clone(), node, 0)
    }

    /// Transforms each record.
    ///
    /// ```
    /// let out = weibo::testing::run(vec![1, 2, 3], |s| s.map(|x: i32| x * 2))?;
    /// assert_eq!(out, vec![2, 4, 6]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn map<U, F>(&self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        F: Fn(T) -> U + Send + Sync + 'static,
    {
        self.stateless::<U>("map", stateless::map::<T, U, F>(Arc::new(f)))
    }

    /// Keeps the records `f` accepts.
    ///
    /// ```
    /// let out = weibo::testing::run(vec![1, 2, 3, 4], |s| s.filter(|x: &i32| x % 2 == 0))?;
    /// assert_eq!(out, vec![2, 4]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn filter<F>(&self, f: F) -> Stream<T>
    where
        F: Fn(&T) -> bool + Send + Sync + 'static,
    {
        self.stateless::<T>("filter", stateless::filter::<T, F>(Arc::new(f)))
    }

    /// Keeps the records `f` accepts, where `f` can fail: a record whose
    /// predicate returns an error goes to the failure `policy` (the job
    /// fails naming it, it is dropped and counted, or it becomes a dead
    /// letter), like a failing [`process`](Self::process). The records
    /// stay where they are in their batch: no copy per record.
    ///
    /// ```
    /// use weibo::on_error;
    /// let mut t = weibo::testing::TestJob::new("limits");
    /// let lines = t.input(vec!["5".to_string(), "x".to_string(), "50".to_string()]);
    /// let (small, dead) = lines.try_filter(on_error::DeadLetter, |l: &String| l.parse::<u32>().map(|n| n < 10));
    /// let small = t.collect(&small);
    /// let dead = t.collect(&dead);
    /// t.run()?;
    /// assert_eq!(small.values(), vec!["5".to_string()]);
    /// assert_eq!(dead.values()[0].record, "x");
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn try_filter<E, F, P>(&self, policy: P, f: F) -> P::Output
    where
        E: Display,
        F: Fn(&T) -> std::result::Result<bool, E> + Send + Sync + 'static,
        P: on_error::OnError<T, T>,
    {
        let policy = policy.policy();
        let factory = stateless::try_filter::<T, E, F>(policy, Arc::new(f));
        self.process_node::<T, P>("filter", policy, factory, Vec::new())
    }

    /// Turns each record into zero or more records.
    ///
    /// ```
    /// let out = weibo::testing::run(vec!["a b".to_string(), "c".to_string()], |s| {
    ///     s.flat_map(|line: String| line.split(' ').map(str::to_string).collect::<Vec<_>>())
    /// })?;
    /// assert_eq!(out, vec!["a", "b", "c"]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn flat_map<U, I, F>(&self, f: F) -> Stream<U>
    where
        U: Clone + Send + 'static,
        I: IntoIterator<Item = U>,
        F: Fn(T) -> I + Send + Sync + 'static,
    {
        self.stateless::<U>("flat_map", stateless::flat_map::<T, U, I, F>(Arc::new(f)))
    }

    /// Applies a fallible function; `policy` says what happens to records it
    /// fails on (see [`on_error`]). With [`on_error::DeadLetter`] it returns
    /// the results and a stream of [`DeadLetter`]s.
    ///
    /// ```
    /// use weibo::on_error;
    /// let mut t = weibo::testing::TestJob::new("parse");
    /// let lines = t.input(vec!["1".to_string(), "x".to_string(), "3".to_string()]);
    /// let (numbers, dead) = lines.process(on_error::DeadLetter, |l: &String| l.parse::<u32>());
    /// let numbers = t.collect(&numbers);
    /// let dead = t.collect(&dead);
    /// let report = t.run()?;
    /// assert_eq!(numbers.values(), vec![1, 3]);
    /// assert_eq!(dead.values()[0].record, "x");
    /// assert_eq!(dead.values()[0].position.offset, 1);
    /// assert_eq!(report.metrics.operator("process").unwrap().dead_lettered, 1);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn process<U, E, F, P>(&self, policy: P, f: F) -> P::Output
    where
        U: Clone + Send + 'static,
        E: Display,
        F: Fn(&T) -> std::result::Result<U, E> + Send + Sync + 'static,
        P: on_error::OnError<T, U>,
    {
        let policy = policy.policy();
        let factory = stateless::process::<T, U, E, F>(policy, Arc::new(f));
        self.process_node::<U, P>("process", policy, factory, Vec::new())
    }

    /// Like [`process`](Self::process), a batch at a time: `f` gets the
    /// records of each batch the operator receives, in order, and gives
    /// its results on the [`BatchOutput`], each for the record it came
    /// from (whose event time and position it takes): none, one or several
    /// per record. A record it [fails](BatchOutput::fail) goes to `policy`
    /// as in `process`. For work that is cheaper over many records at once
    /// than one by one: an expression evaluated a column at a time, a
    /// model scored on a batch, a lookup of many keys in one call. Batches
    /// are at most [`Job::with_batch_size`] records, and smaller when
    /// records are slow to come (the buffer timeout).
    ///
    /// ```
    /// use weibo::{BatchOutput, on_error};
    /// let mut t = weibo::testing::TestJob::new("halves");
    /// let numbers = t.input(vec![4u32, 3, 8, 0]);
    /// // Halves of the even numbers; an odd number is a failure.
    /// let (halves, dead) = numbers.process_batch(on_error::DeadLetter, |batch: &[u32], out: &mut BatchOutput<u32, String>| {
    ///     for (i, n) in batch.iter().enumerate() {
    ///         if n % 2 == 0 { out.emit(i, n / 2) } else { out.fail(i, format!("{n} is odd")) }
    ///     }
    /// });
    /// let halves = t.collect(&halves);
    /// let dead = t.collect(&dead);
    /// t.run()?;
    /// assert_eq!(halves.values(), vec![2, 4, 0]);
    /// assert_eq!(dead.values()[0].error, "3 is odd");
    /// assert_eq!(dead.values()[0].position.offset, 1);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn process_batch<U, E, F, P>(&self, policy: P, f: F) -> P::Output
    where
        U: Clone + Send + 'static,
        E: Display + Send + 'static,
        F: Fn(&[T], &mut BatchOutput<U, E>) + Send + Sync + 'static,
        P: on_error::OnError<T, U>,
    {
        let policy = policy.policy();
        let factory = stateless::process_batch::<T, U, E, F>(policy, Arc::new(f));
        self.process_node::<U, P>("process_batch", policy, factory, Vec::new())
    }

    /// The node of a stateless `process` under `policy`: its results, dead
    /// letters and `sides`.
    fn process_node<U, P>(
        &self,
        kind: &'static str,
        policy: Policy,
        factory: Arc<dyn ChainFactory>,
        sides: Vec<Port>,
    ) -> P::Output
    where
        U: Clone + Send + 'static,
        P: on_error::OnError<T, U>,
    {
        let mut outputs = vec![port::<U>("output", true), dead_letters::<T>(policy)];
        outputs.extend(sides);
        let node = self.add(Node {
            kind,
            name: kind.into(),
            uid: None,
            state_version: 1,
            named: false,
            stateful: false,
            detail: policy_detail(policy),
            inputs: vec![self.forward()],
            outputs,
            op: Op::Chain(factory),
        });
        P::output(Stream::new(self.graph.clone(), node, 0), Stream::new(self.graph.clone(), node, 1))
    }

    /// A stateless `process` with typed side outputs: `declare` declares
    /// them on the operator's [`Outputs`] (once, when the job is wired) and
    /// returns the handles (the tags) `f` gets with the context and each
    /// record; `f` emits results with [`OutputContext::emit`] and sends to
    /// a side output with [`OutputContext::output`]. `f` returns nothing
    /// when it cannot fail, or a `Result` whose error fails the record
    /// under `policy`. Read a side output with
    /// [`side_output`](Stream::side_output) on the results; see
    /// [`Outputs`] for an example.
    ///
    /// # Panics
    /// Never; a side output declared twice is a wiring error, reported
    /// when the job is planned or run.
    pub fn process_with_outputs<S, U, R, D, F, P>(&self, policy: P, declare: D, f: F) -> P::Output
    where
        S: Send + Sync + 'static,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        D: FnOnce(&mut Outputs) -> S,
        F: for<'c> Fn(&mut OutputContext<'c, U>, &S, &T) -> R + Send + Sync + 'static,
        P: on_error::OnError<T, U>,
    {
        let policy = policy.policy();
        let mut declared = Outputs::new();
        let handles = declare(&mut declared);
        let factory = outputs::process::<T, U, S, F, R>(policy, Arc::new(handles), Arc::new(f), declared.opener());
        self.lock().wiring_errors.extend(declared.errors().iter().map(|e| format!("process: {e}")));
        self.process_node::<U, P>("process", policy, factory, side_ports(&declared).collect())
    }

    /// Gives each record the event time `f` extracts, and generates
    /// watermarks by `strategy` in every parallel instance of the stream
    /// (applied right after a source: per source partition). Watermarks
    /// from upstream are replaced.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weibo::time::WatermarkStrategy;
    /// use weibo::window::Tumbling;
    ///
    /// // (sensor, reading, time in ms); count readings per sensor and second.
    /// let readings = vec![(1u32, 0.5, 100), (1, 0.7, 900), (1, 0.2, 1_100), (2, 0.1, 1_500)];
    /// let mut out = weibo::testing::run(readings, |s| {
    ///     s.with_timestamps(|r: &(u32, f64, i64)| r.2, WatermarkStrategy::monotonous())
    ///         .key_by(|r| r.0)
    ///         .window(Tumbling::of(Duration::from_secs(1)))
    ///         .aggregate(weibo::window::Count)
    ///         .into_stream()
    /// })?;
    /// out.sort_by_key(|r| (r.window.start, r.key));
    /// let counts: Vec<_> = out.iter().map(|r| (r.key, r.window.start, r.value)).collect();
    /// assert_eq!(counts, vec![(1, 0, 2), (1, 1_000, 1), (2, 1_000, 1)]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn with_timestamps<F>(&self, f: F, strategy: WatermarkStrategy) -> Stream<T>
    where
        F: Fn(&T) -> Timestamp + Send + Sync + 'static,
    {
        self.timestamps(move |v: &T, _source_ts: Timestamp| f(v), strategy)
    }

    /// Keeps the event times the source gave its records (a generator with
    /// `with_timestamps`, a connector's record timestamps) and generates
    /// watermarks from them by `strategy`, as
    /// [`with_timestamps`](Self::with_timestamps) does. Records without a
    /// timestamp do not move the watermark.
    ///
    /// ```
    /// use weibo::sources::Generator;
    /// use weibo::time::WatermarkStrategy;
    /// let out = weibo::testing::run_job(|job| {
    ///     job.source(Generator::new(3, |i| i).with_timestamps(|i| i as i64 * 1000))
    ///         .with_watermarks(WatermarkStrategy::monotonous())
    ///         .key_by(|_: &u64| ())
    ///         .window(weibo::window::Tumbling::of(std::time::Duration::from_secs(2)))
    ///         .aggregate(weibo::window::Count)
    ///         .into_stream()
    /// })?;
    /// assert_eq!(out.iter().map(|r| r.value).collect::<Vec<_>>(), vec![2, 1]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn with_watermarks(&self, strategy: WatermarkStrategy) -> Stream<T> {
        self.timestamps(|_: &T, source_ts: Timestamp| source_ts, strategy)
    }

    fn timestamps<F>(&self, f: F, strategy: WatermarkStrategy) -> Stream<T>
    where
        F: Fn(&T, Timestamp) -> Timestamp + Send + Sync + 'static,
    {
        let stream = self.stateless::<T>("timestamps", watermarks::timestamps::<T, F>(Arc::new(f), strategy));
        if let Some(n) = stream.lock().nodes.get_mut(stream.node) {
            n.detail = strategy.describe();
        }
        stream
    }

    /// Merges this stream with `other` (same record type).
    ///
    /// ```
    /// let mut t = weibo::testing::TestJob::new("union");
    /// let a = t.input(vec![1, 2]);
    /// let b = t.input(vec![10]);
    /// let all = t.collect(&a.union(&b));
    /// t.run()?;
    /// let mut got = all.values();
    /// got.sort();
    /// assert_eq!(got, vec![1, 2, 10]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn union(&self, other: &Stream<T>) -> Stream<T> {
        self.merge(other, "union")
    }

    /// The union of this stream and `other`, for `what` (`union`, or what
    /// is built on it, named in the wiring error).
    pub(crate) fn merge(&self, other: &Stream<T>, what: &str) -> Stream<T> {
        if !Arc::ptr_eq(&self.graph, &other.graph) {
            self.lock()
                .wiring_errors
                .push(format!("`{what}` of streams from two different jobs: both must come from the same `Job`"));
        }
        let node = self.add(Node {
            kind: "union",
            name: "union".into(),
            uid: None,
            state_version: 1,
            named: false,
            stateful: false,
            detail: String::new(),
            inputs: vec![self.forward(), other.forward()],
            outputs: vec![port::<T>("output", true)],
            op: Op::Union,
        });
        Stream::new(self.graph.clone(), node, 0)
    }

    /// Partitions the stream by the key `f` computes, for per-key state and
    /// parallelism. Records cross a shuffle edge here, so `T` needs a codec.
    ///
    /// ```
    /// # use weibo::Key;
    /// #[derive(Clone, Debug, PartialEq, Eq, Hash, Key)]
    /// struct CustomerId(u64);
    ///
    /// let mut out = weibo::testing::run(vec![(1u64, 5i64), (2, 1), (1, 2)], |s| {
    ///     s.key_by(|o: &(u64, i64)| CustomerId(o.0))
    ///         .with_partitions(2)
    ///         .reduce(|a, b| (a.0, a.1 + b.1))
    /// })?;
    /// out.sort();
    /// assert_eq!(out, vec![(1, 5), (1, 7), (2, 1)]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn key_by<K, F>(&self, f: F) -> KeyedStream<K, T>
    where
        K: Key,
        T: Data,
        F: Fn(&T) -> K + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        KeyedStream {
            upstream: self.clone(),
            key: f.clone(),
            router: key_router::<T, K, F>(f),
            partitions: 1,
            _k: PhantomData,
        }
    }

    /// Sends every record to `sink`.
    ///
    /// ```
    /// let sink = weibo::sinks::CollectSink::new();
    /// let job = weibo::Job::new("to-sink");
    /// job.source(weibo::sources::IterSource::new(vec!["a", "b"])).sink(sink.clone());
    /// weibo::testing::block_on(job.run())?;
    /// assert_eq!(sink.values(), vec!["a", "b"]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn sink<S: Sink<T>>(&self, sink: S) -> SinkRef {
        let name = sink.default_name();
        let factory = crate::operator::sink::plain::<T, S>(Arc::new(sink));
        let node = self.add(Node {
            kind: "sink",
            name,
            uid: None,
            state_version: 1,
            named: false,
            stateful: false,
            detail: String::new(),
            inputs: vec![self.forward()],
            outputs: Vec::new(),
            op: Op::Chain(factory),
        });
        SinkRef { graph: self.graph.clone(), node }
    }

    /// Sends every record to an exactly-once sink: records are written in
    /// epochs between checkpoint barriers, pre-committed at each barrier and
    /// committed once the checkpoint is complete (see
    /// [`TwoPhaseCommitSink`]). Without checkpoints, everything is committed
    /// at the end of input.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let job = weibo::Job::new("exactly-once");
    /// job.source(weibo::sources::IterSource::new(vec![1u32, 2, 3]))
    ///     .sink_exactly_once(weibo::sinks::TxnFileSink::json_lines(dir.path()));
    /// weibo::testing::block_on(job.run())?;
    /// // One committed part (named for the instance, epoch and run), nothing pending.
    /// let committed: Vec<_> = std::fs::read_dir(dir.path())?.flatten().filter(|e| e.path().is_file()).collect();
    /// assert_eq!(committed.len(), 1);
    /// assert!(committed[0].file_name().to_string_lossy().starts_with("part-0-00000000000000000001-"));
    /// assert_eq!(std::fs::read_to_string(committed[0].path())?, "1\n2\n3\n");
    /// assert_eq!(std::fs::read_dir(dir.path().join(".pending"))?.count(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sink_exactly_once<S>(&self, sink: S) -> SinkRef
    where
        S: TwoPhaseCommitSink<T>,
    {
        let name = sink.default_name();
        let sink = Arc::new(sink);
        let prepared = Arc::new(Prepared::default());
        let committer: Arc<dyn Committer> =
            Arc::new(SinkCommitter { sink: sink.clone(), prepared: prepared.clone(), _t: PhantomData::<fn(T)> });
        let factory = crate::operator::sink::exactly_once::<T, S>(sink, prepared);
        let node = self.add(Node {
            kind: "sink",
            name,
            uid: None,
            state_version: 1,
            named: false,
            stateful: true,
            detail: "exactly once".into(),
            inputs: vec![self.forward()],
            outputs: Vec::new(),
            op: Op::Chain(factory),
        });
        self.lock().config.commits.register(node, committer);
        SinkRef { graph: self.graph.clone(), node }
    }

    /// Not available: `reduce` needs a keyed stream. Call `key_by` first.
    #[doc(hidden)]
    pub fn reduce<F>(&self, _f: F) -> Stream<T>
    where
        Self: NeedsKeyedStream<reduce>,
    {
        self.clone()
    }

    /// Not available: `fold` needs a keyed stream. Call `key_by` first.
    #[doc(hidden)]
    pub fn fold<A, I, F>(&self, _init: I, _f: F) -> Stream<T>
    where
        Self: NeedsKeyedStream<fold>,
    {
        self.clone()
    }

    /// Not available: `aggregate` needs a keyed stream. Call `key_by` first.
    #[doc(hidden)]
    pub fn aggregate<G>(&self, _agg: G) -> Stream<T>
    where
        Self: NeedsKeyedStream<aggregate>,
    {
        self.clone()
    }

    /// Not available: partitions split a key space. Call `key_by` first.
    #[doc(hidden)]
    #[must_use]
    pub fn with_partitions(self, _n: usize) -> Self
    where
        Self: NeedsKeyedStream<with_partitions>,
    {
        self
    }
}

pub(crate) fn policy_detail(policy: Policy) -> String {
    match policy {
        Policy::Drop => "on error: drop".into(),
        Policy::DeadLetter => "on error: dead letter".into(),
        Policy::Fail => "on error: fail".into(),
    }
}

/// A sink in a job's graph; use it to name the sink.
///
/// ```
/// let job = weibo::Job::new("sinks");
/// let sink: weibo::SinkRef = job.source(weibo::sources::IterSource::new(vec![1u32])).sink(weibo::sinks::Blackhole::new());
/// let _ = sink.name("discard");
/// assert!(job.to_string().contains("sink `discard`"));
/// ```
pub struct SinkRef {
    graph: Arc<Mutex<Pipeline>>,
    node: NodeId,
}

impl std::fmt::Debug for SinkRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkRef").field("node", &self.node).finish()
    }
}

impl SinkRef {
    /// Names the sink (names show in the graph, metrics and errors).
    ///
    /// ```
    /// let job = weibo::Job::new("named-sink");
    /// job.source(weibo::sources::IterSource::new(vec![1u32])).sink(weibo::sinks::Blackhole::new()).name("archive");
    /// assert!(job.to_string().contains("`archive`"));
    /// ```
    pub fn name(self, name: &str) -> Self {
        let mut graph = self.graph.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(message) = graph.rename(self.node, name) {
            graph.wiring_errors.push(message);
        }
        drop(graph);
        self
    }

    /// Gives the sink a stable id (see [`Stream::uid`]): an exactly-once
    /// sink's pending commits are filed under it.
    ///
    /// ```
    /// let dir = std::env::temp_dir().join(format!("weibo-uid-doc-{}", std::process::id()));
    /// let job = weibo::Job::new("sink-ids");
    /// job.source(weibo::sources::IterSource::new(vec![1u32]))
    ///     .sink_exactly_once(weibo::sinks::TxnFileSink::json_lines(&dir))
    ///     .uid("archive");
    /// assert!(job.to_string().contains("[id archive]"));
    /// ```
    pub fn uid(self, id: &str) -> Self {
        let mut graph = self.graph.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(message) = graph.set_uid(self.node, id) {
            graph.wiring_errors.push(message);
        }
        drop(graph);
        self
    }
}

/// A stream partitioned by a key of type `K`: every key has its own state,
/// and the key space is split over [`with_partitions`](Self::with_partitions)
/// workers by key group.
///
/// ```
/// use weibo::KeyedStream;
/// let out = weibo::testing::run(vec![("a".to_string(), 1u32), ("b".to_string(), 2), ("a".to_string(), 3)], |s| {
///     let by_user: KeyedStream<String, (String, u32)> = s.key_by(|r: &(String, u32)| r.0.clone());
///     by_user.reduce(|acc, r| (acc.0, acc.1 + r.1))
/// })?;
/// assert_eq!(out.last(), Some(&("a".to_string(), 4)));
/// # Ok::<(), weibo::Error>(())
/// ```
pub struct KeyedStream<K, T> {
    upstream: Stream<T>,
    /// The key function (what `connect` keys each input by).
    key: Arc<dyn Fn(&T) -> K + Send + Sync>,
    /// The router onto the keyed operator's instances, over the key function.
    router: Arc<dyn crate::operator::factory::RouterFactory>,
    partitions: usize,
    _k: PhantomData<fn() -> K>,
}

impl<K, T> Clone for KeyedStream<K, T> {
    fn clone(&self) -> Self {
        Self {
            upstream: self.upstream.clone(),
            key: self.key.clone(),
            router: self.router.clone(),
            partitions: self.partitions,
            _k: PhantomData,
        }
    }
}

impl<K, T> std::fmt::Debug for KeyedStream<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedStream")
            .field("key", &std::any::type_name::<K>())
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Runs the keyed operators that follow on `n` workers (at least 1, at
    /// most the job's key groups). Each worker owns a contiguous range of
    /// key groups.
    ///
    /// ```
    /// let job = weibo::Job::new("parallel");
    /// job.source(weibo::sources::IterSource::new(0..100u32))
    ///     .key_by(|x: &u32| x % 10)
    ///     .with_partitions(4)
    ///     .reduce(|a, b| a + b)
    ///     .sink(weibo::sinks::Blackhole::new());
    /// assert!(job.plan()?.contains("chain `reduce` x4"));
    /// # Ok::<(), weibo::Error>(())
    /// ```
    #[must_use]
    pub fn with_partitions(mut self, n: usize) -> Self {
        self.partitions = n;
        self
    }

    pub(crate) fn upstream(&self) -> &Stream<T> {
        &self.upstream
    }

    pub(crate) fn keyed_node(
        &self,
        kind: &'static str,
        outputs: Vec<Port>,
        factory: Arc<dyn KeyedFactory>,
    ) -> (Arc<Mutex<Pipeline>>, NodeId) {
        keyed_node_on::<K, T>(&self.upstream, self.router.clone(), self.partitions, kind, outputs, factory)
    }

    /// Combines each record with the key's running value and emits the new
    /// value (one output per input record).
    ///
    /// ```
    /// # use weibo::Key;
    /// let out = weibo::testing::run(vec![("a".to_string(), 1), ("a".to_string(), 2)], |s| {
    ///     s.key_by(|r: &(String, i32)| r.0.clone()).reduce(|acc, r| (acc.0, acc.1 + r.1))
    /// })?;
    /// assert_eq!(out, vec![("a".to_string(), 1), ("a".to_string(), 3)]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn reduce<F>(&self, f: F) -> Stream<T>
    where
        F: Fn(T, T) -> T + Send + Sync + 'static,
    {
        let factory = keyed::reduce::<K, T, F>(Arc::new(f));
        let (graph, node) = self.keyed_node("reduce", vec![port::<T>("output", true)], factory);
        Stream::new(graph, node, 0)
    }

    /// Folds each key's records into an accumulator that starts as
    /// `init()`; emits `(key, accumulator)` after every record.
    ///
    /// ```
    /// let mut out = weibo::testing::run(vec![3u32, 4, 5, 6], |s| {
    ///     s.key_by(|x: &u32| x % 2 == 0).fold(Vec::new, |acc: &mut Vec<u32>, x| acc.push(x))
    /// })?;
    /// out.sort();
    /// assert_eq!(out.last(), Some(&(true, vec![4, 6])));
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn fold<A, I, F>(&self, init: I, f: F) -> Stream<(K, A)>
    where
        A: Data,
        I: Fn() -> A + Send + Sync + 'static,
        F: Fn(&mut A, T) + Send + Sync + 'static,
    {
        self.fold_with("fold", init, f, |key: K, acc: &A| (key, acc.clone()))
    }

    /// Aggregates each key's records with `agg` (an accumulator type with
    /// `create`, `add` and `result`); emits `(key, result)` after every
    /// record.
    ///
    /// ```
    /// use weibo::Aggregate;
    ///
    /// /// The mean of the readings seen so far.
    /// struct Mean;
    /// impl Aggregate<(String, f64)> for Mean {
    ///     type Acc = (f64, u64);
    ///     type Out = f64;
    ///     fn create(&self) -> (f64, u64) { (0.0, 0) }
    ///     fn add(&self, acc: &mut (f64, u64), reading: (String, f64)) { acc.0 += reading.1; acc.1 += 1; }
    ///     fn merge(&self, acc: &mut (f64, u64), other: (f64, u64)) { acc.0 += other.0; acc.1 += other.1; }
    ///     fn result(&self, acc: &(f64, u64)) -> f64 { acc.0 / acc.1 as f64 }
    /// }
    ///
    /// let readings = vec![("a".to_string(), 1.0), ("a".to_string(), 3.0)];
    /// let out = weibo::testing::run(readings, |s| s.key_by(|r: &(String, f64)| r.0.clone()).aggregate(Mean))?;
    /// assert_eq!(out, vec![("a".to_string(), 1.0), ("a".to_string(), 2.0)]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn aggregate<G>(&self, agg: G) -> Stream<(K, G::Out)>
    where
        G: Aggregate<T>,
    {
        self.aggregate_with(agg, |key: K, result: G::Out| (key, result))
    }

    /// Like [`aggregate`](Self::aggregate), emitting `output(key, result)`
    /// after every record instead of the pair: the key goes into the
    /// result in the operator, with no step after it.
    ///
    /// ```
    /// use weibo::Aggregate;
    ///
    /// struct Count;
    /// impl Aggregate<String> for Count {
    ///     type Acc = u64;
    ///     type Out = u64;
    ///     fn create(&self) -> u64 { 0 }
    ///     fn add(&self, acc: &mut u64, _word: String) { *acc += 1; }
    ///     fn merge(&self, acc: &mut u64, other: u64) { *acc += other; }
    ///     fn result(&self, acc: &u64) -> u64 { *acc }
    /// }
    ///
    /// let words = vec!["a".to_string(), "b".to_string(), "a".to_string()];
    /// let out = weibo::testing::run(words, |s| {
    ///     s.key_by(|w: &String| w.clone()).aggregate_with(Count, |word: String, n| format!("{word}={n}"))
    /// })?;
    /// assert_eq!(out, vec!["a=1", "b=1", "a=2"]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn aggregate_with<G, O, R>(&self, agg: G, output: R) -> Stream<O>
    where
        G: Aggregate<T>,
        O: Clone + Send + 'static,
        R: Fn(K, G::Out) -> O + Send + Sync + 'static,
    {
        let agg = Arc::new(agg);
        let (create, add, result) = (agg.clone(), agg.clone(), agg);
        self.fold_with(
            "aggregate",
            move || create.create(),
            move |acc: &mut G::Acc, v: T| add.add(acc, v),
            move |key: K, acc: &G::Acc| output(key, result.result(acc)),
        )
    }

    fn fold_with<A, O, I, F, R>(&self, kind: &'static str, init: I, f: F, output: R) -> Stream<O>
    where
        A: Data,
        O: Clone + Send + 'static,
        I: Fn() -> A + Send + Sync + 'static,
        F: Fn(&mut A, T) + Send + Sync + 'static,
        R: Fn(K, &A) -> O + Send + Sync + 'static,
    {
        let factory = keyed::fold::<K, T, A, O, I, F, R>(Arc::new(init), Arc::new(f), Arc::new(output));
        let (graph, node) = self.keyed_node(kind, vec![port::<O>("output", true)], factory);
        Stream::new(graph, node, 0)
    }

    /// Runs `f` on each record with the key and its state (`Option<S>`,
    /// `None` until first set; set it to `None` to clear it); `f` emits
    /// results through the context. A failing `f` is handled by `policy` as
    /// in [`Stream::process`]; state changes it made before failing are kept.
    ///
    /// ```
    /// use weibo::{on_error, KeyedContext};
    /// // Emit a record only the first time its key is seen (deduplication).
    /// let out = weibo::testing::run(vec![1u32, 2, 1, 3, 2], |s| {
    ///     s.key_by(|x: &u32| *x).process(
    ///         on_error::Fail,
    ///         |ctx: &mut KeyedContext<'_, u32, bool, u32>, x: &u32| {
    ///             if ctx.state().is_none() {
    ///                 *ctx.state() = Some(true);
    ///                 ctx.emit(*x);
    ///             }
    ///             Ok::<(), String>(())
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out, vec![1, 2, 3]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn process<S, U, R, F, P>(&self, policy: P, f: F) -> P::Output
    where
        S: Data,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        F: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, &T) -> R + Send + Sync + 'static,
        P: on_error::OnError<T, U>,
    {
        self.process_with_timers(policy, f, |_ctx: &mut KeyedContext<'_, K, S, U>, _time| R::nothing())
    }

    /// Like [`process`](Self::process), with event-time timers: `f` (and
    /// `on_timer`) may call [`KeyedContext::register_timer`]; when the
    /// operator's watermark reaches a timer's time, `on_timer` runs with
    /// that key's context and the timer's time. Timers live in keyed state.
    ///
    /// A failing `on_timer` has no record to dead-letter: under
    /// [`on_error::Fail`] it stops the job, under the other policies it is
    /// counted as dropped.
    ///
    /// ```
    /// use weibo::{KeyedContext, on_error, time::WatermarkStrategy};
    ///
    /// // Emit each key's count 10 ms (event time) after its first record.
    /// // Record `i` is judged under the watermark of records `0..i` (ts - 1
    /// // of the latest): a@30 still counts for a's timer at 10, which fires
    /// // only when b@40 arrives (watermark 29); b@40 starts a new count.
    /// let events = vec![("a", 0), ("a", 4), ("b", 5), ("a", 30), ("b", 40)];
    /// let mut out = weibo::testing::run(events, |s| {
    ///     s.with_timestamps(|e: &(&str, i64)| e.1, WatermarkStrategy::monotonous())
    ///         .map(|e| (e.0.to_string(), e.1))
    ///         .key_by(|e: &(String, i64)| e.0.clone())
    ///         .process_with_timers(
    ///             on_error::Fail,
    ///             |ctx: &mut KeyedContext<'_, String, u32, (String, u32)>, e: &(String, i64)| {
    ///                 if ctx.state().is_none() {
    ///                     ctx.register_timer(e.1 + 10);
    ///                 }
    ///                 *ctx.state().get_or_insert(0) += 1;
    ///                 Ok::<(), String>(())
    ///             },
    ///             |ctx, _time| {
    ///                 let key = ctx.key().clone();
    ///                 if let Some(n) = ctx.state().take() {
    ///                     ctx.emit((key, n));
    ///                 }
    ///                 Ok(())
    ///             },
    ///         )
    /// })?;
    /// out.sort();
    /// assert_eq!(out, vec![("a".to_string(), 3), ("b".to_string(), 1), ("b".to_string(), 1)]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn process_with_timers<S, U, R, F, G, P>(&self, policy: P, f: F, on_timer: G) -> P::Output
    where
        S: Data,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        F: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, &T) -> R + Send + Sync + 'static,
        G: for<'c> Fn(&mut KeyedContext<'c, K, S, U>, Timestamp) -> R + Send + Sync + 'static,
        P: on_error::OnError<T, U>,
    {
        let policy = policy.policy();
        let factory = keyed::process::<K, T, S, U, R, F, G>(policy, Arc::new(f), Arc::new(on_timer));
        let (graph, node) =
            self.keyed_node("keyed_process", vec![port::<U>("output", true), dead_letters::<T>(policy)], factory);
        if let Some(n) = graph.lock().unwrap_or_else(PoisonError::into_inner).nodes.get_mut(node) {
            n.detail = policy_detail(policy);
        }
        P::output(Stream::new(graph.clone(), node, 0), Stream::new(graph, node, 1))
    }

    /// Runs a [`KeyedProcessFunction`] written as a type, with named state:
    /// `declare` gets the operator's [`States`] (once, when the job is
    /// wired), declares the function's states on it and returns the
    /// function holding their handles. Each state is checkpointed, restored
    /// and shown on its own, by name; the function's timers are the state
    /// `timers`. See the trait for an example.
    ///
    /// # Panics
    /// Never; a state name that is not allowed or declared twice is a
    /// wiring error, reported when the job is planned or run.
    pub fn process_function<F, D, P>(&self, policy: P, declare: D) -> P::Output
    where
        D: FnOnce(&mut States<K>) -> F,
        F: KeyedProcessFunction<K, T>,
        P: on_error::OnError<T, F::Out>,
    {
        let mut states = States::new();
        let function = declare(&mut states);
        self.function_node(policy, Arc::new(function), &states)
    }

    /// A keyed `process` with named state, as closures: `declare` declares
    /// the states (once, when the job is wired) and returns their handles,
    /// which `f` gets with the context and each record. `f` returns nothing
    /// when it cannot fail, or a `Result` whose error fails the record
    /// under `policy`. See [`States`] for an example.
    ///
    /// # Panics
    /// Never; as [`process_function`](Self::process_function).
    pub fn process_with_state<S, U, R, D, F, P>(&self, policy: P, declare: D, f: F) -> P::Output
    where
        S: Send + Sync + 'static,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        D: FnOnce(&mut States<K>) -> S,
        F: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &T) -> R + Send + Sync + 'static,
        P: on_error::OnError<T, U>,
    {
        let mut states = States::new();
        let handles = declare(&mut states);
        let function =
            ClosureFunction::new(handles, f, |_: &mut ProcessContext<'_, K, U>, _: &S, _: Timer| R::nothing());
        self.function_node(policy, Arc::new(function), &states)
    }

    /// Like [`process_with_state`](Self::process_with_state), with timers:
    /// `on_timer` runs, with the key's context and the states' handles,
    /// for each timer `f` (or `on_timer`) set, when it fires.
    ///
    /// ```
    /// use weibo::{Timer, on_error};
    ///
    /// // Sum each key's values and report the sum 1 s (event time) after
    /// // the key's first record.
    /// let out = weibo::testing::run_timed(vec![(100, ('a', 2)), (150, ('a', 3)), (5_000, ('b', 1))], |s| {
    ///     s.key_by(|r: &(char, u32)| r.0).process_with_state_and_timers(
    ///         on_error::Fail,
    ///         |states| states.reducing("sum", |a: u32, b| a + b),
    ///         |ctx, sum, r| {
    ///             if ctx.reducing(sum).get().is_none() {
    ///                 ctx.register_timer(ctx.timestamp().unwrap_or(0) + 1_000);
    ///             }
    ///             ctx.reducing(sum).add(r.1);
    ///         },
    ///         |ctx, sum, timer: Timer| {
    ///             let total = ctx.reducing(sum).get().unwrap_or(0);
    ///             ctx.reducing(sum).clear();
    ///             let line = format!("{} at {}: {total}", ctx.key(), timer.time);
    ///             ctx.emit(line);
    ///         },
    ///     )
    /// })?;
    /// assert_eq!(out, vec!["a at 1100: 5".to_string(), "b at 6000: 1".to_string()]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    ///
    /// # Panics
    /// Never; as [`process_function`](Self::process_function).
    pub fn process_with_state_and_timers<S, U, R, D, F, G, P>(
        &self,
        policy: P,
        declare: D,
        f: F,
        on_timer: G,
    ) -> P::Output
    where
        S: Send + Sync + 'static,
        U: Clone + Send + 'static,
        R: ProcessOutcome + 'static,
        D: FnOnce(&mut States<K>) -> S,
        F: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, &T) -> R + Send + Sync + 'static,
        G: for<'c> Fn(&mut ProcessContext<'c, K, U>, &S, Timer) -> R + Send + Sync + 'static,
        P: on_error::OnError<T, U>,
    {
        let mut states = States::new();
        let handles = declare(&mut states);
        self.function_node(policy, Arc::new(ClosureFunction::new(handles, f, on_timer)), &states)
    }

    fn function_node<F, P>(&self, policy: P, function: Arc<F>, states: &States<K>) -> P::Output
    where
        F: KeyedProcessFunction<K, T>,
        P: on_error::OnError<T, F::Out>,
    {
        let policy = policy.policy();
        let factory = function::factory::<K, T, F>(policy, function, states, None);
        function_node_on::<K, T, F::Out, P>(
            (&self.upstream, self.router.clone(), self.partitions),
            policy,
            factory,
            states,
        )
    }

    /// Sends every record to `sink`, partitioned by key: each sink instance
    /// receives the keys of its key groups.
    ///
    /// ```
    /// // Every worker of the keyed stream writes its key groups' records.
    /// let out = weibo::sinks::CollectSink::new();
    /// let job = weibo::Job::new("partitioned-sink");
    /// job.source(weibo::sources::IterSource::new(0..6u32)).key_by(|x: &u32| x % 3).with_partitions(2).sink(out.clone());
    /// job.run_blocking()?;
    /// let mut got = out.values();
    /// got.sort();
    /// assert_eq!(got, vec![0, 1, 2, 3, 4, 5]);
    /// # Ok::<(), weibo::Error>(())
    /// ```
    pub fn sink<Sk: Sink<T>>(&self, sink: Sk) -> SinkRef {
        let factory = keyed::partition::<K, T>();
        let (graph, node) = self.keyed_node("partition", vec![port::<T>("output", true)], factory);
        Stream::<T>::new(graph, node, 0).sink(sink)
    }
}

/// A keyed operator node fed by `upstream` through `router`, on
/// `partitions` instances.
pub(crate) fn keyed_node_on<K: Key, T: Data>(
    upstream: &Stream<T>,
    router: Arc<dyn crate::operator::factory::RouterFactory>,
    partitions: usize,
    kind: &'static str,
    outputs: Vec<Port>,
    factory: Arc<dyn KeyedFactory>,
) -> (Arc<Mutex<Pipeline>>, NodeId) {
    let node = upstream.add(Node {
        kind,
        name: kind.to_string(),
        uid: None,
        state_version: 1,
        named: false,
        stateful: kind != "partition",
        detail: String::new(),
        inputs: vec![Input {
            from: upstream.node,
            port: upstream.port,
            kind: EdgeKind::Hash {
                key_type: std::any::type_name::<K>(),
                key_schema: K::key_schema,
                codec: T::codec_id(),
            },
        }],
        outputs,
        op: Op::Keyed { parallelism: partitions, router, factory },
    });
    (upstream.graph.clone(), node)
}

/// The node of a keyed process function made by `factory` (its outputs:
/// results, dead letters, the side outputs `states` declared), fed by
/// `upstream` through `router` on `partitions` instances.
pub(crate) fn function_node_on<K, T, U, P>(
    (upstream, router, partitions): (&Stream<T>, Arc<dyn crate::operator::factory::RouterFactory>, usize),
    policy: Policy,
    factory: Arc<dyn KeyedFactory>,
    states: &States<K>,
) -> P::Output
where
    K: Key,
    T: Data,
    U: Clone + Send + 'static,
    P: on_error::OnError<T, U>,
{
    let mut outputs = vec![port::<U>("output", true), dead_letters::<T>(policy)];
    outputs.extend(side_ports(states.outputs()));
    let (graph, node) = keyed_node_on::<K, T>(upstream, router, partitions, "keyed_process", outputs, factory);
    let (names, errors) = states.finish();
    {
        let mut pipeline = graph.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = pipeline.nodes.get_mut(node) {
            n.detail = if names.is_empty() {
                policy_detail(policy)
            } else {
                format!("{}; states: {}", policy_detail(policy), names.join(", "))
            };
        }
        pipeline.wiring_errors.extend(errors.into_iter().map(|e| format!("keyed process: {e}")));
    }
    P::output(Stream::new(graph.clone(), node, 0), Stream::new(graph, node, 1))
}
