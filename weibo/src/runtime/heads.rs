//! Head tasks: what drives a node's chain. A source head reads batches from
//! a source partition; a channel head receives batches from its input edges
//! and feeds a keyed operator.

use crate::record::CheckpointId;
use crate::task::BoxFuture;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::checkpoint::aligner::Aligner;
use crate::checkpoint::{Ack, SourcePositionEntry, TaskEvent};
use crate::error::{Error, Result};
use crate::operator::source::SourceOperator;
use crate::operator::{InputOperator, Outbox, SnapshotAt};
use crate::record::Message;
use crate::record::{END_OF_TIME, NO_TIMESTAMP};
use crate::runtime::EdgeSender;
use crate::sources::ReadStatus;
use crate::state::StateSnapshot;
use crate::time::watermarks::{InputTime, WatermarkTracker};

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
    /// A source partition's place in its source's watermark alignment,
    /// when the job aligns and the source has more than one partition.
    pub(crate) alignment: Option<crate::time::alignment::Aligned>,
    /// What the task reports of its time (watermark, idle inputs).
    pub(crate) task: std::sync::Arc<crate::metrics::TaskCounters>,
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

/// A task's part in checkpoints.
pub(crate) struct CheckpointIo {
    /// Source tasks: checkpoint numbers to inject barriers for.
    pub(crate) trigger: Option<mpsc::UnboundedReceiver<CheckpointId>>,
    pub(crate) acks: mpsc::UnboundedSender<TaskEvent>,
    /// The checkpoint interval (alignment longer than it is warned of).
    pub(crate) interval: Duration,
    pub(crate) storage: std::sync::Arc<dyn crate::checkpoint::CheckpointStorage>,
    /// This run's token, in the names of its state files.
    pub(crate) run: std::sync::Arc<str>,
    /// The job's name.
    pub(crate) job: std::sync::Arc<str>,
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
    /// acknowledges (a failure is acknowledged as such). `aligned` is how
    /// long the barrier took to arrive on every input, `paused` how long
    /// the task held it (exporting its state): both on the export's span.
    fn write_and_ack(&self, n: CheckpointId, snapshots: Vec<StateSnapshot>, aligned: Duration, paused: Duration) {
        let (storage, run) = (self.storage.clone(), self.run.clone());
        let (acks, operator, instance, groups) =
            (self.acks.clone(), self.operator.clone(), self.instance, self.groups.clone());
        let task = self.task.clone();
        let span = tracing::info_span!(
            "checkpoint.export",
            job = %self.job,
            operator = %operator,
            instance,
            checkpoint = n.get(),
            alignment_ms = aligned.as_secs_f64() * 1000.0,
            pause_ms = paused.as_secs_f64() * 1000.0,
        );
        tokio::task::spawn_blocking(move || {
            let _export = span.enter();
            let result =
                crate::checkpoint::write_task_state(&*storage, &run, &operator, instance, &groups, n, snapshots);
            let ack = match result {
                Ok((states, schemas)) => {
                    Ack { checkpoint: n, sources: Vec::new(), states, schemas, failure: None, task }
                }
                Err(e) => Ack {
                    checkpoint: n,
                    sources: Vec::new(),
                    states: Vec::new(),
                    schemas: Vec::new(),
                    failure: Some(format!("{task}: {}", e.report())),
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

/// How often a task reads its partition's positions (a source) or its
/// state's sizes (a keyed operator) for metrics.
const POSITIONS_EVERY: Duration = Duration::from_secs(1);

/// How long a keyed task with a zero buffer timeout waits for input before
/// it flushes anyway (firing processing-time timers, sweeping expiring
/// state); with a buffer timeout, the timeout is the wait.
const IDLE_TICK: Duration = Duration::from_millis(50);

/// The task of one source partition.
pub(crate) struct SourceHead {
    pub(crate) op: Box<dyn SourceOperator>,
}

impl HeadRunner for SourceHead {
    fn run(mut self: Box<Self>, io: NodeIo) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            let mut last_flush = Instant::now();
            let mut since_yield = 0u32;
            let mut last_yield = Instant::now();
            // The partition's positions, for its lag, about once a second.
            let mut last_positions = Instant::now();
            io.task.positions(self.op.position(), self.op.end_position());
            let mut forwarded = crate::record::NO_TIMESTAMP;
            let mut io = io;
            let mut stalls = StallWatch::new(io.stall_limit());
            let task = io.checkpoint.as_ref().map_or_else(|| self.op.info().name.to_string(), |c| c.task.clone());
            let mut trigger = io.checkpoint.as_mut().and_then(|c| c.trigger.take());
            loop {
                if let Some(trigger) = trigger.as_mut() {
                    while let Ok(n) = trigger.try_recv() {
                        self.pass_barrier(n, &io).await?;
                    }
                }
                // Three clock reads a step: the poll's start, its end (the
                // batch's start) and the batch's end, which the flush and
                // yield checks reuse.
                let mut polled = Instant::now();
                let status = {
                    let mut read = self.op.read(last_flush + io.buffer_timeout);
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
                let mut now = polled;
                if self.op.emit()? > 0 {
                    now = Instant::now();
                    let took = now.saturating_duration_since(polled);
                    io.task.busy(took);
                    stalls.observe(took, &task, &io.chain, "a batch");
                }
                if self.op.watermark() > forwarded {
                    forwarded = self.op.watermark();
                    // Recorded before it fires anything downstream.
                    io.task.watermark(forwarded);
                    self.op.forward_watermark(forwarded)?;
                }
                if status != ReadStatus::More || now.saturating_duration_since(last_flush) >= io.buffer_timeout {
                    self.op.flush()?;
                    last_flush = now;
                }
                super::drain(&io.outbox, &io.senders).await?;
                if io.alignment.is_some() && self.align(status, &mut trigger, &io, last_flush).await? {
                    last_flush = Instant::now();
                }
                if status == ReadStatus::Done || now.saturating_duration_since(last_positions) >= POSITIONS_EVERY {
                    last_positions = now;
                    io.task.positions(self.op.position(), self.op.end_position());
                }
                if status == ReadStatus::Done {
                    io.task.ended();
                    self.op.finish()?;
                    super::drain(&io.outbox, &io.senders).await?;
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

impl SourceHead {
    /// Takes part in the source's watermark alignment after a read with
    /// `status`: waits while this partition is too far ahead. Returns
    /// whether it flushed (which it does if the wait outlasts the buffer
    /// timeout since `last_flush`).
    async fn align(
        &mut self,
        status: ReadStatus,
        trigger: &mut Option<mpsc::UnboundedReceiver<CheckpointId>>,
        io: &NodeIo,
        last_flush: Instant,
    ) -> Result<bool> {
        let Some(aligned) = io.alignment.as_ref() else { return Ok(false) };
        // Only a partition with records to read holds the others back (not
        // one idle now, nor one that ended).
        aligned.group.set_active(aligned.index, status == ReadStatus::More);
        if status != ReadStatus::More || !aligned.group.ahead(aligned.index) {
            return Ok(false);
        }
        // (No deadline: a buffer timeout too long to add to an instant.)
        self.wait_aligned(aligned, trigger, io, last_flush.checked_add(io.buffer_timeout)).await
    }

    /// Waits until this partition is no longer more than the drift ahead
    /// of the slowest partition of its source (see
    /// [`Alignment`](crate::time::alignment::Alignment)), passing the
    /// barriers of checkpoints meanwhile, and flushing what is buffered at
    /// `flush_at`, if any, if it is still waiting then. Returns whether it
    /// flushed.
    ///
    /// Most waits are short (the others catch up within a batch or two),
    /// and what is buffered keeps its place in the batches being filled:
    /// flushed at every wait, those batches went out small, and `bench w1`
    /// at two partitions with a small drift ran markedly slower. A longer
    /// wait flushes, so that no record waits longer than the buffer timeout
    /// for it.
    async fn wait_aligned(
        &mut self,
        aligned: &crate::time::alignment::Aligned,
        trigger: &mut Option<mpsc::UnboundedReceiver<CheckpointId>>,
        io: &NodeIo,
        flush_at: Option<Instant>,
    ) -> Result<bool> {
        let mut flushed = false;
        loop {
            let changed = aligned.group.changed();
            if !aligned.group.ahead(aligned.index) {
                return Ok(flushed);
            }
            let barrier = async {
                match trigger.as_mut() {
                    Some(t) => t.recv().await,
                    None => std::future::pending().await,
                }
            };
            let flush_due = async {
                match flush_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = changed => {}
                n = barrier => match n {
                    // Passing it flushes what is buffered.
                    Some(n) => {
                        self.pass_barrier(n, io).await?;
                        flushed = true;
                    }
                    // The coordinator is gone: no more barriers.
                    None => *trigger = None,
                },
                // What is buffered goes out once the wait has lasted: the
                // partitions behind are not waiting for it, the operators are.
                () = flush_due, if !flushed => {
                    self.op.flush()?;
                    super::drain(&io.outbox, &io.senders).await?;
                    flushed = true;
                }
                // A safety net: look again now and then whatever happens.
                () = tokio::time::sleep(io.buffer_timeout.max(Duration::from_millis(10))) => {}
            }
        }
    }

    /// Checkpoint `n`: everything read so far is in the chain; the barrier
    /// follows it, and the position is where reading resumes.
    async fn pass_barrier(&mut self, n: CheckpointId, io: &NodeIo) -> Result<()> {
        let Some(cp) = io.checkpoint.as_ref() else { return Ok(()) };
        let ack = self.position_ack(n, &cp.task);
        self.op.barrier(n)?;
        super::drain(&io.outbox, &io.senders).await?;
        let _ = cp.acks.send(TaskEvent::Ack(ack));
        Ok(())
    }

    /// This source's part in checkpoint `n`: where reading resumes.
    fn position_ack(&self, n: CheckpointId, task: &str) -> Ack {
        let mut ack = Ack {
            checkpoint: n,
            sources: Vec::new(),
            states: Vec::new(),
            schemas: Vec::new(),
            failure: None,
            task: task.to_string(),
        };
        let (name, partition) = (&self.op.info().name, self.op.partition());
        match self.op.position() {
            // Filed under the source's id, which a restore matches.
            Some(position) => ack.sources.push(SourcePositionEntry {
                source: self.op.info().id.to_string(),
                partition,
                position,
                partition_name: self.op.partition_name().map(str::to_string),
            }),
            None => {
                ack.failure = Some(format!(
                    "source `{name}` partition {partition} cannot report its position, so it cannot resume from a checkpoint"
                ));
            }
        }
        ack
    }
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
    /// The operator's own work made progress (or failed).
    Work(Result<()>),
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
            let mut idle_inputs = 0;
            // What the operator's state holds, for metrics, about once a second.
            let mut stats_at = Instant::now();
            *io.task.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = self.op.state_stats();
            let mut forwarded = NO_TIMESTAMP;
            let mut start = 0usize;
            let mut last_flush = Instant::now();
            let mut stalls = StallWatch::new(io.stall_limit());
            // Checkpoint alignment (see `Aligner`).
            let mut aligner = Aligner::new(n);
            // Slow alignments are warned of at most every ten seconds.
            let mut align_warned: Option<(Instant, u64)> = None;
            // Inputs open, or the operator's own work (asynchronous calls)
            // still to finish before it can.
            while open.iter().any(|o| *o) || (!finished && self.op.has_work()) {
                // With a zero buffer timeout every step flushes, but a quiet
                // input brings no step: wake now and then all the same, so
                // that processing-time timers fire and expiring state is
                // swept (both happen in `flush`).
                let wait = if io.buffer_timeout.is_zero() { IDLE_TICK } else { io.buffer_timeout };
                let deadline = tokio::time::Instant::from_std(last_flush + wait);
                let (inputs, op) = (&mut self.inputs, &mut self.op);
                let (open_now, aligning) = (&open, &aligner);
                let receive = std::future::poll_fn(|cx| {
                    // The operator's own work first (results of calls in
                    // flight); no input while it takes none.
                    if let Poll::Ready(done) = op.poll_work(cx) {
                        return Poll::Ready(Next::Work(done));
                    }
                    if !op.accepts_input() {
                        return Poll::Pending;
                    }
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
                // A barrier aligned but held until the operator finished
                // (see below) goes on now, without waiting for a message.
                let released = finished && aligner.aligned().is_some();
                // Once finished, nothing is buffered and no timer fires.
                let next = if released {
                    Next::Timeout
                } else if finished {
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
                    Next::Work(done) => {
                        let started = Instant::now();
                        done?;
                        io.task.busy(started.elapsed());
                    }
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
                    Next::Message(i, Some(Message::Data(mut batch))) => {
                        if ended.get(i).copied().unwrap_or(false) {
                            let from = self.inputs.get(i).map(|b| b.from.clone()).unwrap_or_default();
                            return Err(crate::error::internal_error!(
                                "`{from} -> {}` sent records after the end of its input",
                                self.name
                            ));
                        }
                        tracker.activate(i);
                        let started = Instant::now();
                        self.op.on_batch(&mut batch, &mut InputTime { tracker: &mut tracker, input: i })?;
                        let took = started.elapsed();
                        io.task.busy(took);
                        stalls.observe(took, &self.name, &io.chain, "a batch");
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
                        aligner.barrier(i, b).map_err(|m| crate::error::internal_error!("`{}`: {m}", self.name))?;
                    }
                }
                if stats_at.elapsed() >= POSITIONS_EVERY {
                    stats_at = Instant::now();
                    *io.task.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = self.op.state_stats();
                }
                if tracker.idle_inputs() != idle_inputs {
                    idle_inputs = tracker.idle_inputs();
                    io.task.idle_inputs.store(idle_inputs, std::sync::atomic::Ordering::Relaxed);
                }
                // A barrier that follows the end of every input waits until
                // the operator has finished (its own work, such as calls in
                // flight, done): the final checkpoint must cover all it
                // emits.
                let hold = !finished && ended.iter().all(|e| *e);
                if let Some(b) = aligner.aligned().filter(|_| !hold) {
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
                                tracing::warn!(task = %self.name, checkpoint = b.get(), ?took, interval = ?cp.interval, slow_before = before, "aligning the checkpoint's barrier took longer than the checkpoint interval: an input was slow to deliver it (backpressure, or blocking code upstream)");
                                align_warned = Some((Instant::now(), 0));
                            }
                        }
                    }
                    let aligned = aligner.took().unwrap_or_default();
                    let paused = Instant::now();
                    let since =
                        io.checkpoint.as_ref().map_or(0, |c| c.completed.load(std::sync::atomic::Ordering::Relaxed));
                    let snapshots = self.op.snapshot(SnapshotAt { n: b, since: CheckpointId::new(since) })?;
                    self.op.barrier(b)?;
                    let nanos = u64::try_from(paused.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    self.counters.checkpoint_pause_nanos.fetch_max(nanos, std::sync::atomic::Ordering::Relaxed);
                    let alignment = u64::try_from(aligned.as_nanos()).unwrap_or(u64::MAX);
                    self.counters.checkpoint_alignment_nanos.fetch_max(alignment, std::sync::atomic::Ordering::Relaxed);
                    if let Some(cp) = io.checkpoint.as_ref() {
                        cp.write_and_ack(b, snapshots, aligned, Duration::from_nanos(nanos));
                    }
                    aligner.release();
                }
                if tracker.current() > forwarded {
                    forwarded = tracker.current();
                    // Recorded before it fires anything downstream.
                    io.task.watermark(forwarded);
                    // Firing windows and timers is work too.
                    let started = Instant::now();
                    self.op.on_watermark(forwarded)?;
                    io.task.busy(started.elapsed());
                }
                if !finished && ended.iter().all(|e| *e) && !self.op.has_work() {
                    // Every input has ended: fire what is left, flush, and
                    // tell everything downstream; barriers may still come.
                    if forwarded < END_OF_TIME {
                        forwarded = END_OF_TIME;
                        io.task.ended();
                        let started = Instant::now();
                        self.op.on_watermark(END_OF_TIME)?;
                        io.task.busy(started.elapsed());
                    }
                    self.op.finish()?;
                    finished = true;
                } else if !finished && last_flush.elapsed() >= io.buffer_timeout {
                    self.op.flush()?;
                    last_flush = Instant::now();
                }
                super::drain(&io.outbox, &io.senders).await?;
            }
            Ok(())
        })
    }
}
