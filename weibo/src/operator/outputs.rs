//! Typed side outputs: the tag a function sends to ([`OutputTag`]), an
//! operator's declaration of the side outputs it sends to ([`Outputs`]),
//! an instance's typed ends of them, and the stateless `process` with side
//! outputs ([`OutputContext`]). Dead letters and late records are side
//! outputs too, with tags of their own ([`OutputTag::dead_letters`],
//! [`OutputTag::late_records`]).

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::factory::{ChainFactory, chain_factory};
use super::policy::{DeadLetter, Failures, Policy};
use super::stateless::{PortType, TypedPort};
use super::{AnyConsumer, Consumer, OpInfo, emit, erase, typed};
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::operator::function::ProcessOutcome;
use crate::record::{Batch, CheckpointId, Meta, Timestamp};

/// A typed side output (Flink's `OutputTag`, Kafka Streams' branches):
/// made with a name, declared by the functions that send to it
/// ([`Outputs::side_output`], [`States::side_output`](crate::States::side_output)),
/// sent to with [`OutputContext::output`] or
/// [`ProcessContext::output`](crate::ProcessContext::output), and read as
/// a `Stream<V>` with [`Stream::side_output`](crate::Stream::side_output)
/// on the function's results. A side output nothing reads is discarded.
pub struct OutputTag<V> {
    id: u32,
    name: Arc<str>,
    _types: PhantomData<fn() -> V>,
}

impl<V> Clone for OutputTag<V> {
    fn clone(&self) -> Self {
        Self { id: self.id, name: self.name.clone(), _types: PhantomData }
    }
}

/// The tag of every `process`'s dead letters.
pub(crate) const DEAD_LETTERS: u32 = 1;
/// The tag of every window's late records.
pub(crate) const LATE_RECORDS: u32 = 2;

/// Tells tags apart (two tags may share a name); the first ids are the
/// tags of dead letters and late records.
static TAGS: AtomicU32 = AtomicU32::new(16);

impl<V> fmt::Debug for OutputTag<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputTag").field("name", &self.name).finish_non_exhaustive()
    }
}

impl<V: Clone + Send + 'static> OutputTag<V> {
    /// A side output named `name` (its label in the plan).
    pub fn new(name: &str) -> Self {
        Self { id: TAGS.fetch_add(1, Ordering::Relaxed), name: name.into(), _types: PhantomData }
    }

    /// The records a window took too late for any of its windows, as a
    /// side output of the window's results (see
    /// [`WindowedOutput::side_output`](crate::stream::window::WindowedOutput::side_output)):
    /// the same stream as
    /// [`late_records`](crate::stream::window::WindowedOutput::late_records).
    pub fn late_records() -> Self {
        Self { id: LATE_RECORDS, name: "late records".into(), _types: PhantomData }
    }
}

impl<T: Clone + Send + 'static> OutputTag<DeadLetter<T>> {
    /// The records a `process` failed on under
    /// [`on_error::DeadLetter`](crate::on_error::DeadLetter), as a side
    /// output of its results: the same stream as the second one that
    /// policy returns.
    pub fn dead_letters() -> Self {
        Self { id: DEAD_LETTERS, name: "dead letters".into(), _types: PhantomData }
    }
}

impl<V> OutputTag<V> {
    /// The side output's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What tells it apart from every other tag.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }
}

/// Makes an instance's side output from the consumer of its port.
type OpenSide = Arc<dyn Fn(AnyConsumer, &str) -> Result<Box<dyn SideOutput>> + Send + Sync>;

/// One declared side output: its name and type (its port in the graph),
/// and how an instance gets its typed end.
struct DeclaredSide {
    id: u32,
    name: String,
    type_name: &'static str,
    ty: Arc<dyn PortType>,
    open: OpenSide,
}

/// The side outputs a function sends to, declared when the job is wired:
/// each call of [`Outputs::side_output`] adds one (an output port of the
/// operator, after its results and dead letters).
///
/// ```
/// use weibo::{on_error, process::OutputTag};
///
/// // Small amounts to a side output of their own type, the others on.
/// let mut t = weibo::testing::TestJob::new("split");
/// let small = OutputTag::<String>::new("small");
/// let large = t.input(vec![("a".to_string(), 20u32), ("b".to_string(), 500)]).process_with_outputs(
///     on_error::Fail,
///     |outputs| outputs.side_output(&small),
///     |ctx, small, r| {
///         if r.1 < 100 {
///             ctx.output(small, format!("{} small", r.0));
///         } else {
///             ctx.emit(r.1);
///         }
///     },
/// );
/// let smalls = large.side_output(&small);
/// let (large, smalls) = (t.collect(&large), t.collect(&smalls));
/// t.run()?;
/// assert_eq!(large.values(), vec![500]);
/// assert_eq!(smalls.values(), vec!["a small".to_string()]);
/// # Ok::<(), weibo::Error>(())
/// ```
#[derive(Default)]
pub struct Outputs {
    sides: Vec<DeclaredSide>,
    errors: Vec<String>,
}

impl fmt::Debug for Outputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.sides.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct("Outputs").field("sides", &names).finish_non_exhaustive()
    }
}

impl Outputs {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Declares the side output `tag` (values of type `V`, read with
    /// [`Stream::side_output`](crate::Stream::side_output) on the
    /// function's results); returns the tag, for the function to keep.
    ///
    /// # Panics
    /// Never; a name declared twice, or taken by the operator's results or
    /// dead letters, is a wiring error, reported when the job is planned
    /// or run.
    pub fn side_output<V: Clone + Send + 'static>(&mut self, tag: &OutputTag<V>) -> OutputTag<V> {
        if tag.id < TAGS_FIRST || is_taken(&tag.name) {
            self.errors
                .push(format!("side output `{}` is declared twice or takes the name of another output", tag.name));
        }
        self.declare(tag)
    }

    /// Declares the late records output of an operator that has one
    /// (a join): [`OutputTag::late_records`], which users may not declare.
    pub(crate) fn late_records<V: Clone + Send + 'static>(&mut self) -> OutputTag<V> {
        self.declare(&OutputTag::late_records())
    }

    fn declare<V: Clone + Send + 'static>(&mut self, tag: &OutputTag<V>) -> OutputTag<V> {
        let name = tag.name();
        if self.sides.iter().any(|s| s.name == name || s.id == tag.id) {
            self.errors.push(format!("side output `{name}` is declared twice or takes the name of another output"));
        }
        let open: OpenSide = Arc::new(|consumer, operator| {
            Ok(Box::new(TypedSide::<V> { out: Batch::with_capacity(16), next: typed::<V>(consumer, operator)? }))
        });
        self.sides.push(DeclaredSide {
            id: tag.id,
            name: name.to_string(),
            type_name: std::any::type_name::<V>(),
            ty: TypedPort::<V>::shared(),
            open,
        });
        tag.clone()
    }

    /// The declared side outputs, in order: name, type name, port type,
    /// and their tag's id.
    pub(crate) fn side_outputs(&self) -> impl Iterator<Item = (&str, &'static str, Arc<dyn PortType>, u32)> {
        self.sides.iter().map(|s| (s.name.as_str(), s.type_name, s.ty.clone(), s.id))
    }

    /// The wiring errors of the declaration.
    pub(crate) fn errors(&self) -> &[String] {
        &self.errors
    }

    /// What opens an instance's ends of the side outputs.
    pub(crate) fn opener(&self) -> SidesOpener {
        SidesOpener(self.sides.iter().map(|s| (s.id, s.open.clone())).collect())
    }
}

/// The first id [`OutputTag::new`] gives (those below are reserved).
const TAGS_FIRST: u32 = 16;

/// Whether `name` is taken by an operator's own outputs.
fn is_taken(name: &str) -> bool {
    matches!(name, "output" | "dead letters" | "late records")
}

/// Opens an instance's ends of the side outputs an [`Outputs`] declared.
#[derive(Clone)]
pub(crate) struct SidesOpener(Arc<[(u32, OpenSide)]>);

impl SidesOpener {
    /// How many side outputs there are.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Opens each side output on the consumer of its port (`outs`, in the
    /// order declared).
    pub(crate) fn open(&self, outs: Vec<AnyConsumer>, operator: &str) -> Result<Sides> {
        if outs.len() != self.0.len() {
            return Err(crate::error::internal_error!(
                "`{operator}` has {} side outputs, not {}",
                outs.len(),
                self.0.len()
            ));
        }
        let sides = self
            .0
            .iter()
            .zip(outs)
            .map(|((id, open), consumer)| Ok((*id, open(consumer, operator)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Sides(sides))
    }
}

/// An instance's outputs of a process function (keyed or not): its
/// results, its dead letters (under `on_error::DeadLetter`), and its side
/// outputs, opened from the consumers of its ports (`outs`: results, dead
/// letters, then the side outputs `opener` opens, in order).
pub(crate) type ProcessOutputs<U, I> = (Box<dyn Consumer<U>>, Option<Box<dyn Consumer<DeadLetter<I>>>>, Sides);

/// See [`ProcessOutputs`].
pub(crate) fn open_process_outputs<U: 'static, I: 'static>(
    mut outs: Vec<AnyConsumer>,
    policy: Policy,
    opener: &SidesOpener,
    operator: &str,
) -> Result<ProcessOutputs<U, I>> {
    if outs.len() != 2 + opener.len() {
        return Err(crate::error::internal_error!("`{operator}` has {} outputs, not {}", outs.len(), 2 + opener.len()));
    }
    let sides = opener.open(outs.split_off(2), operator)?;
    let (next, dead) = super::policy::results_and_dead::<U, I>(outs, policy, operator)?;
    Ok((next, dead, sides))
}

/// An instance's end of a side output, typed underneath.
trait SideOutput: Send {
    fn as_any(&mut self) -> &mut dyn Any;
    /// Sends what was output since the last call.
    fn emit(&mut self, info: &OpInfo) -> Result<()>;
    /// How many records wait to be emitted.
    fn pending(&self) -> usize;
    fn watermark(&mut self, wm: Timestamp) -> Result<()>;
    fn idle(&mut self) -> Result<()>;
    fn barrier(&mut self, n: CheckpointId) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    fn finish(&mut self) -> Result<()>;
}

struct TypedSide<V> {
    out: Batch<V>,
    next: Box<dyn Consumer<V>>,
}

impl<V: Clone + Send + 'static> SideOutput for TypedSide<V> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
    fn emit(&mut self, info: &OpInfo) -> Result<()> {
        emit(info, &mut *self.next, &mut self.out)
    }
    fn pending(&self) -> usize {
        self.out.len()
    }
    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.next.watermark(wm)
    }
    fn idle(&mut self) -> Result<()> {
        self.next.idle()
    }
    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        self.next.barrier(n)
    }
    fn flush(&mut self) -> Result<()> {
        self.next.flush()
    }
    fn finish(&mut self) -> Result<()> {
        self.next.finish()
    }
}

/// An instance's ends of its side outputs, by tag.
#[derive(Default)]
pub(crate) struct Sides(Vec<(u32, Box<dyn SideOutput>)>);

impl Sides {
    /// Buffers `value` for the side output `tag`, with `meta`; an error
    /// (for the caller to report) if the operator did not declare it.
    pub(crate) fn send<V: 'static>(&mut self, tag: &OutputTag<V>, value: V, meta: Meta, operator: &str) -> Result<()> {
        let side = self.0.iter_mut().find(|(id, _)| *id == tag.id);
        match side.and_then(|(_, s)| s.as_any().downcast_mut::<TypedSide<V>>()) {
            Some(side) => {
                side.out.push(value, meta);
                Ok(())
            }
            None => Err(Error::State {
                operator: operator.to_string(),
                message: format!(
                    "side output `{}` was used on an operator that did not declare it: each operator sends only \
                     to the side outputs its own declaration returned",
                    tag.name
                ),
                source: None,
            }),
        }
    }

    /// Sends what was output since the last call.
    /// Emits what each side output holds; the records sent to the late
    /// records output count as the operator's late records.
    pub(crate) fn emit(&mut self, info: &OpInfo) -> Result<()> {
        self.0.iter_mut().try_for_each(|(id, s)| {
            if *id == LATE_RECORDS {
                crate::metrics::OperatorCounters::add(&info.counters.late, s.pending());
            }
            s.emit(info)
        })
    }

    pub(crate) fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.0.iter_mut().try_for_each(|(_, s)| s.watermark(wm))
    }

    pub(crate) fn idle(&mut self) -> Result<()> {
        self.0.iter_mut().try_for_each(|(_, s)| s.idle())
    }

    pub(crate) fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        self.0.iter_mut().try_for_each(|(_, s)| s.barrier(n))
    }

    pub(crate) fn flush(&mut self) -> Result<()> {
        self.0.iter_mut().try_for_each(|(_, s)| s.flush())
    }

    pub(crate) fn finish(&mut self) -> Result<()> {
        self.0.iter_mut().try_for_each(|(_, s)| s.finish())
    }
}

/// What a stateless `process` with side outputs
/// ([`Stream::process_with_outputs`](crate::Stream::process_with_outputs))
/// sees per record: it emits results of type `U` and sends to the side
/// outputs it declared.
pub struct OutputContext<'a, U> {
    operator: &'a str,
    out: &'a mut Batch<U>,
    sides: &'a mut Sides,
    meta: Meta,
    error: &'a mut Option<Error>,
}

impl<U> fmt::Debug for OutputContext<'_, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputContext").field("meta", &self.meta).finish_non_exhaustive()
    }
}

impl<U> OutputContext<'_, U> {
    /// Emits a result; it carries the input record's metadata.
    pub fn emit(&mut self, value: U) {
        self.out.push(value, self.meta);
    }

    /// Sends `value` to the side output `tag`, with the metadata `emit`
    /// gives its results. A tag this operator did not declare stops the
    /// job with an error naming it, once the function returns.
    pub fn output<V: 'static>(&mut self, tag: &OutputTag<V>, value: V) {
        if let Err(e) = self.sides.send(tag, value, self.meta, self.operator) {
            self.error.get_or_insert(e);
        }
    }

    /// The record's event time, if it has one.
    pub fn timestamp(&self) -> Option<Timestamp> {
        (self.meta.timestamp != crate::record::NO_TIMESTAMP).then_some(self.meta.timestamp)
    }
}

/// The factory of a stateless `process` with side outputs: `f` with the
/// handles `declare` returned, its results, dead letters under `policy`,
/// and the side outputs `opener` opens.
pub(crate) fn process<I, U, S, F, R>(
    policy: Policy,
    handles: Arc<S>,
    f: Arc<F>,
    opener: SidesOpener,
) -> Arc<dyn ChainFactory>
where
    I: Clone + Send + 'static,
    U: Clone + Send + 'static,
    S: Send + Sync + 'static,
    R: ProcessOutcome + 'static,
    F: for<'c> Fn(&mut OutputContext<'c, U>, &S, &I) -> R + Send + Sync + 'static,
{
    chain_factory(move |ctx, outs| {
        let info = ctx.info.clone();
        let (next, dead, sides) = open_process_outputs::<U, I>(outs, policy, &opener, &info.name)?;
        Ok(erase::<I>(Box::new(OutputsOp {
            info,
            handles: handles.clone(),
            f: f.clone(),
            out: Batch::with_capacity(ctx.batch_size),
            next,
            sides,
            failures: Failures::new(policy, dead)?,
            _types: PhantomData,
        })))
    })
}

/// A stateless `process` with side outputs.
struct OutputsOp<I, U, S, F, R> {
    info: OpInfo,
    handles: Arc<S>,
    f: Arc<F>,
    out: Batch<U>,
    next: Box<dyn Consumer<U>>,
    sides: Sides,
    failures: Failures<I>,
    _types: PhantomData<fn() -> R>,
}

impl<I, U, S, F, R> Consumer<I> for OutputsOp<I, U, S, F, R>
where
    I: Clone + Send + 'static,
    U: Clone + Send + 'static,
    S: Send + Sync + 'static,
    R: ProcessOutcome + 'static,
    F: for<'c> Fn(&mut OutputContext<'c, U>, &S, &I) -> R + Send + Sync + 'static,
{
    fn push(&mut self, batch: &mut Batch<I>) -> Result<()> {
        OperatorCounters::add(&self.info.counters.records_in, batch.len());
        let mut error = None;
        for (v, m) in batch.values.drain(..).zip(batch.meta.drain(..)) {
            let mut ctx = OutputContext {
                operator: &self.info.name,
                out: &mut self.out,
                sides: &mut self.sides,
                meta: m,
                error: &mut error,
            };
            let failure = (self.f)(&mut ctx, &self.handles, &v).failure();
            if let Some(e) = error.take() {
                return Err(e);
            }
            if let Some(message) = failure {
                self.failures.fail(&self.info, v, m, &message)?;
            }
        }
        emit(&self.info, &mut *self.next, &mut self.out)?;
        self.sides.emit(&self.info)?;
        self.failures.push()
    }

    fn watermark(&mut self, wm: Timestamp) -> Result<()> {
        self.next.watermark(wm)?;
        self.sides.watermark(wm)?;
        self.failures.watermark(wm)
    }

    fn idle(&mut self) -> Result<()> {
        self.next.idle()?;
        self.sides.idle()?;
        self.failures.idle()
    }

    fn barrier(&mut self, n: CheckpointId) -> Result<()> {
        self.next.barrier(n)?;
        self.sides.barrier(n)?;
        self.failures.barrier(n)
    }

    fn flush(&mut self) -> Result<()> {
        self.next.flush()?;
        self.sides.flush()?;
        self.failures.flush()
    }

    fn finish(&mut self) -> Result<()> {
        self.next.finish()?;
        self.sides.finish()?;
        self.failures.finish()
    }
}
