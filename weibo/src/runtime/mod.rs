//! The physical runtime: tokio tasks connected by bounded channels of
//! batches.
//!
//! A *node* is a head (a source partition, or a keyed operator instance fed
//! by channels) followed by a fused chain of typed consumers (stateless
//! operators, sinks, and routers that encode records onto outgoing edges).
//! The chain is synchronous: it never awaits. Routers put full batches into
//! the node's [`Outbox`]; the head task sends them after each step, and the
//! time it spends waiting on a full channel is that edge's backpressure.

pub(crate) mod build;
pub(crate) mod config;
#[cfg(test)]
mod descriptor_tests;
pub(crate) mod heads;
pub(crate) mod launch;
mod matching;
pub(crate) mod status;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::metrics::{EdgeCounters, OperatorCounters};
use crate::operator::Outbox;
use crate::record::Message;

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

/// Sends everything `outbox` holds, in order, on `senders`.
pub(crate) async fn drain(outbox: &Outbox, senders: &[EdgeSender]) -> Result<()> {
    loop {
        let items = outbox.take();
        if items.is_empty() {
            return Ok(());
        }
        for (i, msg) in items {
            let sender = senders
                .get(i)
                .ok_or_else(|| crate::error::internal_error!("outbox names sender {i} of {}", senders.len()))?;
            sender.send(msg).await?;
        }
    }
}
