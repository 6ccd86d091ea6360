//! Head tasks: what drives a node's chain. A source head reads batches from
//! a source partition; a channel head receives batches from its input edges
//! and feeds a keyed operator.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::checkpoint::{Ack, Restore, SourcePositionEntry, StateFile, StateFileEntry, StateFileWriter};
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::record::{Batch, END_OF_TIME, NO_TIMESTAMP, RecordBatch, Timestamp};
use crate::runtime::ops::OpInfo;
use crate::runtime::time::{InputTime, WatermarkTracker};
use crate::runtime::{Consumer, EdgeSender, Message, Outbox};
use crate::sources::{ReadStatus, SourceOutput, SourceReader};
use crate::state::Export;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a head task owns besides its chain: the queue of outgoing messages
/// and the edges they go to.
pub(crate) struct NodeIo {
    pub(crate) outbox: Outbox,
    pub(crate) senders: Vec<EdgeSender>,
    pub(crate) buffer_timeout: Duration,
    /// Set when the job takes checkpoints.
    pub(crate) checkpoint: Option<CheckpointIo>,
}

/// Operator `name` as the start of its state files' names: ASCII letters,
/// digits and `-` as they are, anything else `_`, and then, if anything
/// was replaced, a hash of the name, so that `a.b` and `a_b` do not share
/// files.
pub(crate) fn file_stem(name: &str) -> String {
    let safe: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    if safe == name {
        return safe;
    }
    // FNV-1a: stable across builds and platforms.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{safe}_{:08x}", hash as u32)
}

/// A task's part in checkpoints.
pub(crate) struct CheckpointIo {
    /// Source tasks: checkpoint numbers to inject barriers for.
    pub(crate) trigger: Option<mpsc::UnboundedReceiver<u64>>,
    pub(crate) acks: mpsc::UnboundedSender<Ack>,
    pub(crate) storage: std::sync::Arc<dyn crate::checkpoint::CheckpointStorage>,
    /// This run's token, in the names of its state files.
    pub(crate) run: std::sync::Arc<str>,
    pub(crate) task: String,
    pub(crate) operator: String,
    pub(crate) instance: usize,
    /// Keyed tasks: the key groups they own.
    pub(crate) groups: std::ops::Range<u16>,
    /// The number of the last complete checkpoint.
    pub(crate) completed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl CheckpointIo {
    /// Writes the exported state of checkpoint `n` in the background, then
    /// acknowledges (a failure is acknowledged as such).
    fn write_and_ack(&self, n: u64, snapshots: Vec<StateSnapshot>) {
        // State files live in `shared/`: a delta's chain reaches back into
        // earlier checkpoints, so files outlive their checkpoint's directory.
        let (storage, run) = (self.storage.clone(), self.run.clone());
        let (acks, operator, instance, groups) =
            (self.acks.clone(), self.operator.clone(), self.instance, self.groups.clone());
        let task = self.task.clone();
        tokio::task::spawn_blocking(move || {
            let result = (|| -> Result<Vec<StateFileEntry>> {
                let safe = file_stem(&operator);
                let mut files = Vec::new();
                for snap in snapshots {
                    let file = format!("{safe}-{instance}-{}-{n:020}-{run}.state", snap.state);
                    let meta = StateFile {
                        operator: operator.clone(),
                        state: snap.state.to_string(),
                        codec: snap.codec,
                        groups: Vec::new(),
                        removed: Vec::new(),
                    };
                    // A frame per part of the export: the state is never
                    // all in memory, encoded or not.
                    let name = format!("{}/{file}", crate::checkpoint::SHARED);
                    let mut writer = StateFileWriter::create(&*storage, &name, &meta)?;
                    let base = (snap.entries)(&mut |part| writer.part(&part.part))?;
                    writer.finish()?;
                    files.push(StateFileEntry {
                        operator: operator.clone(),
                        state: snap.state.to_string(),
                        file: format!("../{}/{file}", crate::checkpoint::SHARED),
                        key_groups: (groups.start, groups.end),
                        checkpoint: n,
                        base,
                    });
                }
                Ok(files)
            })();
            let ack = match result {
                Ok(states) => Ack { checkpoint: n, sources: Vec::new(), states, failure: None, task, finished: None },
                Err(e) => Ack {
                    checkpoint: n,
                    sources: Vec::new(),
                    states: Vec::new(),
                    failure: Some(format!("{task}: {e}")),
                    task,
                    finished: None,
                },
            };
            let _ = acks.send(ack);
        });
    }
}

/// A runnable head task.
pub(crate) trait HeadRunner: Send {
    fn run(self: Box<Self>, io: NodeIo) -> BoxFuture<'static, Result<()>>;
}

/// Yield to the scheduler after this many batches of a source that never
/// waits (a generator feeding a fused sink), so it shares its worker thread.
const YIELD_EVERY: u32 = 64;

pub(crate) struct SourceHead<T> {
    pub(crate) info: OpInfo,
    pub(crate) reader: Box<dyn SourceReader<T>>,
    pub(crate) chain: Box<dyn Consumer<T>>,
    pub(crate) output: SourceOutput<T>,
}

impl<T: Send + 'static> HeadRunner for SourceHead<T> {
    fn run(mut self: Box<Self>, io: NodeIo) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            let mut last_flush = Instant::now();
            let mut since_yield = 0u32;
            let mut forwarded = crate::record::NO_TIMESTAMP;
            let mut io = io;
            let mut last_barrier = 0;
            loop {
                if let Some(cp) = io.checkpoint.as_mut()
                    && let Some(trigger) = cp.trigger.as_mut()
                {
                    while let Ok(n) = trigger.try_recv() {
                        // Everything read so far is in the chain: the barrier
                        // follows it, and the position is where reading resumes.
                        let ack = self.position_ack(n, &cp.task, None);
                        self.chain.barrier(n)?;
                        io.outbox.drain(&io.senders).await?;
                        last_barrier = n;
                        let _ = cp.acks.send(ack);
                    }
                }
                self.output.deadline = last_flush + io.buffer_timeout;
                let status = self.reader.read(&mut self.output).await?;
                let n = self.output.batch.len();
                if n > 0 {
                    OperatorCounters::add(&self.info.counters.records_out, n);
                    self.chain.push(&mut self.output.batch)?;
                    self.output.batch.clear();
                }
                if self.output.watermark > forwarded {
                    forwarded = self.output.watermark;
                    self.chain.watermark(forwarded)?;
                }
                if status != ReadStatus::More || last_flush.elapsed() >= io.buffer_timeout {
                    self.chain.flush()?;
                    last_flush = Instant::now();
                }
                io.outbox.drain(&io.senders).await?;
                if status == ReadStatus::Done {
                    self.chain.finish()?;
                    io.outbox.drain(&io.senders).await?;
                    // Later checkpoints go on without this source, at its
                    // final position.
                    if let Some(cp) = io.checkpoint.as_ref() {
                        let _ = cp.acks.send(self.position_ack(0, &cp.task, Some(last_barrier)));
                    }
                    return Ok(());
                }
                since_yield += 1;
                if since_yield >= YIELD_EVERY {
                    since_yield = 0;
                    tokio::task::yield_now().await;
                }
            }
        })
    }
}

impl<T> SourceHead<T> {
    /// This source's part in checkpoint `n`: where reading resumes.
    fn position_ack(&self, n: u64, task: &str, finished: Option<u64>) -> Ack {
        let mut ack = Ack {
            checkpoint: n,
            sources: Vec::new(),
            states: Vec::new(),
            failure: None,
            task: task.to_string(),
            finished,
        };
        match self.reader.position() {
            Some(position) => ack.sources.push(SourcePositionEntry {
                source: self.info.name.to_string(),
                partition: self.output.partition,
                position,
            }),
            None => {
                ack.failure = Some(format!(
                    "source `{}` partition {} cannot report its position, so it cannot resume from a checkpoint",
                    self.info.name, self.output.partition
                ));
            }
        }
        ack
    }
}

/// A keyed operator instance fed by channels.
pub(crate) trait InputOperator: Send {
    /// Processes a batch from one input. Before each record the operator
    /// observes the watermark it was read under (`time.observe`), firing
    /// what became due, and stamps its outputs with `time.current()`.
    fn on_batch(&mut self, batch: &RecordBatch, time: &mut InputTime<'_>) -> Result<()>;
    /// The operator's watermark advanced to `wm` (from a watermark or idle
    /// message, or at the end of a batch): fire what is due and forward it.
    fn on_watermark(&mut self, wm: Timestamp) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    fn finish(&mut self) -> Result<()>;
    /// Exports the operator's keyed state for a checkpoint.
    fn snapshot(&mut self, at: Barrier) -> Result<Vec<StateSnapshot>> {
        let _ = at;
        Ok(Vec::new())
    }
    /// Loads the operator's keyed state of key groups `groups` from a checkpoint.
    fn restore(&mut self, from: &Restore, groups: &std::ops::Range<u16>) -> Result<()> {
        let _ = (from, groups);
        Ok(())
    }
    /// Barrier `n` passed the operator: forward it.
    fn barrier(&mut self, n: u64) -> Result<()>;
}

/// The checkpoint a barrier belongs to, and the last complete one (whose
/// state an incremental export builds on).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Barrier {
    pub(crate) n: u64,
    pub(crate) since: u64,
}

/// One state of an operator, exported for a checkpoint.
pub(crate) struct StateSnapshot {
    pub(crate) state: &'static str,
    pub(crate) codec: String,
    /// Encodes the state as of the barrier; called on a blocking thread.
    pub(crate) entries: Export,
}

/// One input edge of a channel head.
pub(crate) struct Inbox {
    pub(crate) from: String,
    pub(crate) rx: mpsc::Receiver<Message>,
}

pub(crate) struct ChannelHead {
    pub(crate) name: String,
    pub(crate) counters: std::sync::Arc<crate::metrics::OperatorCounters>,
    pub(crate) op: Box<dyn InputOperator>,
    pub(crate) inputs: Vec<Inbox>,
}

enum Next {
    Message(usize, Option<Message>),
    Timeout,
}

impl HeadRunner for ChannelHead {
    fn run(mut self: Box<Self>, io: NodeIo) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            let n = self.inputs.len();
            let mut open = vec![true; n];
            let mut tracker = WatermarkTracker::new(n);
            let mut forwarded = NO_TIMESTAMP;
            let mut remaining = n;
            let mut start = 0usize;
            let mut last_flush = Instant::now();
            // Checkpoint alignment: the barrier being aligned, and which
            // inputs delivered it (they are not read until all have).
            let mut aligning: Option<u64> = None;
            let mut blocked = vec![false; n];
            let mut last_barrier = 0;
            while remaining > 0 {
                let deadline = tokio::time::Instant::from_std(last_flush + io.buffer_timeout);
                let inputs = &mut self.inputs;
                let receive = std::future::poll_fn(|cx| {
                    for k in 0..n {
                        let i = (start + k) % n;
                        if !open.get(i).copied().unwrap_or(false) || blocked.get(i).copied().unwrap_or(false) {
                            continue;
                        }
                        if let Some(inbox) = inputs.get_mut(i)
                            && let Poll::Ready(msg) = inbox.rx.poll_recv(cx)
                        {
                            start = i + 1;
                            return Poll::Ready(Next::Message(i, msg));
                        }
                    }
                    Poll::Pending
                });
                // With a zero buffer timeout every step flushes, so there is
                // nothing to wake up for: just wait for input.
                let next = if io.buffer_timeout.is_zero() {
                    receive.await
                } else {
                    tokio::select! {
                        biased;
                        next = receive => next,
                        () = tokio::time::sleep_until(deadline) => Next::Timeout,
                    }
                };
                match next {
                    Next::Timeout => {}
                    Next::Message(i, None) => {
                        let from = self.inputs.get(i).map(|b| b.from.clone()).unwrap_or_default();
                        return Err(Error::Disconnected { edge: format!("{from} -> {}", self.name) });
                    }
                    Next::Message(i, Some(Message::Data(batch))) => {
                        tracker.activate(i);
                        self.op.on_batch(&batch, &mut InputTime { tracker: &mut tracker, input: i })?;
                        batch.recycle();
                    }
                    Next::Message(i, Some(Message::Watermark(wm))) => {
                        let _ = tracker.advance(i, wm);
                    }
                    Next::Message(i, Some(Message::Idle)) => {
                        let _ = tracker.idle(i);
                    }
                    Next::Message(i, Some(Message::EndOfInput)) => {
                        if let Some(o) = open.get_mut(i) {
                            *o = false;
                        }
                        let _ = tracker.advance(i, END_OF_TIME);
                        remaining -= 1;
                    }
                    Next::Message(i, Some(Message::Barrier(b))) => {
                        aligning = Some(b);
                        if let Some(x) = blocked.get_mut(i) {
                            *x = true;
                        }
                    }
                }
                if let Some(b) = aligning
                    && open.iter().zip(&blocked).all(|(o, x)| !*o || *x)
                {
                    // Every input has delivered barrier `b`: snapshot, pass
                    // the barrier on, read everything again.
                    let paused = Instant::now();
                    let since =
                        io.checkpoint.as_ref().map_or(0, |c| c.completed.load(std::sync::atomic::Ordering::Relaxed));
                    let snapshots = self.op.snapshot(Barrier { n: b, since })?;
                    self.op.barrier(b)?;
                    let nanos = u64::try_from(paused.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    self.counters.checkpoint_pause_nanos.fetch_max(nanos, std::sync::atomic::Ordering::Relaxed);
                    if let Some(cp) = io.checkpoint.as_ref() {
                        cp.write_and_ack(b, snapshots);
                    }
                    last_barrier = b;
                    aligning = None;
                    blocked.iter_mut().for_each(|x| *x = false);
                }
                if tracker.current() > forwarded {
                    forwarded = tracker.current();
                    self.op.on_watermark(forwarded)?;
                }
                if last_flush.elapsed() >= io.buffer_timeout {
                    self.op.flush()?;
                    last_flush = Instant::now();
                }
                io.outbox.drain(&io.senders).await?;
            }
            if forwarded < END_OF_TIME {
                self.op.on_watermark(END_OF_TIME)?;
            }
            self.op.finish()?;
            io.outbox.drain(&io.senders).await?;
            // Every input has ended and everything is passed on: later
            // checkpoints go on without this task.
            if let Some(cp) = io.checkpoint.as_ref() {
                let _ = cp.acks.send(Ack {
                    checkpoint: 0,
                    sources: Vec::new(),
                    states: Vec::new(),
                    failure: None,
                    task: cp.task.clone(),
                    finished: Some(last_barrier),
                });
            }
            Ok(())
        })
    }
}

/// Pushes a typed batch into a chain and counts it as the operator's output.
pub(crate) fn emit<T>(info: &OpInfo, chain: &mut dyn Consumer<T>, batch: &mut Batch<T>) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    OperatorCounters::add(&info.counters.records_out, batch.len());
    chain.push(batch)
}

#[cfg(test)]
mod tests {
    use super::file_stem;

    #[test]
    fn operator_names_that_differ_give_state_files_that_differ() {
        assert_eq!(file_stem("sums"), "sums");
        assert_eq!(file_stem("per-user"), "per-user");
        assert!(file_stem("a.b").starts_with("a_b_"));
        assert_ne!(file_stem("a.b"), file_stem("a_b"));
        assert_ne!(file_stem("a.b"), file_stem("a b"));
        assert_eq!(file_stem("a.b"), file_stem("a.b"), "stable");
    }
}
