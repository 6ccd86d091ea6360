//! Metrics a job keeps while it runs: records per operator, records dropped
//! or dead-lettered, and per edge the time its senders spent blocked because
//! the edge was full (backpressure).
//!
//! Read them with [`JobHandle::metrics`](crate::JobHandle::metrics) while a
//! job runs, or from [`JobReport::metrics`](crate::JobReport) when it ends.

#[cfg(feature = "otel")]
pub(crate) mod otel;
pub(crate) mod prometheus;

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Counters of one operator, summed over its parallel instances.
#[derive(Debug, Default)]
pub(crate) struct OperatorCounters {
    pub(crate) records_in: AtomicU64,
    pub(crate) records_out: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) late: AtomicU64,
    /// The longest a checkpoint barrier held an instance (nanoseconds).
    pub(crate) checkpoint_pause_nanos: AtomicU64,
    /// The longest a keyed instance took to align a checkpoint's barriers
    /// (from the first input's barrier to the last's, nanoseconds).
    pub(crate) checkpoint_alignment_nanos: AtomicU64,
}

impl OperatorCounters {
    #[inline]
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        if n > 0 {
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

/// What a two-input operator (a join, a connected or broadcast operator)
/// counts of its inputs, shared by its instances: records of each input
/// too late, rows emitted for records of each input that found no
/// partner (outer joins), and pairs emitted (joins). Each input's records
/// are counted by the step that tags them with their side, and what each
/// buffers is read from the state that holds it.
#[derive(Debug, Default)]
pub(crate) struct TwoInputCounters {
    pub(crate) late: [AtomicU64; 2],
    pub(crate) unmatched: [AtomicU64; 2],
    pub(crate) matched: AtomicU64,
}

impl TwoInputCounters {
    /// Adds `n` to `counters[side]` (side 0: the first input, 1: the
    /// second).
    #[inline]
    pub(crate) fn add(counters: &[AtomicU64; 2], side: usize, n: usize) {
        if let Some(c) = counters.get(side) {
            OperatorCounters::add(c, n);
        }
    }
}

/// How a two-input operator's inputs are described in its metrics: the
/// operators that tag each input's records (whose output counts them),
/// what feeds those, each input's label, the state that holds each
/// input's waiting records (if one does), and the operator's counters.
#[derive(Clone, Debug)]
pub(crate) struct TwoInputs {
    pub(crate) labels: [String; 2],
    pub(crate) tags: [String; 2],
    pub(crate) from: [String; 2],
    pub(crate) states: [Option<String>; 2],
    pub(crate) counters: Arc<TwoInputCounters>,
}

/// Counters of one edge (one sender instance to one receiver instance).
#[derive(Debug, Default)]
pub(crate) struct EdgeCounters {
    pub(crate) blocked_nanos: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) records: AtomicU64,
}

/// How full an edge's channel is now: messages queued, if the channel is
/// still open. Read only when metrics are read.
pub(crate) type Fill = Box<dyn Fn() -> Option<usize> + Send + Sync>;

/// What one state of an operator instance holds now, for its metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StateStats {
    /// Entries in memory: all of them with the in-memory backend, those
    /// cached in front of a table with fjall.
    pub(crate) memory_entries: u64,
    /// What those take in memory, roughly: their maps' slots (keys and
    /// values, not what they point to on the heap).
    pub(crate) memory_bytes: u64,
    /// For a state in a table: the table's entries (approximate) and its
    /// size on disk, for all the operator's instances (they share it).
    pub(crate) table: Option<(u64, u64)>,
    /// Reads of a cached state answered from memory, and those that read
    /// the table.
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    /// Entries removed because their time-to-live ran out.
    pub(crate) expired: u64,
}

impl StateStats {
    /// `entries` entries of `slot` bytes each in memory.
    pub(crate) fn in_memory(entries: usize, slot: usize) -> Self {
        let entries = entries as u64;
        Self { memory_entries: entries, memory_bytes: entries.saturating_mul(slot as u64 + 1), ..Self::default() }
    }
}

/// What one task (a head and its fused chain) reports of its time.
#[derive(Debug)]
pub(crate) struct TaskCounters {
    /// The watermark the task passed on last (milliseconds), or
    /// `i64::MIN` before its first.
    pub(crate) watermark: AtomicI64,
    /// Inputs of the task now marked idle (they do not hold its watermark
    /// back).
    pub(crate) idle_inputs: AtomicU64,
    /// A source partition's read position and the position its end is
    /// at now (`u64::MAX`: unknown), read from the reader about once a
    /// second.
    pub(crate) position: AtomicU64,
    pub(crate) end_position: AtomicU64,
    /// Set once a timestamps operator in the task's chain has generated a
    /// watermark: from then on the task reports that one (what the
    /// operators after it see), not its head's.
    pub(crate) generated: std::sync::atomic::AtomicBool,
    /// What each state of a keyed task's operator holds, as of about a
    /// second ago.
    pub(crate) state: Mutex<Vec<(std::borrow::Cow<'static, str>, StateStats)>>,
    /// Time spent on batches: a keyed head's operator and chain on them, a
    /// source's chain on what it read (nanoseconds).
    pub(crate) busy_nanos: AtomicU64,
}

impl Default for TaskCounters {
    fn default() -> Self {
        Self {
            watermark: AtomicI64::new(i64::MIN),
            idle_inputs: AtomicU64::new(0),
            position: AtomicU64::new(u64::MAX),
            end_position: AtomicU64::new(u64::MAX),
            generated: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(Vec::new()),
            busy_nanos: AtomicU64::new(0),
        }
    }
}

impl TaskCounters {
    /// Records the watermark the task's head passes on (unless a
    /// timestamps operator in its chain generates the task's own).
    #[inline]
    pub(crate) fn watermark(&self, at: i64) {
        if !self.generated.load(Ordering::Relaxed) {
            self.watermark.store(at, Ordering::Relaxed);
        }
    }

    /// Counts time spent on a batch.
    #[inline]
    pub(crate) fn busy(&self, took: Duration) {
        self.busy_nanos.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Records a watermark a timestamps operator in the chain generated.
    #[inline]
    pub(crate) fn generated_watermark(&self, at: i64) {
        self.generated.store(true, Ordering::Relaxed);
        self.watermark.store(at, Ordering::Relaxed);
    }

    /// The task's input has ended: every operator in it is at the end of
    /// time.
    pub(crate) fn ended(&self) {
        self.watermark.store(i64::MAX, Ordering::Relaxed);
    }

    /// Records a source partition's read position and end, if known.
    pub(crate) fn positions(&self, position: Option<u64>, end: Option<u64>) {
        self.position.store(position.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.end_position.store(end.unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// A source task's source id and partition.
pub(crate) type SourcePartition = (String, u32);

/// A task's counters with its name, its operators and its input count.
struct NamedTask {
    name: String,
    operators: Vec<String>,
    inputs: usize,
    source: Option<SourcePartition>,
    counters: Arc<TaskCounters>,
}

/// An edge's counters with its sender and receiver instance names, its
/// channel's capacity and a way to read how full it is.
struct NamedEdge {
    from: String,
    to: String,
    capacity: usize,
    fill: Fill,
    counters: Arc<EdgeCounters>,
}

impl fmt::Debug for NamedEdge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedEdge").field("from", &self.from).field("to", &self.to).finish_non_exhaustive()
    }
}

impl fmt::Debug for NamedTask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedTask")
            .field("name", &self.name)
            .field("operators", &self.operators)
            .finish_non_exhaustive()
    }
}

/// Counters of one exactly-once sink's transactions.
#[derive(Debug, Default)]
pub(crate) struct SinkCounters {
    pub(crate) committed: AtomicU64,
    /// Pre-committed transactions discarded on restore.
    pub(crate) aborted: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) commit_nanos: AtomicU64,
}

#[derive(Debug)]
struct Named<T> {
    name: String,
    counters: Arc<T>,
}

/// An operator's counters, one per instance.
#[derive(Debug)]
struct NamedOperator {
    name: String,
    instances: Vec<Arc<OperatorCounters>>,
}

/// The registry all counters of a job live in.
#[derive(Debug, Default, Clone)]
pub(crate) struct Registry {
    operators: Arc<Mutex<Vec<NamedOperator>>>,
    edges: Arc<Mutex<Vec<NamedEdge>>>,
    sinks: Arc<Mutex<Vec<Named<SinkCounters>>>>,
    tasks: Arc<Mutex<Vec<NamedTask>>>,
    /// Two-input operators, by name, and how their inputs are described.
    two_inputs: Arc<Mutex<Vec<(String, TwoInputs)>>>,
}

impl Registry {
    /// Lists operator `name` (metrics list operators in the order they
    /// are first named).
    pub(crate) fn operator(&self, name: &str) {
        let mut ops = self.operators.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !ops.iter().any(|n| n.name == name) {
            ops.push(NamedOperator { name: name.to_string(), instances: Vec::new() });
        }
    }

    /// The counters of instance `instance` of operator `name`.
    pub(crate) fn instance(&self, name: &str, instance: usize) -> Arc<OperatorCounters> {
        let mut ops = self.operators.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = match ops.iter().position(|n| n.name == name) {
            Some(at) => at,
            None => {
                ops.push(NamedOperator { name: name.to_string(), instances: Vec::new() });
                ops.len() - 1
            }
        };
        let Some(op) = ops.get_mut(at) else { return Arc::default() };
        while op.instances.len() <= instance {
            op.instances.push(Arc::default());
        }
        op.instances.get(instance).cloned().unwrap_or_default()
    }

    /// Describes the inputs of two-input operator `name`.
    pub(crate) fn two_inputs(&self, name: &str, inputs: TwoInputs) {
        let mut all = self.two_inputs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !all.iter().any(|(n, _)| n == name) {
            all.push((name.to_string(), inputs));
        }
    }

    /// The counters of exactly-once sink `id`.
    pub(crate) fn sink(&self, id: &str) -> Arc<SinkCounters> {
        let mut sinks = self.sinks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = sinks.iter().find(|n| n.name == id) {
            return found.counters.clone();
        }
        let counters = Arc::new(SinkCounters::default());
        sinks.push(Named { name: id.to_string(), counters: counters.clone() });
        counters
    }

    /// New counters for the edge from `from` to `to`, whose channel holds
    /// `capacity` messages and is `fill` full.
    pub(crate) fn edge(&self, from: String, to: String, capacity: usize, fill: Fill) -> Arc<EdgeCounters> {
        let counters = Arc::new(EdgeCounters::default());
        self.edges.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(NamedEdge {
            from,
            to,
            capacity,
            fill,
            counters: counters.clone(),
        });
        counters
    }

    /// Registers the `counters` of task `name` (`head[instance]`), which
    /// runs `operators` (its head first, then its fused chain) and reads
    /// `inputs` channels (none for a source; a source's task names its
    /// source id and partition).
    pub(crate) fn task(
        &self,
        name: String,
        operators: Vec<String>,
        inputs: usize,
        source: Option<SourcePartition>,
        counters: Arc<TaskCounters>,
    ) -> Arc<TaskCounters> {
        self.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(NamedTask {
            name,
            operators,
            inputs,
            source,
            counters: counters.clone(),
        });
        counters
    }

    /// A consistent-enough copy of every counter (each read atomically).
    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let tasks: Vec<TaskMetrics> = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|t| {
                let at = t.counters.watermark.load(Ordering::Relaxed);
                let known = |p: &AtomicU64| Some(p.load(Ordering::Relaxed)).filter(|p| *p != u64::MAX);
                TaskMetrics {
                    name: t.name.clone(),
                    operators: t.operators.clone(),
                    inputs: t.inputs,
                    idle_inputs: t.counters.idle_inputs.load(Ordering::Relaxed),
                    watermark: (at != i64::MIN).then_some(at),
                    busy: Duration::from_nanos(t.counters.busy_nanos.load(Ordering::Relaxed)),
                    state: t
                        .counters
                        .state
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .iter()
                        .map(|(state, s)| StateMetrics::of(state, s))
                        .collect(),
                    source: t.source.as_ref().map(|(id, partition)| SourceTaskMetrics {
                        source: id.clone(),
                        partition: *partition,
                        position: known(&t.counters.position),
                        end_position: known(&t.counters.end_position),
                    }),
                }
            })
            .collect();
        let mut operators: Vec<OperatorMetrics> = self
            .operators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|n| {
                let instances: Vec<InstanceMetrics> = n
                    .instances
                    .iter()
                    .enumerate()
                    .map(|(instance, c)| InstanceMetrics {
                        instance,
                        records_in: c.records_in.load(Ordering::Relaxed),
                        records_out: c.records_out.load(Ordering::Relaxed),
                        dropped: c.dropped.load(Ordering::Relaxed),
                        dead_lettered: c.dead_lettered.load(Ordering::Relaxed),
                        late: c.late.load(Ordering::Relaxed),
                    })
                    .collect();
                let longest = |f: fn(&OperatorCounters) -> &AtomicU64| {
                    Duration::from_nanos(n.instances.iter().map(|c| f(c).load(Ordering::Relaxed)).max().unwrap_or(0))
                };
                OperatorMetrics {
                    name: n.name.clone(),
                    records_in: instances.iter().map(|i| i.records_in).sum(),
                    records_out: instances.iter().map(|i| i.records_out).sum(),
                    dropped: instances.iter().map(|i| i.dropped).sum(),
                    dead_lettered: instances.iter().map(|i| i.dead_lettered).sum(),
                    late: instances.iter().map(|i| i.late).sum(),
                    max_checkpoint_pause: longest(|c| &c.checkpoint_pause_nanos),
                    max_checkpoint_alignment: longest(|c| &c.checkpoint_alignment_nanos),
                    watermark: None,
                    idle_inputs: 0,
                    state: Vec::new(),
                    matched: 0,
                    inputs: Vec::new(),
                    instances,
                }
            })
            .collect();
        for o in &mut operators {
            // The operator's watermark is its slowest instance's: none
            // while any instance has none yet.
            let mut running = tasks.iter().filter(|t| t.operators.contains(&o.name)).peekable();
            if running.peek().is_some() {
                o.watermark = running.clone().map(|t| t.watermark).min().flatten();
                let heads: Vec<&TaskMetrics> = running.filter(|t| t.operators.first() == Some(&o.name)).collect();
                o.idle_inputs = heads.iter().map(|t| t.idle_inputs).sum();
                // Its instances' states, each summed over them (a table,
                // which they share, counted once).
                for t in &heads {
                    for s in &t.state {
                        match o.state.iter_mut().find(|m| m.state == s.state) {
                            Some(m) => m.add(s),
                            None => o.state.push(s.clone()),
                        }
                    }
                }
            }
        }
        for (name, two) in self.two_inputs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            let inputs: Vec<InputMetrics> = (0..2)
                .map(|side| {
                    let at = |a: &[String; 2]| a.get(side).cloned().unwrap_or_default();
                    let tag = at(&two.tags);
                    let records_in = operators.iter().find(|o| o.name == tag).map_or(0, |o| o.records_out);
                    let state = two.states.get(side).cloned().flatten();
                    let buffered = state.as_ref().and_then(|s| {
                        let o = operators.iter().find(|o| &o.name == name)?;
                        let m = o.state.iter().find(|m| &m.state == s)?;
                        Some(m.table_entries.unwrap_or(m.memory_entries))
                    });
                    let count = |c: &[AtomicU64; 2]| c.get(side).map_or(0, |c| c.load(Ordering::Relaxed));
                    InputMetrics {
                        input: at(&two.labels),
                        from: at(&two.from),
                        records_in,
                        late: count(&two.counters.late),
                        unmatched: count(&two.counters.unmatched),
                        state,
                        buffered,
                    }
                })
                .collect();
            if let Some(o) = operators.iter_mut().find(|o| &o.name == name) {
                o.matched = two.counters.matched.load(Ordering::Relaxed);
                o.inputs = inputs;
            }
        }
        let edges = self
            .edges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|e| EdgeMetrics {
                from: e.from.clone(),
                to: e.to.clone(),
                blocked: Duration::from_nanos(e.counters.blocked_nanos.load(Ordering::Relaxed)),
                batches: e.counters.batches.load(Ordering::Relaxed),
                records: e.counters.records.load(Ordering::Relaxed),
                queued: (e.fill)().map_or(0, |q| u64::try_from(q).unwrap_or(u64::MAX)),
                capacity: u64::try_from(e.capacity).unwrap_or(u64::MAX),
            })
            .collect();
        let sinks = self
            .sinks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|n| SinkMetrics {
                id: n.name.clone(),
                committed: n.counters.committed.load(Ordering::Relaxed),
                aborted: n.counters.aborted.load(Ordering::Relaxed),
                failed: n.counters.failed.load(Ordering::Relaxed),
                commit_time: Duration::from_nanos(n.counters.commit_nanos.load(Ordering::Relaxed)),
            })
            .collect();
        MetricsSnapshot { operators, edges, sinks, tasks }
    }
}

/// A duration as milliseconds (fractional), as the admin API's JSON
/// gives durations.
fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// One operator's counters, summed over its instances.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct OperatorMetrics {
    /// The operator's name.
    pub name: String,
    /// Records that reached the operator.
    pub records_in: u64,
    /// Records it emitted.
    pub records_out: u64,
    /// Records dropped and counted: a `process` function failed on them under
    /// `on_error::Drop`; a timer function failed (no record to dead-letter)
    /// under `Drop` or `DeadLetter`; or a record fell in no window (the gap
    /// between sliding windows that slide further than their size).
    pub dropped: u64,
    /// Records its `process` function failed on and that went to the dead-letter output.
    pub dead_lettered: u64,
    /// Records a window operator got too late for any window (sent to its
    /// late output when that is used, dropped otherwise).
    pub late: u64,
    /// The longest time a checkpoint barrier held one instance of the
    /// operator: from the last input's barrier to passing it on (exporting
    /// keyed state happens in between).
    #[serde(rename = "max_checkpoint_pause_ms", serialize_with = "millis")]
    pub max_checkpoint_pause: Duration,
    /// The longest time one keyed instance of the operator took to align a
    /// checkpoint's barriers: from the first input's barrier to the last's
    /// (an input slow to deliver it, under backpressure, makes it long).
    #[serde(rename = "max_checkpoint_alignment_ms", serialize_with = "millis")]
    pub max_checkpoint_alignment: Duration,
    /// The watermark of its slowest instance (event time in milliseconds),
    /// or none while an instance has none yet. After the end of the input
    /// it is `i64::MAX`, the end of time.
    #[serde(rename = "watermark_ms")]
    pub watermark: Option<i64>,
    /// Inputs of its instances now marked idle (for an operator at the
    /// head of a task: a keyed operator's input edges).
    pub idle_inputs: u64,
    /// What each of its keyed states holds now, over its instances (read
    /// from them about once a second); empty for an operator without
    /// keyed state.
    pub state: Vec<StateMetrics>,
    /// For a join: the pairs it emitted (rows with a record of each
    /// input). 0 for other operators.
    pub matched: u64,
    /// For an operator of two inputs (a join, `connect` of keyed streams,
    /// `connect_broadcast`): what each input brought and what waits of it
    /// (first input first); empty for others.
    pub inputs: Vec<InputMetrics>,
    /// The counters above per instance (an operator fused after a `union`
    /// runs once per head instance that feeds it).
    pub instances: Vec<InstanceMetrics>,
}

/// One input of an operator of two inputs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct InputMetrics {
    /// Which input: `first input` or `second input` (the stream the
    /// operator was called on, and the other), or for a broadcast
    /// operator `keyed input` / `main input` and `broadcast input`.
    pub input: String,
    /// The operator that feeds it.
    pub from: String,
    /// Its records sent to the operator.
    pub records_in: u64,
    /// Its records the operator got too late (in its late output when that
    /// is used; counted in the operator's `late` too).
    pub late: u64,
    /// Rows an outer join emitted for its records that found no partner.
    pub unmatched: u64,
    /// The state its records wait in, for an operator that keeps them
    /// (an interval join's `left` and `right`, a temporal join's `waiting`
    /// records and table `versions`); none for others.
    pub state: Option<String>,
    /// The entries of that state now, over the instances (on fjall, its
    /// table's approximate count): an interval join has one per key with
    /// records of the input waiting (all of them, in time order), a
    /// temporal join one per key and event time with records waiting, and
    /// one per version of a key's row.
    pub buffered: Option<u64>,
}

/// What one keyed state of an operator holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct StateMetrics {
    /// The state's name (`value`, `accumulator`, `windows`, `timers`, ...).
    pub state: String,
    /// Entries in memory: all of them with the in-memory backend; those
    /// cached in front of the table with fjall.
    pub memory_entries: u64,
    /// Roughly what they take in memory: their maps' slots (keys and
    /// values as laid out, not what they point to on the heap); with
    /// fjall, the cache's own count.
    pub memory_bytes: u64,
    /// With fjall: the state's table's entries (approximate: fjall counts
    /// a removed key until compaction) and bytes on disk.
    pub table_entries: Option<u64>,
    /// See `table_entries`.
    pub table_bytes: Option<u64>,
    /// With fjall: reads and updates answered from the cache, and those
    /// that read the table, since the job started.
    pub cache_hits: u64,
    /// See `cache_hits`.
    pub cache_misses: u64,
    /// Entries removed because their time-to-live ran out, since the job
    /// started (states declared with a `StateTtl`).
    pub expired: u64,
}

impl StateMetrics {
    fn of(state: &str, s: &StateStats) -> Self {
        Self {
            state: state.to_string(),
            memory_entries: s.memory_entries,
            memory_bytes: s.memory_bytes,
            table_entries: s.table.map(|t| t.0),
            table_bytes: s.table.map(|t| t.1),
            cache_hits: s.hits,
            cache_misses: s.misses,
            expired: s.expired,
        }
    }

    /// Adds another instance's: memory and cache counts add up; the table
    /// is the same one.
    fn add(&mut self, other: &Self) {
        self.memory_entries += other.memory_entries;
        self.memory_bytes += other.memory_bytes;
        self.table_entries = self.table_entries.max(other.table_entries);
        self.table_bytes = self.table_bytes.max(other.table_bytes);
        self.cache_hits += other.cache_hits;
        self.cache_misses += other.cache_misses;
        self.expired += other.expired;
    }
}

/// One instance's counters of an operator.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct InstanceMetrics {
    /// The instance's number.
    pub instance: usize,
    /// Records that reached it.
    pub records_in: u64,
    /// Records it emitted.
    pub records_out: u64,
    /// Records it dropped and counted.
    pub dropped: u64,
    /// Records it sent to the dead-letter output.
    pub dead_lettered: u64,
    /// Records too late for any window.
    pub late: u64,
}

/// One edge's counters: one sender instance to one receiver instance.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct EdgeMetrics {
    /// The sending node instance, as `name[instance]`.
    pub from: String,
    /// The receiving node instance, as `name[instance]`.
    pub to: String,
    /// Time the sender spent blocked because the edge was full.
    #[serde(rename = "blocked_ms", serialize_with = "millis")]
    pub blocked: Duration,
    /// Batches sent.
    pub batches: u64,
    /// Records sent.
    pub records: u64,
    /// Messages (batches, watermarks, barriers) queued in the channel now.
    pub queued: u64,
    /// How many messages the channel holds when full.
    pub capacity: u64,
}

/// One task: a head instance (a source partition or a keyed operator
/// instance) and the operators fused behind it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TaskMetrics {
    /// The head instance, as `name[instance]`.
    pub name: String,
    /// The operators it runs, its head first.
    pub operators: Vec<String>,
    /// Its input channels (none for a source partition).
    pub inputs: usize,
    /// Those of them now marked idle.
    pub idle_inputs: u64,
    /// The watermark it passed on last (milliseconds), if any: its
    /// head's, or the one a timestamps operator in its chain generated.
    #[serde(rename = "watermark_ms")]
    pub watermark: Option<i64>,
    /// For a source partition: where it reads.
    pub source: Option<SourceTaskMetrics>,
    /// For a keyed operator's instance: what its states hold.
    pub state: Vec<StateMetrics>,
    /// Time it spent on batches since it started: a keyed instance's
    /// operator and chain on what it received and on the windows and
    /// timers its watermarks fired, a source partition's chain on what it
    /// read (not the reading itself, nor waiting, nor checkpoint pauses). Its rate is
    /// the task's busy share: near 1, the task is the bottleneck.
    #[serde(rename = "busy_ms", serialize_with = "millis")]
    pub busy: Duration,
}

/// Where a source partition reads, and how far behind its end it is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SourceTaskMetrics {
    /// The source's id.
    pub source: String,
    /// The partition's number in the source.
    pub partition: u32,
    /// Where the next record will be read from (for Kafka, an offset),
    /// as of about a second ago; `None` if the reader cannot say.
    pub position: Option<u64>,
    /// Where the partition ends now (for Kafka, the last stable offset),
    /// if the reader can tell.
    pub end_position: Option<u64>,
}

impl SourceTaskMetrics {
    /// How far reading is behind the partition's end (for Kafka, the
    /// consumer lag in offsets), when both are known.
    pub fn lag(&self) -> Option<u64> {
        Some(self.end_position?.saturating_sub(self.position?))
    }
}

/// One exactly-once sink's transactions.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SinkMetrics {
    /// The sink's id.
    pub id: String,
    /// Transactions committed (each once, after its checkpoint completed).
    pub committed: u64,
    /// Transactions (pre-committed, or still open) of epochs after the
    /// restored checkpoint, discarded when the job started (their records
    /// are processed again).
    pub aborted: u64,
    /// Commits that failed (each is tried again with the next checkpoint).
    pub failed: u64,
    /// Time spent committing, in all.
    #[serde(rename = "commit_time_ms", serialize_with = "millis")]
    pub commit_time: Duration,
}

/// A copy of a job's metrics at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Per operator.
    pub operators: Vec<OperatorMetrics>,
    /// Per edge.
    pub edges: Vec<EdgeMetrics>,
    /// Per exactly-once sink.
    pub sinks: Vec<SinkMetrics>,
    /// Per task.
    pub tasks: Vec<TaskMetrics>,
}

impl MetricsSnapshot {
    /// The operator called `name`, if the job has one.
    pub fn operator(&self, name: &str) -> Option<&OperatorMetrics> {
        self.operators.iter().find(|o| o.name == name)
    }

    /// Total time all senders spent blocked on full edges.
    pub fn total_blocked(&self) -> Duration {
        self.edges.iter().map(|e| e.blocked).sum()
    }
}

impl fmt::Display for MetricsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "operators:")?;
        for o in &self.operators {
            writeln!(
                f,
                "  {:<24} in {:>12}  out {:>12}  dropped {:>8}  dead-lettered {:>8}  late {:>8}",
                o.name, o.records_in, o.records_out, o.dropped, o.dead_lettered, o.late
            )?;
        }
        writeln!(f, "edges:")?;
        for e in &self.edges {
            writeln!(
                f,
                "  {} -> {}: {} records in {} batch{}, sender blocked {:?}",
                e.from,
                e.to,
                e.records,
                e.batches,
                if e.batches == 1 { "" } else { "es" },
                e.blocked
            )?;
        }
        if !self.sinks.is_empty() {
            writeln!(f, "exactly-once sinks:")?;
            for s in &self.sinks {
                writeln!(
                    f,
                    "  {}: {} committed, {} failed, {} aborted on restore, {:?} committing",
                    s.id, s.committed, s.failed, s.aborted, s.commit_time
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn an_operators_watermark_is_its_slowest_tasks_and_fill_is_read_when_read() {
        let r = Registry::default();
        r.operator("source");
        r.operator("window");
        r.operator("sink");
        let task = |name: &str, ops: &[&str], inputs, source| {
            r.task(name.into(), ops.iter().map(|o| o.to_string()).collect(), inputs, source, Arc::default())
        };
        let a = task("source[0]", &["source"], 0, Some(("source".into(), 0)));
        let b = task("source[1]", &["source"], 0, Some(("source".into(), 1)));
        let w = task("window[0]", &["window", "sink"], 2, None);
        let queued = Arc::new(AtomicU64::new(0));
        let q = queued.clone();
        let _ = r.edge(
            "source[0]".into(),
            "window[0]".into(),
            4,
            Box::new(move || usize::try_from(q.load(Ordering::Relaxed)).ok()),
        );
        let _ = r.edge("source[1]".into(), "window[0]".into(), 4, Box::new(|| None));
        let m = r.snapshot();
        assert_eq!(m.operator("source").unwrap().watermark, None, "no task has passed one on yet");
        a.watermark(10);
        assert_eq!(r.snapshot().operator("source").unwrap().watermark, None, "source[1] has none yet");
        b.watermark(7);
        w.watermark(5);
        w.idle_inputs.store(1, Ordering::Relaxed);
        queued.store(3, Ordering::Relaxed);
        let m = r.snapshot();
        assert_eq!(m.operator("source").unwrap().watermark, Some(7));
        assert_eq!(m.operator("sink").unwrap().watermark, Some(5), "a fused operator has its head's watermark");
        assert_eq!(m.operator("window").unwrap().idle_inputs, 1);
        assert_eq!(m.operator("sink").unwrap().idle_inputs, 0, "idle inputs are the head's");
        assert_eq!(m.edges.iter().map(|e| (e.queued, e.capacity)).collect::<Vec<_>>(), [(3, 4), (0, 4)]);
        assert_eq!(m.tasks.len(), 3);
        assert_eq!(m.tasks[0].source.as_ref().unwrap().lag(), None);
        // Per instance, and summed; the longest pause of any instance.
        r.instance("source", 1).records_out.store(5, Ordering::Relaxed);
        r.instance("source", 0).records_out.store(3, Ordering::Relaxed);
        r.instance("source", 1).checkpoint_pause_nanos.store(7, Ordering::Relaxed);
        r.instance("source", 0).checkpoint_pause_nanos.store(2, Ordering::Relaxed);
        let m = r.snapshot();
        let source = m.operator("source").unwrap();
        assert_eq!(source.records_out, 8);
        assert_eq!(source.instances.iter().map(|i| (i.instance, i.records_out)).collect::<Vec<_>>(), [(0, 3), (1, 5)]);
        assert_eq!(source.max_checkpoint_pause, Duration::from_nanos(7));
        assert_eq!(m.operators.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["source", "window", "sink"]);
        a.positions(Some(40), Some(100));
        let m = r.snapshot();
        let source = m.tasks[0].source.as_ref().unwrap();
        assert_eq!((source.partition, source.position, source.lag()), (0, Some(40), Some(60)));
        assert!(m.tasks[2].source.is_none());
    }
}
