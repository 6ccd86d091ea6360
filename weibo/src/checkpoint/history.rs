//! The checkpoints a running job took, newest last: what the admin API
//! shows (`GET /api/checkpoints`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Serialize;

/// How many checkpoints a history keeps (the oldest go first).
const KEPT: usize = 200;

/// One checkpoint attempt.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct CheckpointRecord {
    /// Its number.
    pub id: u64,
    /// `checkpoint` (on the interval or asked for), `savepoint`, or
    /// `final` (at the end of the input).
    pub kind: &'static str,
    /// The savepoint's name, for a savepoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub savepoint: Option<String>,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// From the trigger to the manifest written (or the failure).
    pub duration_ms: f64,
    /// Bytes of the state files it wrote (not those it carried over from
    /// earlier checkpoints of a chain).
    pub bytes: u64,
    /// `completed` or `failed`.
    pub outcome: &'static str,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A job's checkpoint history, shared by its coordinator (which writes
/// it) and whoever reads it.
#[derive(Debug, Default)]
pub(crate) struct History {
    records: Mutex<VecDeque<CheckpointRecord>>,
    /// Since the job started (the records keep only the newest).
    totals: Mutex<Totals>,
}

impl History {
    /// Records the sources' positions of the newest completed checkpoint.
    pub(crate) fn positions(&self, positions: Vec<(String, u32, u64)>) {
        self.totals.lock().unwrap_or_else(std::sync::PoisonError::into_inner).positions = positions;
    }

    /// Records each operator's state in the newest completed checkpoint:
    /// (operator id, bytes of the files a restore would read, files).
    pub(crate) fn state_sizes(&self, sizes: Vec<(String, u64, u64)>) {
        self.totals.lock().unwrap_or_else(std::sync::PoisonError::into_inner).state = sizes;
    }

    /// Counts a checkpoint (or savepoint) triggered.
    pub(crate) fn started(&self) {
        self.totals.lock().unwrap_or_else(std::sync::PoisonError::into_inner).started += 1;
    }

    /// Records the restore the job started with.
    pub(crate) fn restored(&self, entries: u64, took: Duration) {
        self.totals.lock().unwrap_or_else(std::sync::PoisonError::into_inner).restored =
            Some((entries, took.as_secs_f64()));
    }
}

#[derive(Debug, Default)]
struct Totals {
    started: u64,
    completed: u64,
    failed: u64,
    bytes: u64,
    last: Option<CheckpointRecord>,
    positions: Vec<(String, u32, u64)>,
    state: Vec<(String, u64, u64)>,
    restored: Option<(u64, f64)>,
}

impl History {
    /// Adds a record, dropping the oldest beyond [`KEPT`].
    pub(crate) fn push(&self, record: CheckpointRecord) {
        {
            let mut totals = self.totals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            totals.bytes += record.bytes;
            if record.outcome == "completed" {
                totals.completed += 1;
                totals.last = Some(record.clone());
            } else {
                totals.failed += 1;
            }
        }
        let mut records = self.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if records.len() == KEPT {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// What the job's checkpoints have done since it started, as its
    /// instruments report it.
    pub(crate) fn totals(&self) -> crate::metrics::prometheus::CheckpointTotals {
        let totals = self.totals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = unix_ms(SystemTime::now());
        #[expect(clippy::cast_precision_loss, reason = "milliseconds since 1970 are far below 2^53")]
        let age = totals.last.as_ref().map(|l| now.saturating_sub(l.started_unix_ms) as f64 / 1000.0);
        crate::metrics::prometheus::CheckpointTotals {
            started: totals.started,
            completed: totals.completed,
            failed: totals.failed,
            bytes: totals.bytes,
            last_id: totals.last.as_ref().map(|l| l.id),
            last_duration_seconds: totals.last.as_ref().map(|l| l.duration_ms / 1000.0),
            last_age_seconds: age,
            positions: totals.positions.clone(),
            state: totals.state.clone(),
            restored: totals.restored,
        }
    }

    /// The records, oldest first.
    pub(crate) fn records(&self) -> Vec<CheckpointRecord> {
        self.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().cloned().collect()
    }
}

/// Milliseconds since the Unix epoch of `at`.
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis().try_into().unwrap_or(u64::MAX)
}
