//! The physical runtime: tokio tasks connected by bounded channels of
//! batches.
//!
//! A *node* is a head (a source partition, or a keyed operator instance fed
//! by channels) followed by a fused chain of typed consumers (stateless
//! operators, sinks, and routers that encode records onto outgoing edges).
//! The chain is synchronous: it never awaits. Routers put full batches into
//! the node's [`Outbox`]; the head task sends them after each step, and the
//! time it spends waiting on a full channel is that edge's backpressure.

pub(crate) mod heads;

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::metrics::{EdgeCounters, OperatorCounters};
use crate::record::{Batch, RecordBatch, Timestamp};

/// What travels on an edge.
#[derive(Debug)]
pub(crate) enum Message {
    /// A batch of encoded records.
    Data(RecordBatch),
    /// No record with a smaller timestamp will follow on this edge.
    Watermark(Timestamp),
    /// The sender's input is idle: until it sends again, it must not hold
    /// the receiver's watermark back.
    Idle,
    /// Checkpoint barrier `n`: everything before it belongs to checkpoint `n`.
    Barrier(u64),
    /// The sender has finished: nothing follows.
    EndOfInput,
}

/// One sending end of an edge, with the edge's counters.
#[derive(Debug)]
pub(crate) struct EdgeSender {
    pub(crate) tx: mpsc::Sender<Message>,
    pub(crate) counters: Arc<EdgeCounters>,
    pub(crate) to: String,
}

impl EdgeSender {
    /// Sends `msg`, recording the time spent blocked when the edge is full.
    pub(crate) async fn send(&self, msg: Message) -> Result<()> {
        if let Message::Data(batch) = &msg {
            OperatorCounters::add(&self.counters.records, batch.len());
            OperatorCounters::add(&self.counters.batches, 1);
        }
        let msg = match self.tx.try_send(msg) {
            Ok(()) => return Ok(()),
            Err(mpsc::error::TrySendError::Full(msg)) => msg,
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(self.closed()),
        };
        let started = Instant::now();
        let sent = self.tx.send(msg).await;
        let blocked = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.counters.blocked_nanos.fetch_add(blocked, std::sync::atomic::Ordering::Relaxed);
        sent.map_err(|_| self.closed())
    }

    fn closed(&self) -> Error {
        Error::Disconnected { edge: self.to.clone() }
    }
}

/// Messages a node's chain produced and its head must send, in order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outbox(Arc<Mutex<Vec<(usize, Message)>>>);

impl Outbox {
    #[inline]
    pub(crate) fn push(&self, sender: usize, msg: Message) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push((sender, msg));
    }

    fn take(&self) -> Vec<(usize, Message)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Sends everything queued, in order.
    pub(crate) async fn drain(&self, senders: &[EdgeSender]) -> Result<()> {
        loop {
            let items = self.take();
            if items.is_empty() {
                return Ok(());
            }
            for (i, msg) in items {
                let sender = senders
                    .get(i)
                    .ok_or_else(|| Error::Internal(format!("outbox names sender {i} of {}", senders.len())))?;
                sender.send(msg).await?;
            }
        }
    }
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
    fn barrier(&mut self, n: u64) -> Result<()>;
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
        Error::Internal(format!("{what}: downstream consumer does not take `{}`", std::any::type_name::<T>()))
    })
}

/// Runs `f`, which blocks its thread (a broker round trip, an fsync), from
/// inside a task: on a multi-threaded tokio runtime the worker hands its
/// other tasks to another worker first, so that timers and the rest of
/// the job keep running while `f` waits; elsewhere `f` just runs.
///
/// Sinks and sources call it around calls that can wait for seconds.
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}
