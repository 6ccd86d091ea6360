//! How operator instances are made: a graph node holds a factory, and the
//! runtime asks it for an instance with an [`OperatorContext`], which says
//! everything the instance may know about where it runs. Factories are
//! the seam between a pipeline's description and its execution: the typed
//! DSL makes them from closures over user types, and anything else
//! (descriptors read from a file, tests) can implement the traits on
//! structs of its own.

use std::ops::Range;

use crate::error::Result;
use crate::state::{StateBackend, StateScope};

use super::source::SourceOperator;
use super::{AnyConsumer, InputOperator, OpInfo, Outbox};

/// What an operator instance is built with.
pub(crate) struct OperatorContext<'a> {
    /// The job's name.
    pub(crate) job: &'a str,
    /// The instance's name, counters, and the job's source names.
    pub(crate) info: OpInfo,
    /// This instance's number, of `parallelism`. For a source, the
    /// partition it reads.
    pub(crate) instance: usize,
    pub(crate) parallelism: usize,
    /// The key groups a keyed instance owns (empty for others).
    pub(crate) key_groups: Range<u16>,
    pub(crate) max_key_groups: u16,
    /// Records per batch, and the bytes at which an encoded batch is full.
    pub(crate) batch_size: usize,
    pub(crate) batch_bytes: usize,
    /// Where keyed state lives.
    pub(crate) state: &'a dyn StateBackend,
    /// Whether the job takes checkpoints.
    pub(crate) checkpointing: bool,
    /// The checkpoint the job restores from, if any.
    pub(crate) restored: Option<crate::record::CheckpointId>,
    /// A source partition's position in that checkpoint, if it has one.
    pub(crate) restored_position: Option<u64>,
    /// Where a router queues what it sends on its edge's channels (the
    /// task that runs it sends them).
    pub(crate) outbox: &'a Outbox,
    /// In a source partition's chain, when the job aligns watermarks: where
    /// a router publishes the chain's watermark.
    pub(crate) alignment: Option<crate::time::alignment::Aligned>,
    /// What the task running this instance reports of its time (a
    /// timestamps operator records the watermarks it generates there).
    pub(crate) task: &'a std::sync::Arc<crate::metrics::TaskCounters>,
    /// Whether records on hash edges go through their codec (see
    /// `JobConfig::verify_codecs`).
    pub(crate) verify_codecs: bool,
    /// The clock processing-time timers follow.
    pub(crate) clock: &'a crate::time::clock::Clock,
}

impl OperatorContext<'_> {
    /// The scope of this instance's state `state`.
    pub(crate) fn state_scope(&self, state: &str) -> StateScope {
        StateScope {
            job: self.job.to_string(),
            operator: self.info.id.to_string(),
            state: state.to_string(),
            key_groups: self.key_groups.clone(),
            max_key_groups: self.max_key_groups,
        }
    }
}

/// Makes instances of a fused (chained) operator or a sink, given the
/// consumers of its output ports.
pub(crate) trait ChainFactory: Send + Sync {
    fn instantiate(&self, ctx: &OperatorContext<'_>, outputs: Vec<AnyConsumer>) -> Result<AnyConsumer>;
}

/// Makes instances of a keyed operator, fed by channels, given the
/// consumers of its output ports.
pub(crate) trait KeyedFactory: Send + Sync {
    fn instantiate(&self, ctx: &OperatorContext<'_>, outputs: Vec<AnyConsumer>) -> Result<Box<dyn InputOperator>>;
}

/// Makes the router at the end of an upstream chain, given the outbox
/// slots of the channels to the keyed operator's instances (slot `i` goes
/// to instance `i`).
pub(crate) trait RouterFactory: Send + Sync {
    fn instantiate(&self, ctx: &OperatorContext<'_>, senders: Vec<usize>) -> Result<AnyConsumer>;
}

/// Makes the reader of one source partition (`ctx.instance`), given the
/// chain it feeds.
pub(crate) trait SourceFactory: Send + Sync {
    fn instantiate(&self, ctx: &OperatorContext<'_>, output: AnyConsumer) -> Result<Box<dyn SourceOperator>>;
}

impl<F> ChainFactory for F
where
    F: Fn(&OperatorContext<'_>, Vec<AnyConsumer>) -> Result<AnyConsumer> + Send + Sync,
{
    fn instantiate(&self, ctx: &OperatorContext<'_>, outputs: Vec<AnyConsumer>) -> Result<AnyConsumer> {
        self(ctx, outputs)
    }
}

impl<F> KeyedFactory for F
where
    F: Fn(&OperatorContext<'_>, Vec<AnyConsumer>) -> Result<Box<dyn InputOperator>> + Send + Sync,
{
    fn instantiate(&self, ctx: &OperatorContext<'_>, outputs: Vec<AnyConsumer>) -> Result<Box<dyn InputOperator>> {
        self(ctx, outputs)
    }
}

impl<F> RouterFactory for F
where
    F: Fn(&OperatorContext<'_>, Vec<usize>) -> Result<AnyConsumer> + Send + Sync,
{
    fn instantiate(&self, ctx: &OperatorContext<'_>, senders: Vec<usize>) -> Result<AnyConsumer> {
        self(ctx, senders)
    }
}

impl<F> SourceFactory for F
where
    F: Fn(&OperatorContext<'_>, AnyConsumer) -> Result<Box<dyn SourceOperator>> + Send + Sync,
{
    fn instantiate(&self, ctx: &OperatorContext<'_>, output: AnyConsumer) -> Result<Box<dyn SourceOperator>> {
        self(ctx, output)
    }
}

/// The one output of an operator instance.
pub(crate) fn one(mut outs: Vec<AnyConsumer>, what: &str) -> Result<AnyConsumer> {
    if outs.len() == 1 {
        outs.pop().ok_or_else(|| crate::error::internal_error!("{what}: no output"))
    } else {
        Err(crate::error::internal_error!("{what}: expected one output, got {}", outs.len()))
    }
}

/// The two outputs of an operator instance, in port order.
pub(crate) fn two(mut outs: Vec<AnyConsumer>, what: &str) -> Result<(AnyConsumer, AnyConsumer)> {
    match (outs.pop(), outs.pop(), outs.is_empty()) {
        (Some(second), Some(first), true) => Ok((first, second)),
        _ => Err(crate::error::internal_error!("{what}: expected two outputs")),
    }
}

/// A chain factory from a closure (the closure's signature is inferred).
pub(crate) fn chain_factory(
    f: impl Fn(&OperatorContext<'_>, Vec<AnyConsumer>) -> Result<AnyConsumer> + Send + Sync + 'static,
) -> std::sync::Arc<dyn ChainFactory> {
    std::sync::Arc::new(f)
}

/// A keyed factory from a closure.
pub(crate) fn keyed_factory(
    f: impl Fn(&OperatorContext<'_>, Vec<AnyConsumer>) -> Result<Box<dyn InputOperator>> + Send + Sync + 'static,
) -> std::sync::Arc<dyn KeyedFactory> {
    std::sync::Arc::new(f)
}

/// A router factory from a closure.
pub(crate) fn router_factory(
    f: impl Fn(&OperatorContext<'_>, Vec<usize>) -> Result<AnyConsumer> + Send + Sync + 'static,
) -> std::sync::Arc<dyn RouterFactory> {
    std::sync::Arc::new(f)
}

/// A source factory from a closure.
pub(crate) fn source_factory(
    f: impl Fn(&OperatorContext<'_>, AnyConsumer) -> Result<Box<dyn SourceOperator>> + Send + Sync + 'static,
) -> std::sync::Arc<dyn SourceFactory> {
    std::sync::Arc::new(f)
}
