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
use std::sync::atomic::{AtomicU64, Ordering};
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
}

impl OperatorCounters {
    #[inline]
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        if n > 0 {
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

/// Counters of one edge (one sender instance to one receiver instance).
#[derive(Debug, Default)]
pub(crate) struct EdgeCounters {
    pub(crate) blocked_nanos: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) records: AtomicU64,
}

/// Counters of one exactly-once sink's transactions.
#[derive(Debug, Default)]
pub(crate) struct SinkCounters {
    pub(crate) committed: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) commit_nanos: AtomicU64,
}

#[derive(Debug)]
struct Named<T> {
    name: String,
    counters: Arc<T>,
}

/// An edge's counters with its sender and receiver instance names.
type NamedEdge = (String, String, Arc<EdgeCounters>);

/// The registry all counters of a job live in.
#[derive(Debug, Default, Clone)]
pub(crate) struct Registry {
    operators: Arc<Mutex<Vec<Named<OperatorCounters>>>>,
    edges: Arc<Mutex<Vec<NamedEdge>>>,
    sinks: Arc<Mutex<Vec<Named<SinkCounters>>>>,
}

impl Registry {
    /// The counters of operator `name` (shared by all its instances).
    pub(crate) fn operator(&self, name: &str) -> Arc<OperatorCounters> {
        let mut ops = self.operators.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = ops.iter().find(|n| n.name == name) {
            return found.counters.clone();
        }
        let counters = Arc::new(OperatorCounters::default());
        ops.push(Named { name: name.to_string(), counters: counters.clone() });
        counters
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

    /// New counters for the edge from `from` to `to`.
    pub(crate) fn edge(&self, from: String, to: String) -> Arc<EdgeCounters> {
        let counters = Arc::new(EdgeCounters::default());
        self.edges.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((from, to, counters.clone()));
        counters
    }

    /// A consistent-enough copy of every counter (each read atomically).
    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let operators = self
            .operators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|n| OperatorMetrics {
                name: n.name.clone(),
                records_in: n.counters.records_in.load(Ordering::Relaxed),
                records_out: n.counters.records_out.load(Ordering::Relaxed),
                dropped: n.counters.dropped.load(Ordering::Relaxed),
                dead_lettered: n.counters.dead_lettered.load(Ordering::Relaxed),
                late: n.counters.late.load(Ordering::Relaxed),
                max_checkpoint_pause: Duration::from_nanos(n.counters.checkpoint_pause_nanos.load(Ordering::Relaxed)),
            })
            .collect();
        let edges = self
            .edges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(from, to, c)| EdgeMetrics {
                from: from.clone(),
                to: to.clone(),
                blocked: Duration::from_nanos(c.blocked_nanos.load(Ordering::Relaxed)),
                batches: c.batches.load(Ordering::Relaxed),
                records: c.records.load(Ordering::Relaxed),
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
                failed: n.counters.failed.load(Ordering::Relaxed),
                commit_time: Duration::from_nanos(n.counters.commit_nanos.load(Ordering::Relaxed)),
            })
            .collect();
        MetricsSnapshot { operators, edges, sinks }
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
}

/// One exactly-once sink's transactions.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SinkMetrics {
    /// The sink's id.
    pub id: String,
    /// Transactions committed (each once, after its checkpoint completed).
    pub committed: u64,
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
                    "  {}: {} committed, {} failed, {:?} committing",
                    s.id, s.committed, s.failed, s.commit_time
                )?;
            }
        }
        Ok(())
    }
}
