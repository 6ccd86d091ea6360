//! Operators: the erased interfaces the runtime drives ([`Consumer`] for
//! the typed, synchronous operators of a fused chain; [`InputOperator`] for
//! keyed operators fed by channels), what an instance knows about itself
//! ([`OpInfo`]), and one file per operator family: stateless operators,
//! keyed ones, windows (in their own folder), timestamps and watermarks,
//! sinks, and the router at a shuffle edge.

pub(crate) mod async_io;
pub(crate) mod broadcast;
pub(crate) mod connect;
pub(crate) mod exchange;
pub(crate) mod factory;
pub(crate) mod function;
pub(crate) mod join;
pub(crate) mod keyed;
pub(crate) mod outputs;
pub(crate) mod policy;
pub(crate) mod sink;
pub(crate) mod source;
pub(crate) mod stateless;
pub(crate) mod temporal;
pub(crate) mod watermarks;
pub(crate) mod windows;

pub(crate) use self::exchange::key_group_range;

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};

use crate::codec::Data;
use crate::error::Result;
use crate::metrics::OperatorCounters;
use crate::record::CheckpointId;
use crate::record::{Batch, Message, RecordBatch, SourceNames, Timestamp};
use crate::state::{Barrier, KeyedState, RestoreSource, StateSnapshot, StateType};
use crate::time::watermarks::InputTime;

/// Forwards watermark (and idleness), flush and finish to `self.next`, and
/// to the dead-letter output when given `failures`. `consumer` generates the
/// [`Consumer`] methods, `keyed` those of a keyed `InputOperator` (whose
/// watermark comes from its channel head).
macro_rules! forward_control {
    (consumer) => {
        fn watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.next.watermark(wm)
        }
        fn idle(&mut self) -> Result<()> {
            self.next.idle()
        }
        fn barrier(&mut self, n: CheckpointId) -> Result<()> {
            self.next.barrier(n)
        }
        forward_control!(@flush);
    };
    (consumer, failures) => {
        fn watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.next.watermark(wm)?;
            self.failures.watermark(wm)
        }
        fn idle(&mut self) -> Result<()> {
            self.next.idle()?;
            self.failures.idle()
        }
        fn barrier(&mut self, n: CheckpointId) -> Result<()> {
            self.next.barrier(n)?;
            self.failures.barrier(n)
        }
        forward_control!(@flush, failures);
    };
    (keyed) => {
        fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.next.watermark(wm)
        }
        fn barrier(&mut self, n: CheckpointId) -> Result<()> {
            self.next.barrier(n)
        }
        forward_control!(@flush);
    };
    (keyed, failures) => {
        fn on_watermark(&mut self, wm: Timestamp) -> Result<()> {
            self.next.watermark(wm)?;
            self.failures.watermark(wm)
        }
        fn barrier(&mut self, n: CheckpointId) -> Result<()> {
            self.next.barrier(n)?;
            self.failures.barrier(n)
        }
        forward_control!(@flush, failures);
    };
    (@flush) => {
        fn flush(&mut self) -> Result<()> {
            self.next.flush()
        }
        fn finish(&mut self) -> Result<()> {
            self.next.finish()
        }
    };
    (@flush, failures) => {
        fn flush(&mut self) -> Result<()> {
            self.next.flush()?;
            self.failures.flush()
        }
        fn finish(&mut self) -> Result<()> {
            self.next.finish()?;
            self.failures.finish()
        }
    };
}
pub(crate) use forward_control;

/// What every operator instance knows about itself.
#[derive(Clone, Debug)]
pub(crate) struct OpInfo {
    pub(crate) name: Arc<str>,
    /// The node's stable id (`Node::id`): what its state is filed under.
    pub(crate) id: Arc<str>,
    pub(crate) counters: Arc<OperatorCounters>,
    pub(crate) sources: SourceNames,
}

/// A typed, synchronous consumer of batches: a fused operator, a sink, or a
/// router onto an edge.
pub(crate) trait Consumer<T>: Send {
    /// Consumes every record of `batch`, leaving it empty.
    fn push(&mut self, batch: &mut Batch<T>) -> Result<()>;
    /// The input's watermark advanced to `wm`.
    fn watermark(&mut self, wm: Timestamp) -> Result<()>;
    /// The input went idle (it will not hold watermarks back downstream).
    fn idle(&mut self) -> Result<()>;
    /// Checkpoint barrier `n`: everything before it has been pushed; pass
    /// it on after anything buffered.
    fn barrier(&mut self, n: CheckpointId) -> Result<()>;
    /// Hands partial output batches on (the buffer timeout passed).
    fn flush(&mut self) -> Result<()>;
    /// End of input: flush, then tell everything downstream.
    fn finish(&mut self) -> Result<()>;
}

/// A `Box<dyn Consumer<T>>` with `T` erased, as the planner handles it.
pub(crate) type AnyConsumer = Box<dyn Any + Send>;

/// Erases a typed consumer.
pub(crate) fn erase<T: 'static>(c: Box<dyn Consumer<T>>) -> AnyConsumer {
    Box::new(c)
}

/// Recovers a typed consumer; a mismatch is a bug in the planner.
pub(crate) fn unerase<T: 'static>(c: AnyConsumer, what: &str) -> Result<Box<dyn Consumer<T>>> {
    c.downcast::<Box<dyn Consumer<T>>>().map(|b| *b).map_err(|_| {
        crate::error::internal_error!("{what}: downstream consumer does not take `{}`", std::any::type_name::<T>())
    })
}

/// Messages a node's chain produced and its head must send, in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outbox(Arc<Mutex<Vec<(usize, Message)>>>);

impl Outbox {
    #[inline]
    pub(crate) fn push(&self, sender: usize, msg: Message) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push((sender, msg));
    }

    /// Takes everything queued, in order.
    pub(crate) fn take(&self) -> Vec<(usize, Message)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A keyed operator instance fed by channels.
pub(crate) trait InputOperator: Send {
    /// Processes a batch from one input (taking its typed records, if it
    /// has them: see [`RecordBatch`]). Before each record the operator
    /// observes the watermark it was read under (`time.observe`), firing
    /// what became due, and stamps its outputs with `time.current()`.
    fn on_batch(&mut self, batch: &mut RecordBatch, time: &mut InputTime<'_>) -> Result<()>;
    /// The operator's watermark advanced to `wm` (from a watermark or idle
    /// message, or at the end of a batch): fire what is due and forward it.
    fn on_watermark(&mut self, wm: Timestamp) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    fn finish(&mut self) -> Result<()>;
    /// Snapshots the operator's keyed state for a checkpoint.
    fn snapshot(&mut self, at: SnapshotAt) -> Result<Vec<StateSnapshot>> {
        let _ = at;
        Ok(Vec::new())
    }
    /// Loads the operator's keyed state of key groups `groups` from a checkpoint.
    fn restore(&mut self, from: &dyn RestoreSource, groups: &std::ops::Range<u16>) -> Result<()> {
        let _ = (from, groups);
        Ok(())
    }
    /// Barrier `n` passed the operator: forward it.
    fn barrier(&mut self, n: CheckpointId) -> Result<()>;
    /// What each of its states holds now (for metrics; read about once a
    /// second).
    fn state_stats(&self) -> Vec<(crate::state::StateName, crate::state::StateStats)> {
        Vec::new()
    }
    /// For an operator with work outside its inputs (asynchronous calls in
    /// flight): polls it, registering `cx` to be woken when it can make
    /// progress; `Ready` once it did (it emitted, failed, or forwarded
    /// something). Polled by its task beside its inputs.
    fn poll_work(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<()>> {
        let _ = cx;
        std::task::Poll::Pending
    }
    /// Whether it takes input now: an operator whose calls in flight are
    /// at their bound says no, and its task reads no input (which
    /// backpressures upstream) until `poll_work` made room.
    fn accepts_input(&self) -> bool {
        true
    }
    /// Whether it has work outside its inputs: its task does not finish it
    /// (nor end) until it has none.
    fn has_work(&self) -> bool {
        false
    }
}

/// The checkpoint a barrier belongs to, and the last complete one (whose
/// state an incremental snapshot builds on).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SnapshotAt {
    pub(crate) n: CheckpointId,
    pub(crate) since: CheckpointId,
}

/// One keyed state's part of a checkpoint: `state` of `operator`, filed as
/// `name` with entries of type `ty`.
pub(crate) fn snapshot_state(
    state: &mut dyn KeyedState,
    operator: &str,
    name: impl Into<crate::state::StateName>,
    ty: StateType,
    at: SnapshotAt,
) -> Result<StateSnapshot> {
    let snapshot = state.snapshot_at(operator, Some(Barrier::new(at.n, at.since)))?;
    Ok(StateSnapshot { state: name.into(), ty, snapshot, expired_before: state.expired_before() })
}

/// Loads keyed state `name` of `operator` (entries of type `ty`) for key
/// groups `groups` from a checkpoint, a part at a time: a large state is
/// never all in memory.
pub(crate) fn restore_state(
    state: &mut dyn KeyedState,
    from: &dyn RestoreSource,
    operator: &str,
    name: &str,
    ty: &StateType,
    groups: &std::ops::Range<u16>,
) -> Result<()> {
    from.load_entries(operator, name, ty, groups, &mut |entries, removed, clock| {
        state.restoring(clock);
        state.import_part(operator, entries, removed)
    })
}

/// Pushes a typed batch into a chain and counts it as the operator's output.
pub(crate) fn emit<T>(info: &OpInfo, chain: &mut dyn Consumer<T>, batch: &mut Batch<T>) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    OperatorCounters::add(&info.counters.records_out, batch.len());
    chain.push(batch)
}

/// An aggregation with an accumulator: what [`KeyedStream::aggregate`](crate::KeyedStream::aggregate) (and
/// window aggregations) fold records into.
///
/// ```
/// use weibo::Aggregate;
/// // The largest and smallest value per key.
/// struct Range;
/// impl Aggregate<i32> for Range {
///     type Acc = Option<(i32, i32)>;
///     type Out = i32;
///     fn create(&self) -> Self::Acc { None }
///     fn add(&self, acc: &mut Self::Acc, v: i32) {
///         let (lo, hi) = acc.unwrap_or((v, v));
///         *acc = Some((lo.min(v), hi.max(v)));
///     }
///     fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
///         if let Some((lo, hi)) = other {
///             self.add(acc, lo);
///             self.add(acc, hi);
///         }
///     }
///     fn result(&self, acc: &Self::Acc) -> i32 { acc.map_or(0, |(lo, hi)| hi - lo) }
/// }
/// let out = weibo::testing::run(vec![3, 9, 4], |s| s.key_by(|_: &i32| 0u8).aggregate(Range))?;
/// assert_eq!(out.last(), Some(&(0, 6)));
/// # Ok::<(), weibo::Error>(())
/// ```
pub trait Aggregate<T>: Send + Sync + 'static {
    /// The accumulator, kept in state (so it needs a codec).
    type Acc: Data;
    /// What is emitted.
    type Out: Clone + Send + 'static;
    /// A new, empty accumulator.
    fn create(&self) -> Self::Acc;
    /// Adds one record.
    fn add(&self, acc: &mut Self::Acc, value: T);
    /// Merges another accumulator into `acc` (for merging windows).
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
    /// The result of an accumulator.
    fn result(&self, acc: &Self::Acc) -> Self::Out;
}

/// Turns a typed chain consumer back from the planner's erased form.
pub(crate) fn typed<T: 'static>(c: AnyConsumer, what: &str) -> Result<Box<dyn Consumer<T>>> {
    unerase::<T>(c, what)
}
