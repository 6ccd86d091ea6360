//! The two-phase-commit lifecycle of exactly-once sinks, in one place.
//!
//! 1. **Register**: the typed DSL registers each exactly-once sink's
//!    [`Committer`] with the job ([`TwoPhaseCommits::register`]).
//! 2. **Pre-commit**: at barrier `n` each writer pre-commits its epoch and
//!    leaves the handle in the sink's [`Prepared`] (`sinks::txn`).
//! 3. **Commit on completion**: the coordinator collects the handles of
//!    checkpoint `n` into its manifest ([`TwoPhaseCommits::collect`]);
//!    once the manifest is published it commits them
//!    ([`TwoPhaseCommits::commit_completed`]). A commit that fails is kept
//!    and tried again with the next checkpoint, or, after the final one,
//!    a few more times ([`TwoPhaseCommits::retry_leftovers`]).
//! 4. **Re-commit on restore**: before anything runs, a restored job
//!    commits the handles of the checkpoint it restores (again: commits
//!    are idempotent) and discards whatever was pre-committed after it
//!    ([`TwoPhaseCommits::on_restore`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Result;
use crate::record::CheckpointId;

use super::{CommitEntry, SourcePositionEntry};

/// Pre-committed handles by checkpoint, shared between a sink's writers and
/// its [`Committer`].
#[derive(Default)]
pub(crate) struct Prepared {
    pub(crate) by_checkpoint: Mutex<BTreeMap<CheckpointId, Vec<String>>>,
}

/// What the coordinator needs of an exactly-once sink.
pub(crate) trait Committer: Send + Sync {
    /// Takes the handles pre-committed for checkpoints up to `n`.
    fn take_prepared(&self, n: CheckpointId) -> Vec<String>;
    /// Commits `handle`, with the sources' positions of the checkpoint it
    /// belongs to (empty when they are not this commit's to claim).
    fn commit(&self, handle: &str, sources: &[SourcePositionEntry]) -> Result<()>;
    /// Whether the sink records the positions with its records: then it
    /// gets all of a checkpoint's handles at once ([`Committer::commit_all`]).
    fn together(&self) -> bool;
    /// Commits `handles` at once with the sources' positions `sources`.
    fn commit_all(&self, handles: &[String], sources: &[SourcePositionEntry]) -> Result<()>;
    /// Commits the handles of the checkpoint a job restores (not one that
    /// commits positions: those go through [`Committer::commit_all`]).
    fn commit_restored(&self, handles: &[String]) -> Result<()>;
    /// Discards everything pre-committed after `checkpoint`; returns how
    /// many transactions that was, as far as the sink can tell.
    fn abort_after(&self, checkpoint: CheckpointId) -> Result<u64>;
}

/// An exactly-once sink of the job: its node, its id (known once the
/// graph is complete: [`TwoPhaseCommits::bind`]) and its committer.
#[derive(Clone)]
struct Registered {
    node: usize,
    id: String,
    committer: Arc<dyn Committer>,
    /// Its transactions' counters (known once the job starts: `count_into`).
    counters: Arc<crate::metrics::SinkCounters>,
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Committer(#{} `{}`)", self.node, self.id)
    }
}

/// The exactly-once sinks of a job and the commits still owed.
#[derive(Clone, Debug, Default)]
pub(crate) struct TwoPhaseCommits {
    committers: Vec<Registered>,
    /// Handles of complete checkpoints whose commit failed: tried again
    /// with the next checkpoint.
    uncommitted: Vec<CommitEntry>,
    /// The error of the last commit that failed, for the job's error when
    /// commits are still owed at the end.
    last_error: Option<String>,
    /// The positions of the newest complete checkpoint, for sinks that
    /// commit them with their records ([`Committer::together`]) and whose
    /// commit is owed: what they commit with after the final checkpoint.
    owed_positions: Vec<SourcePositionEntry>,
}

/// One call to a committer: a handle on its own, or (for a sink that
/// commits positions) all of a sink's handles of a checkpoint.
struct Unit<'a> {
    sink: &'a Registered,
    entries: Vec<CommitEntry>,
}

/// Groups `entries` into calls, in the order their sinks first appear.
fn units(committers: &[Registered], entries: Vec<CommitEntry>) -> Vec<Unit<'_>> {
    let mut units: Vec<Unit<'_>> = Vec::new();
    for entry in entries {
        let Some(c) = committers.iter().find(|c| c.id == entry.sink) else { continue };
        if c.committer.together()
            && let Some(u) = units.iter_mut().find(|u| u.sink.id == c.id)
        {
            u.entries.push(entry);
            continue;
        }
        units.push(Unit { sink: c, entries: vec![entry] });
    }
    units
}

/// The commits of one checkpoint: its own handles and those carried over.
pub(crate) struct CheckpointCommits {
    pub(crate) entries: Vec<CommitEntry>,
    /// The ones carried from earlier checkpoints.
    retried: Vec<CommitEntry>,
}

impl TwoPhaseCommits {
    /// Step 1: an exactly-once sink (graph node `node`) joins the job.
    pub(crate) fn register(&mut self, node: usize, committer: Arc<dyn Committer>) {
        self.committers.push(Registered { node, id: String::new(), committer, counters: Arc::default() });
    }

    /// Names each sink by its node's id (`id_of`), which manifests file
    /// its commits under: called when the job starts, since an id may be
    /// set after the sink joined.
    pub(crate) fn bind(&mut self, id_of: impl Fn(usize) -> Option<String>) {
        for r in &mut self.committers {
            r.id = id_of(r.node).unwrap_or_else(|| format!("#{}", r.node));
        }
    }

    /// Counts each sink's transactions in `registry` (after `bind`).
    pub(crate) fn count_into(&mut self, registry: &crate::metrics::Registry) {
        for r in &mut self.committers {
            r.counters = registry.sink(&r.id);
        }
    }

    /// The ids of the sinks that commit the sources' positions with their
    /// records (which need checkpoints to know them), and of the other
    /// exactly-once sinks.
    pub(crate) fn by_positions(&self) -> (Vec<&str>, Vec<&str>) {
        let (with, without): (Vec<&Registered>, Vec<&Registered>) =
            self.committers.iter().partition(|c| c.committer.together());
        (with.iter().map(|c| c.id.as_str()).collect(), without.iter().map(|c| c.id.as_str()).collect())
    }

    /// Step 4: finishes what the restored checkpoint committed and drops
    /// what came after it. `commits` and `positions` are the restored
    /// manifest's.
    pub(crate) fn on_restore(
        &self,
        restored: Option<(CheckpointId, &[CommitEntry], &[SourcePositionEntry])>,
    ) -> Result<()> {
        let (checkpoint, commits, positions) = restored.unwrap_or((CheckpointId::NONE, &[], &[]));
        for c in &self.committers {
            let mine = commits.iter().filter(|e| e.sink == c.id);
            if c.committer.together() {
                let handles: Vec<String> = mine.map(|e| e.handle.clone()).collect();
                if !handles.is_empty() {
                    c.committer.commit_all(&handles, positions)?;
                }
            } else {
                let handles: Vec<String> = mine.map(|e| e.handle.clone()).collect();
                if !handles.is_empty() {
                    c.committer.commit_restored(&handles)?;
                }
            }
            let aborted = c.committer.abort_after(checkpoint)?;
            c.counters.aborted.fetch_add(aborted, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Step 3, first half: what checkpoint `n`'s manifest records.
    pub(crate) fn collect(&mut self, n: CheckpointId) -> CheckpointCommits {
        let mut entries = std::mem::take(&mut self.uncommitted);
        let retried = entries.clone();
        for c in &self.committers {
            entries.extend(
                c.committer.take_prepared(n).into_iter().map(|handle| CommitEntry { sink: c.id.clone(), handle }),
            );
        }
        CheckpointCommits { entries, retried }
    }

    /// The manifest that would have recorded `collected` was not written:
    /// the handles go with the next checkpoint that is complete.
    pub(crate) fn keep(&mut self, collected: CheckpointCommits) {
        self.uncommitted = collected.entries;
    }

    /// Step 3, second half: the checkpoint is complete, so the sinks may
    /// show its records. `positions` are its sources' positions: only the
    /// checkpoint's own handles go with them (a commit retried from an
    /// earlier one must not claim more). `between` runs between two
    /// commits (a fault-injection point). Blocks: call it off the
    /// runtime's workers.
    pub(crate) fn commit_completed(
        &mut self,
        collected: CheckpointCommits,
        positions: &[SourcePositionEntry],
        mut between: impl FnMut(),
    ) -> usize {
        let count = collected.entries.len();
        let mut owed = Vec::new();
        let mut failed = None;
        for (i, unit) in units(&self.committers, collected.entries).into_iter().enumerate() {
            if i > 0 {
                between();
            }
            let c = unit.sink;
            let result = if c.committer.together() {
                let handles: Vec<String> = unit.entries.iter().map(|e| e.handle.clone()).collect();
                let _commit =
                    tracing::info_span!("transaction.commit", sink = %c.id, handles = handles.len()).entered();
                let started = std::time::Instant::now();
                let result = c.committer.commit_all(&handles, positions);
                count_commit(&c.counters, started, result.is_ok());
                result
            } else {
                let Some(entry) = unit.entries.first() else { continue };
                let fresh = !collected.retried.contains(entry);
                let _commit = tracing::info_span!("transaction.commit", sink = %entry.sink, handle = %entry.handle, retried = !fresh)
                    .entered();
                let started = std::time::Instant::now();
                let result = c.committer.commit(&entry.handle, if fresh { positions } else { &[] });
                count_commit(&c.counters, started, result.is_ok());
                result
            };
            if let Err(e) = result {
                tracing::warn!(sink = %c.id, transactions = unit.entries.len(), error = %e.report(), "commit failed; retried with the next checkpoint");
                failed = Some(e.report().to_string());
                owed.extend(unit.entries);
            }
        }
        if let Some(e) = failed {
            self.last_error = Some(e);
        }
        self.uncommitted.extend(owed);
        self.owed_positions = positions.to_vec();
        count
    }

    /// Whether commits of complete checkpoints are still owed.
    pub(crate) fn owes(&self) -> bool {
        !self.uncommitted.is_empty()
    }

    /// After the final checkpoint: commits that failed with it are tried
    /// a few more times (there is no later checkpoint to carry them).
    /// Returns the first still owed, how many are, and the last error.
    pub(crate) async fn retry_leftovers(&mut self) -> Option<(CommitEntry, usize, String)> {
        let mut pause = Duration::from_millis(200);
        for attempt in 1..=5 {
            if self.uncommitted.is_empty() {
                return None;
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
            let entries = std::mem::take(&mut self.uncommitted);
            crate::task::blocking(|| {
                let mut owed = Vec::new();
                for unit in units(&self.committers, entries) {
                    let c = unit.sink;
                    let handles: Vec<String> = unit.entries.iter().map(|e| e.handle.clone()).collect();
                    let started = std::time::Instant::now();
                    let result = if c.committer.together() {
                        c.committer.commit_all(&handles, &self.owed_positions)
                    } else {
                        handles.iter().try_for_each(|h| c.committer.commit(h, &[]))
                    };
                    count_commit(&c.counters, started, result.is_ok());
                    if let Err(e) = result {
                        tracing::warn!(sink = %c.id, transactions = handles.len(), attempt, error = %e.report(), "commit after the final checkpoint failed; trying again");
                        self.last_error = Some(e.report().to_string());
                        owed.extend(unit.entries);
                    }
                }
                self.uncommitted.extend(owed);
            });
        }
        let why = self.last_error.clone().unwrap_or_default();
        self.uncommitted.first().cloned().map(|e| (e, self.uncommitted.len(), why))
    }
}

/// Counts a commit that started at `started`.
fn count_commit(counters: &crate::metrics::SinkCounters, started: std::time::Instant, ok: bool) {
    use std::sync::atomic::Ordering::Relaxed;
    let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counters.commit_nanos.fetch_add(nanos, Relaxed);
    let counter = if ok { &counters.committed } else { &counters.failed };
    counter.fetch_add(1, Relaxed);
}
