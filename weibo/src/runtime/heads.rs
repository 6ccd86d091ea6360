//! Head tasks: what drives a node's chain. A source head reads batches from
//! a source partition; a channel head receives batches from its input edges
//! and feeds a keyed operator.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::checkpoint::{Ack, Restore, SourcePositionEntry, StateFile, StateFileEntry, StateFileWriter, TaskEvent};
use crate::error::{Error, Result};
use crate::metrics::OperatorCounters;
use crate::record::{Batch, END_OF_TIME, NO_TIMESTAMP, RecordBatch, Timestamp};
use crate::operator::OpInfo;
use crate::time::watermarks::{InputTime, WatermarkTracker};
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
    /// The task's operators, head first (for warnings).
    pub(crate) chain: std::sync::Arc<str>,
}

impl NodeIo {
    /// How long one batch or poll may hold the task before it counts as
    /// blocking: ten buffer timeouts, at least 100 ms.
    fn stall_limit(&self) -> Duration {
        (self.buffer_timeout * 10).max(Duration::from_millis(100))
    }
}

/// Watches how long a task's synchronous steps (a batch through its chain,
/// a poll of its source) hold the thread, and warns, at most every ten
/// seconds per task, when one holds it far longer than the buffer timeout:
/// blocking code in an operator (a `std::thread::sleep`, a synchronous
/// HTTP call) stalls the task, its checkpoints and the tasks sharing its
/// thread, without failing anything.
pub(crate) struct StallWatch {
    limit: Duration,
    worst: Duration,
    count: u64,
    warned: Option<Instant>,
}

impl StallWatch {
    pub(crate) fn new(limit: Duration) -> Self {
        Self { limit, worst: Duration::ZERO, count: 0, warned: None }
    }

    /// A step that took `took`, in `what` of `task`.
    pub(crate) fn observe(&mut self, took: Duration, task: &str, chain: &str, what: &str) {
        if took <= self.limit {
            return;
        }
        self.count += 1;
        self.worst = self.worst.max(took);
        if self.warned.is_some_and(|w| w.elapsed() < Duration::from_secs(10)) {
            return;
        }
        tracing::warn!(
            task,
            operators = chain,
            worst = ?self.worst,
            times = self.count,
            limit = ?self.limit,
            "{what} held the task far longer than the buffer timeout: blocking code in one of these operators? \
             It stalls the task and its checkpoints; call it through `weibo::blocking` so that it does not \
             stall the tasks sharing its thread too"
        );
        self.warned = Some(Instant::now());
        self.worst = Duration::ZERO;
        self.count = 0;
    }
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
    pub(crate) acks: mpsc::UnboundedSender<TaskEvent>,
    /// The checkpoint interval (alignment longer than it is warned of).
    pub(crate) interval: Duration,
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
                Ok(states) => Ack { checkpoint: n, sources: Vec::new(), states, failure: None, task },
                Err(e) => Ack {
                    checkpoint: n,
                    sources: Vec::new(),
                    states: Vec::new(),
                    failure: Some(format!("{task}: {e}")),
                    task,
                },
            };
            let _ = acks.send(TaskEvent::Ack(ack));
        });
    }
}

/// A runnable head task.
pub(crate) trait HeadRunner: Send {
    fn run(self: Box<Self>, io: NodeIo) -> BoxFuture<'static, Result<()>>;
}

/// Yield to the scheduler after this many batches of a source that never
/// waits (a generator feeding a fused sink), or once a buffer timeout has
/// passed since it last did (slow operators in its chain), so it shares
/// its worker thread: the tasks downstream, and the barriers they align,
/// wait no longer than that for a turn.
const YIELD_EVERY: u32 = 64;

pub(crate) struct SourceHead<T> {
    pub(crate) info: OpInfo,
    /// The partition's name outside Weibo, if the source gives one.
    pub(crate) partition_name: Option<String>,
    pub(crate) reader: Box<dyn SourceReader<T>>,
    pub(crate) chain: Box<dyn Consumer<T>>,
    pub(crate) output: SourceOutput<T>,
}

impl<T: Send + 'static> HeadRunner for SourceHead<T> {
    fn run(mut self: Box<Self>, io: NodeIo) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            let mut last_flush = Instant::now();
            let mut since_yield = 0u32;
            let mut last_yield = Instant::now();
            let mut forwarded = crate::record::NO_TIMESTAMP;
            let mut io = io;
            let mut stalls = StallWatch::new(io.stall_limit());
            let task = io.checkpoint.as_ref().map_or_else(|| self.info.name.to_string(), |c| c.task.clone());
            let mut trigger = io.checkpoint.as_mut().and_then(|c| c.trigger.take());
            loop {
                if let Some(trigger) = trigger.as_mut() {
                    while let Ok(n) = trigger.try_recv() {
                        self.pass_barrier(n, &io).await?;
                    }
                }
                self.output.deadline = last_flush + io.buffer_timeout;
                // Three clock reads a step: the poll's start, its end (the
                // batch's start) and the batch's end, which the flush and
                // yield checks reuse.
                let mut polled = Instant::now();
                let status = {
                    let mut read = self.reader.read(&mut self.output);
                    let mut worst = Duration::ZERO;
                    let mut first = true;
                    let status = std::future::poll_fn(|cx| {
                        let started = if std::mem::take(&mut first) { polled } else { Instant::now() };
                        let r = read.as_mut().poll(cx);
                        polled = Instant::now();
                        worst = worst.max(polled.saturating_duration_since(started));
                        r
                    })
                    .await?;
                    stalls.observe(worst, &task, &io.chain, "a poll of the source");
                    status
                };
                let n = self.output.batch.len();
                let mut now = polled;
                if n > 0 {
                    OperatorCounters::add(&self.info.counters.records_out, n);
                    self.chain.push(&mut self.output.batch)?;
                    self.output.batch.clear();
                    now = Instant::now();
                    stalls.observe(now.saturating_duration_since(polled), &task, &io.chain, "a batch");
                }
                if self.output.watermark > forwarded {
                    forwarded = self.output.watermark;
                    self.chain.watermark(forwarded)?;
                }
                if status != ReadStatus::More || now.saturating_duration_since(last_flush) >= io.buffer_timeout {
                    self.chain.flush()?;
                    last_flush = now;
                }
                io.outbox.drain(&io.senders).await?;
                if status == ReadStatus::Done {
                    self.chain.finish()?;
                    io.outbox.drain(&io.senders).await?;
                    break;
                }
                since_yield += 1;
                if since_yield >= YIELD_EVERY || now.saturating_duration_since(last_yield) >= io.buffer_timeout {
                    since_yield = 0;
                    last_yield = now;
                    tokio::task::yield_now().await;
                }
            }
            // At the end of the input. With checkpoints, the source stays
            // to pass the barriers of later checkpoints at its final
            // position, up to the final checkpoint; the coordinator lets
            // it go (drops its trigger) once that is complete.
            let Some(cp) = io.checkpoint.as_ref() else { return Ok(()) };
            let _ = cp.acks.send(TaskEvent::SourceEnded { task: cp.task.clone() });
            let Some(mut trigger) = trigger else { return Ok(()) };
            while let Some(n) = trigger.recv().await {
                self.pass_barrier(n, &io).await?;
            }
            Ok(())
        })
    }
}

impl<T> SourceHead<T> {
    /// Checkpoint `n`: everything read so far is in the chain; the barrier
    /// follows it, and the position is where reading resumes.
    async fn pass_barrier(&mut self, n: u64, io: &NodeIo) -> Result<()> {
        let Some(cp) = io.checkpoint.as_ref() else { return Ok(()) };
        let ack = self.position_ack(n, &cp.task);
        self.chain.barrier(n)?;
        io.outbox.drain(&io.senders).await?;
        let _ = cp.acks.send(TaskEvent::Ack(ack));
        Ok(())
    }

    /// This source's part in checkpoint `n`: where reading resumes.
    fn position_ack(&self, n: u64, task: &str) -> Ack {
        let mut ack =
            Ack { checkpoint: n, sources: Vec::new(), states: Vec::new(), failure: None, task: task.to_string() };
        match self.reader.position() {
            Some(position) => ack.sources.push(SourcePositionEntry {
                source: self.info.name.to_string(),
                partition: self.output.partition,
                position,
                partition_name: self.partition_name.clone(),
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
            // An input has `ended` once it delivered `EndOfInput` (no data
            // follows, only barriers), and is closed once its sender is
            // gone after that. The operator finishes when every input has
            // ended, and the task ends when every input is closed: with
            // checkpoints, after the final checkpoint's barrier.
            let mut ended = vec![false; n];
            let mut open = vec![true; n];
            let mut finished = false;
            let mut tracker = WatermarkTracker::new(n);
            let mut forwarded = NO_TIMESTAMP;
            let mut start = 0usize;
            let mut last_flush = Instant::now();
            let mut stalls = StallWatch::new(io.stall_limit());
            // Checkpoint alignment (see `Aligner`).
            let mut aligner = Aligner::new(n);
            // Slow alignments are warned of at most every ten seconds.
            let mut align_warned: Option<(Instant, u64)> = None;
            while open.iter().any(|o| *o) {
                let deadline = tokio::time::Instant::from_std(last_flush + io.buffer_timeout);
                let inputs = &mut self.inputs;
                let (open_now, aligning) = (&open, &aligner);
                let receive = std::future::poll_fn(|cx| {
                    for k in 0..n {
                        let i = (start + k) % n;
                        if !open_now.get(i).copied().unwrap_or(false) || aligning.holds(i) {
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
                // nothing to wake up for: just wait for input. Once finished,
                // nothing is buffered either.
                let next = if io.buffer_timeout.is_zero() || finished {
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
                        if !ended.get(i).copied().unwrap_or(false) {
                            let from = self.inputs.get(i).map(|b| b.from.clone()).unwrap_or_default();
                            return Err(Error::Disconnected { edge: format!("{from} -> {}", self.name) });
                        }
                        if let Some(o) = open.get_mut(i) {
                            *o = false;
                        }
                        aligner.closed(i);
                    }
                    Next::Message(i, Some(Message::Data(batch))) => {
                        if ended.get(i).copied().unwrap_or(false) {
                            let from = self.inputs.get(i).map(|b| b.from.clone()).unwrap_or_default();
                            return Err(Error::Internal(format!(
                                "`{from} -> {}` sent records after the end of its input",
                                self.name
                            )));
                        }
                        tracker.activate(i);
                        let started = Instant::now();
                        self.op.on_batch(&batch, &mut InputTime { tracker: &mut tracker, input: i })?;
                        stalls.observe(started.elapsed(), &self.name, &io.chain, "a batch");
                        batch.recycle();
                    }
                    Next::Message(i, Some(Message::Watermark(wm))) => {
                        let _ = tracker.advance(i, wm);
                    }
                    Next::Message(i, Some(Message::Idle)) => {
                        let _ = tracker.idle(i);
                    }
                    Next::Message(i, Some(Message::EndOfInput)) => {
                        if let Some(e) = ended.get_mut(i) {
                            *e = true;
                        }
                        let _ = tracker.advance(i, END_OF_TIME);
                    }
                    Next::Message(i, Some(Message::Barrier(b))) => {
                        aligner.barrier(i, b).map_err(|m| Error::Internal(format!("`{}`: {m}", self.name)))?;
                    }
                }
                if let Some(b) = aligner.aligned() {
                    // Every input has delivered barrier `b`: snapshot, pass
                    // the barrier on, read everything again.
                    if let Some(cp) = io.checkpoint.as_ref()
                        && let Some(took) = aligner.took()
                        && took > cp.interval
                    {
                        match align_warned {
                            Some((at, ref mut since)) if at.elapsed() < Duration::from_secs(10) => *since += 1,
                            _ => {
                                let before = align_warned.map_or(0, |(_, n)| n);
                                tracing::warn!(task = %self.name, checkpoint = b, ?took, interval = ?cp.interval, slow_before = before, "aligning the checkpoint's barrier took longer than the checkpoint interval: an input was slow to deliver it (backpressure, or blocking code upstream)");
                                align_warned = Some((Instant::now(), 0));
                            }
                        }
                    }
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
                    aligner.release();
                }
                if tracker.current() > forwarded {
                    forwarded = tracker.current();
                    self.op.on_watermark(forwarded)?;
                }
                if !finished && ended.iter().all(|e| *e) {
                    // Every input has ended: fire what is left, flush, and
                    // tell everything downstream; barriers may still come.
                    if forwarded < END_OF_TIME {
                        forwarded = END_OF_TIME;
                        self.op.on_watermark(END_OF_TIME)?;
                    }
                    self.op.finish()?;
                    finished = true;
                } else if !finished && last_flush.elapsed() >= io.buffer_timeout {
                    self.op.flush()?;
                    last_flush = Instant::now();
                }
                io.outbox.drain(&io.senders).await?;
            }
            Ok(())
        })
    }
}

/// Barrier alignment of a task with several inputs: an input that
/// delivered barrier `n` is held (not read) until every input that is
/// still open has delivered it too; then the task snapshots and passes
/// `n` on, and every input is read again. An input closes only after its
/// sender has passed every barrier (sources stay until the final
/// checkpoint), so a closed input counts as having delivered it.
#[derive(Clone, Debug)]
pub(crate) struct Aligner {
    /// The barrier being aligned, and when its first input delivered it.
    aligning: Option<(u64, Instant)>,
    held: Vec<bool>,
    closed: Vec<bool>,
}

impl Aligner {
    pub(crate) fn new(inputs: usize) -> Self {
        Self { aligning: None, held: vec![false; inputs], closed: vec![false; inputs] }
    }

    /// Whether input `i` is held: it delivered the barrier being aligned.
    pub(crate) fn holds(&self, i: usize) -> bool {
        self.held.get(i).copied().unwrap_or(false)
    }

    /// Input `i` delivered barrier `n`.
    ///
    /// # Errors
    /// A description of the protocol violation: a held input delivering
    /// again, or a barrier other than the one being aligned.
    pub(crate) fn barrier(&mut self, i: usize, n: u64) -> std::result::Result<(), String> {
        match self.aligning {
            Some((b, _)) if b != n => {
                return Err(format!("input {i} delivered barrier {n} while barrier {b} was being aligned"));
            }
            Some(_) if self.holds(i) => return Err(format!("input {i} delivered barrier {n} twice")),
            Some(_) => {}
            None => self.aligning = Some((n, Instant::now())),
        }
        if let Some(h) = self.held.get_mut(i) {
            *h = true;
        }
        Ok(())
    }

    /// Input `i` closed.
    pub(crate) fn closed(&mut self, i: usize) {
        if let Some(c) = self.closed.get_mut(i) {
            *c = true;
        }
    }

    /// The barrier every open input has delivered, if one has.
    pub(crate) fn aligned(&self) -> Option<u64> {
        let (b, _) = self.aligning?;
        self.held.iter().zip(&self.closed).all(|(h, c)| *h || *c).then_some(b)
    }

    /// How long the barrier being aligned has been aligning (since its
    /// first input delivered it).
    pub(crate) fn took(&self) -> Option<Duration> {
        self.aligning.map(|(_, t)| t.elapsed())
    }

    /// The aligned barrier was passed on: read every input again.
    pub(crate) fn release(&mut self) {
        self.aligning = None;
        self.held.iter_mut().for_each(|h| *h = false);
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
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::{Aligner, file_stem};

    /// Every interleaving of barriers `1..=2` and data over up to three
    /// inputs (each input delivering its data, barrier 1, data, barrier 2,
    /// then maybe closing): an input that delivered barrier `n` is never
    /// read before every open input has delivered `n`, every barrier is
    /// aligned exactly once, in order, and only after all inputs
    /// delivered it or closed.
    #[test]
    fn alignment_never_reads_past_a_barrier_in_any_interleaving() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Step {
            Data,
            Barrier(u64),
            Close,
        }
        // Walks every interleaving by depth-first search over which
        // readable (not held) input goes next, as the channel head reads.
        fn walk(scripts: &[Vec<Step>], pos: &mut [usize], aligner: &Aligner, passed: &mut Vec<u64>, leaves: &mut u64) {
            if let Some(b) = aligner.aligned() {
                for (i, s) in scripts.iter().enumerate() {
                    let read = &s[..pos[i]];
                    assert!(
                        read.contains(&Step::Barrier(b)) || read.contains(&Step::Close),
                        "barrier {b} aligned before input {i} delivered it"
                    );
                }
                passed.push(b);
                assert_eq!(*passed, (1..=b).collect::<Vec<_>>(), "barriers pass once each, in order");
                let mut next = aligner.clone();
                next.release();
                walk(scripts, pos, &next, passed, leaves);
                passed.pop();
                return;
            }
            let mut moved = false;
            for i in 0..scripts.len() {
                if aligner.holds(i) || pos[i] >= scripts[i].len() {
                    continue;
                }
                moved = true;
                let mut next = aligner.clone();
                match scripts[i][pos[i]] {
                    Step::Data => {}
                    // Fails if a held input was read: it would deliver
                    // barrier 2 while barrier 1 aligns.
                    Step::Barrier(b) => next.barrier(i, b).unwrap(),
                    Step::Close => next.closed(i),
                }
                pos[i] += 1;
                walk(scripts, pos, &next, passed, leaves);
                pos[i] -= 1;
            }
            if !moved {
                *leaves += 1;
                // Every barrier some input delivered was aligned.
                let mut want: Vec<u64> = scripts
                    .iter()
                    .flatten()
                    .filter_map(|s| if let Step::Barrier(b) = s { Some(*b) } else { None })
                    .collect();
                want.sort_unstable();
                want.dedup();
                assert_eq!(*passed, want, "{aligner:?} at {pos:?}");
            }
        }
        // An input closes after `close` of its steps (or never): before
        // barrier 1, between the barriers, or after both.
        fn script(close: Option<usize>) -> Vec<Step> {
            let mut s = vec![Step::Data, Step::Barrier(1), Step::Data, Step::Barrier(2)];
            if let Some(at) = close {
                s.truncate(at);
                s.push(Step::Close);
            }
            s
        }
        for inputs in 1..=3usize {
            let choices = [None, Some(1), Some(3), Some(4)];
            for combo in 0..choices.len().pow(inputs as u32) {
                let scripts: Vec<Vec<Step>> =
                    (0..inputs).map(|i| script(choices[combo / choices.len().pow(i as u32) % choices.len()])).collect();
                let mut pos = vec![0; inputs];
                let mut leaves = 0;
                walk(&scripts, &mut pos, &Aligner::new(inputs), &mut Vec::new(), &mut leaves);
                assert!(leaves > 0);
            }
        }
    }

    #[test]
    fn alignment_refuses_a_barrier_out_of_turn() {
        let mut a = Aligner::new(2);
        a.barrier(0, 5).unwrap();
        assert!(a.barrier(0, 5).is_err(), "twice on one input");
        assert!(a.barrier(1, 6).is_err(), "another barrier while 5 aligns");
        a.barrier(1, 5).unwrap();
        assert_eq!(a.aligned(), Some(5));
        a.release();
        assert_eq!(a.aligned(), None);
        a.closed(1);
        a.barrier(0, 6).unwrap();
        assert_eq!(a.aligned(), Some(6), "a closed input counts as delivered");
    }

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
