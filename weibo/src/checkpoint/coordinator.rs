//! The checkpoint coordinator: triggers checkpoints, collects the tasks'
//! acknowledgements, completes (manifest, commits, retention), takes the
//! final checkpoint at the end of input, and serves savepoints.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use super::manifest::{complete_checkpoints_in, read_manifest_in, write_manifest};
use super::naming::{checkpoint_name, checkpoint_number, written_by};
use super::{
    CheckpointConfig, FORMAT_VERSION, MANIFEST, Manifest, OperatorEntry, SAVEPOINTS, SHARED, SourcePositionEntry,
    StateFileEntry, bad, commit, faults, io, storage,
};
use crate::error::{Error, Result};
use crate::record::CheckpointId;

/// What a task reports when checkpoint `n` has passed it.
#[derive(Debug)]
pub(crate) struct Ack {
    pub(crate) checkpoint: CheckpointId,
    pub(crate) sources: Vec<SourcePositionEntry>,
    pub(crate) states: Vec<StateFileEntry>,
    /// The schemas its state files name, by id.
    pub(crate) schemas: Vec<(String, crate::codec::schema::Schema)>,
    /// Set when the task could not take its part.
    pub(crate) failure: Option<String>,
    /// The task that acknowledges.
    pub(crate) task: String,
}

/// What tasks tell the coordinator.
#[derive(Debug)]
pub(crate) enum TaskEvent {
    /// A task's part in a checkpoint.
    Ack(Ack),
    /// A source task has read all of its input and passed it on; it stays
    /// to pass the barriers of later checkpoints (at its final position)
    /// until the final checkpoint is complete.
    SourceEnded { task: String },
}

/// The coordinator's side of the job: triggers and acknowledgements.
pub(crate) struct Coordinator {
    pub(crate) config: CheckpointConfig,
    pub(crate) job: String,
    pub(crate) fingerprint: String,
    /// The job's keyed operators with state, as manifests record them.
    pub(crate) operators: Vec<OperatorEntry>,
    pub(crate) max_key_groups: u16,
    /// One per source task; dropped when the job is done with
    /// checkpoints, which lets sources at their end stop.
    pub(crate) triggers: Vec<mpsc::UnboundedSender<CheckpointId>>,
    pub(crate) events: mpsc::UnboundedReceiver<TaskEvent>,
    /// How many acknowledgements complete a checkpoint (one per task).
    pub(crate) tasks: usize,
    /// The first checkpoint number to use (after the restored one).
    pub(crate) next: CheckpointId,
    pub(crate) completed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub(crate) commits: commit::TwoPhaseCommits,
    /// Requests for savepoints.
    pub(crate) savepoints: mpsc::UnboundedReceiver<SavepointRequest>,
    /// The last complete checkpoint's manifest, whose chains deltas extend.
    pub(crate) previous: Option<Manifest>,
    /// Every checkpoint attempt, for the admin API.
    pub(crate) history: std::sync::Arc<super::history::History>,
    /// This run's hold on the storage, checked before every manifest and
    /// every commit.
    pub(crate) lease: Option<std::sync::Arc<dyn super::StorageLease>>,
    /// Where the coordinator says that the job must stop: it lost its
    /// storage. The supervisor stops the tasks.
    pub(crate) fatal: Option<tokio::sync::oneshot::Sender<Error>>,
}

/// Why a checkpoint did not complete.
enum Completion {
    /// It failed; the next one is taken as usual.
    Failed(Error),
    /// The run lost its storage: the job stops.
    Fenced(Error),
}

/// A request for a savepoint: a checkpoint now, copied under `name`.
#[derive(Debug)]
pub(crate) struct SavepointRequest {
    /// `None`: a plain checkpoint, now.
    pub(crate) name: Option<String>,
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<PathBuf>>,
}

/// Why a savepoint is refused when one of its name exists.
pub(crate) const SAVEPOINT_EXISTS: &str = "a savepoint of this name exists already: choose another name";

/// Why no checkpoint or savepoint can be taken once every source has
/// reached its end (the final checkpoint is, or was, being taken).
pub(crate) const ALL_SOURCES_ENDED: &str =
    "every source has reached the end of its input: the job is finishing with its final checkpoint, and takes no other";

/// How a checkpoint attempt ended.
pub(super) enum Outcome {
    Complete,
    /// Abandoned or failed, with the reason.
    Failed(String),
    /// The job is ending: stop.
    Stopped,
    /// The run lost its storage: the job stops with this error.
    Fenced(Error),
}

impl Coordinator {
    /// Triggers checkpoints until the job ends, then takes the final one.
    ///
    /// Every task of the job takes part in every checkpoint: a source that
    /// has reached its end stays to pass barriers at its final position,
    /// and an operator whose inputs have all ended has finished (fired
    /// its windows, flushed its sinks) and passes barriers with the state
    /// it was left with. Once every source has reported its end, the
    /// coordinator takes the **final checkpoint** at once (after the one
    /// in flight, if any): its barriers follow all of the job's records,
    /// so its manifest covers everything the job wrote, and its
    /// completion commits every epoch the exactly-once sinks still hold.
    /// Only then does it let the sources go, and the job end. A restart
    /// of a finished job restores the final checkpoint: nothing to read
    /// again, nothing written twice.
    ///
    /// A final checkpoint that fails is taken again soon (after 200 ms,
    /// doubling up to the interval or 5 s), until it has failed three
    /// times and the checkpoint timeout has passed since the first
    /// attempt; then the job fails with the reason (its output after the last complete
    /// checkpoint stays uncommitted, and a restart writes it again).
    pub(crate) async fn run(mut self, mut stop: tokio::sync::oneshot::Receiver<()>) -> Result<()> {
        let mut ticker = tokio::time::interval(self.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut n = self.next;
        let sources = self.triggers.len();
        let mut ended: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        // The first attempt at the final checkpoint, and why the last failed.
        let mut final_started: Option<tokio::time::Instant> = None;
        let mut final_failure = String::new();
        let mut final_failures = 0u32;
        let mut final_backoff = Duration::from_millis(100);
        let timeout = self.config.timeout.unwrap_or_else(|| (self.config.interval * 10).max(Duration::from_secs(60)));
        let mut savepoints_open = true;
        loop {
            // Ends reported since the last checkpoint's acknowledgements
            // (while it wrote its manifest and committed) come first: after
            // a checkpoint longer than the interval the tick is ready too,
            // and a regular checkpoint taken then would hold the input's
            // last records, leaving the final one with none of them.
            while let Ok(event) = self.events.try_recv() {
                if let TaskEvent::SourceEnded { task } = event {
                    ended.insert(task);
                }
            }
            let all_ended = ended.len() >= sources;
            if all_ended && final_failures >= 3 && final_started.is_some_and(|t| t.elapsed() >= timeout) {
                return Err(self.final_failed(&final_failure));
            }
            // What starts the next checkpoint: the interval, a savepoint
            // request, or every source having ended (the final one, at
            // once). After a failed final checkpoint, the next attempt
            // comes soon (200 ms, doubling, at most the interval or 5 s),
            // not at the next interval: the job is waiting for it to end.
            let retry = tokio::time::sleep(final_backoff);
            let savepoint = if all_ended && final_started.is_none() {
                None
            } else {
                tokio::select! {
                    _ = &mut stop => return Ok(()),
                    _ = ticker.tick(), if !all_ended => None,
                    () = retry, if all_ended => None,
                    request = self.savepoints.recv(), if savepoints_open => match request {
                        Some(request) if all_ended => {
                            let _ = request.reply.send(Err(Error::Refused { job: self.job.clone(), message: ALL_SOURCES_ENDED.into() }));
                            continue;
                        }
                        Some(request) => match request.name.as_deref().map(|name| self.savepoint_taken(name)) {
                            // Refused before a checkpoint is taken for it.
                            Some(Err(e)) => {
                                let _ = request.reply.send(Err(e));
                                continue;
                            }
                            _ => Some(request),
                        },
                        None => {
                            savepoints_open = false;
                            continue;
                        }
                    },
                    event = self.events.recv() => {
                        match event {
                            Some(TaskEvent::SourceEnded { task }) => {
                                ended.insert(task);
                            }
                            // Late parts of an abandoned checkpoint.
                            Some(TaskEvent::Ack(_)) => {}
                            None => return Ok(()),
                        }
                        continue;
                    }
                }
            };
            let is_final = ended.len() >= sources;
            if is_final && final_started.is_none() {
                final_started = Some(tokio::time::Instant::now());
                tracing::info!(job = %self.job, checkpoint = n.get(), "every source has reached its end: taking the final checkpoint");
            }
            let mut triggered = false;
            for t in &self.triggers {
                triggered |= t.send(n).is_ok();
            }
            if !triggered {
                // The sources are gone: the job is failing or cancelled.
                if let Some(request) = savepoint {
                    let _ = request.reply.send(Err(Error::Refused {
                        job: self.job.clone(),
                        message: "the job's sources have stopped".into(),
                    }));
                }
                return Ok(());
            }
            if is_final {
                faults::point("final-barrier");
            }
            let triggered_at = (std::time::SystemTime::now(), std::time::Instant::now());
            let kind = match (savepoint.as_ref().and_then(|r| r.name.as_deref()), is_final) {
                (Some(_), _) => "savepoint",
                (None, true) => "final",
                (None, false) => "checkpoint",
            };
            let span = tracing::info_span!("checkpoint", job = %self.job, checkpoint = n.get(), kind);
            let outcome = {
                use tracing::Instrument as _;
                self.take(n, is_final, timeout, &mut ended, &mut stop).instrument(span.clone()).await
            };
            let in_checkpoint = span.enter();
            let reply = match &outcome {
                Outcome::Complete => match savepoint.as_ref().and_then(|r| r.name.clone()) {
                    Some(name) => self.copy_to_savepoint(n, &name),
                    None => Ok(self.config.storage.locate(&checkpoint_name(n))),
                },
                Outcome::Failed(why) => Err(Error::Checkpoint {
                    path: self.config.storage.locate(&checkpoint_name(n)),
                    message: why.clone(),
                    source: None,
                }),
                Outcome::Stopped => Err(Error::Refused {
                    job: self.job.clone(),
                    message: "the job stopped before the checkpoint completed".into(),
                }),
                Outcome::Fenced(e) => Err(Error::Checkpoint {
                    path: self.config.storage.locate(&checkpoint_name(n)),
                    message: e.report().to_string(),
                    source: None,
                }),
            };
            let name = savepoint.as_ref().and_then(|r| r.name.clone());
            self.record(n, is_final, name, triggered_at, &outcome, reply.as_ref().err());
            if let Some(request) = savepoint {
                let _ = request.reply.send(reply);
            }
            drop(in_checkpoint);
            match outcome {
                Outcome::Stopped => return Ok(()),
                Outcome::Fenced(e) => {
                    tracing::error!(job = %self.job, checkpoint = n.get(), error = %e.report(), "the job lost its checkpoint storage: stopping");
                    // The supervisor stops the tasks with it (and reports it).
                    return match self.fatal.take() {
                        Some(fatal) => fatal.send(e),
                        None => Err(e),
                    };
                }
                Outcome::Complete if is_final => {
                    let committed = self.commit_leftovers(n).await;
                    // Requests that came meanwhile: the job is done.
                    while let Ok(request) = self.savepoints.try_recv() {
                        let _ = request
                            .reply
                            .send(Err(Error::Refused { job: self.job.clone(), message: ALL_SOURCES_ENDED.into() }));
                    }
                    committed?;
                    tracing::info!(job = %self.job, checkpoint = n.get(), "final checkpoint complete");
                    return Ok(());
                }
                Outcome::Complete => {}
                Outcome::Failed(why) => {
                    if is_final {
                        tracing::warn!(job = %self.job, checkpoint = n.get(), reason = %why, "the final checkpoint failed; taking it again");
                        final_failure = why;
                        final_failures += 1;
                        final_backoff = (final_backoff * 2).min(self.config.interval.min(Duration::from_secs(5)));
                    }
                }
            }
            n = n.next();
        }
    }

    /// Records checkpoint `n`'s attempt in the history.
    fn record(
        &self,
        n: CheckpointId,
        is_final: bool,
        savepoint: Option<String>,
        (at, started): (std::time::SystemTime, std::time::Instant),
        outcome: &Outcome,
        reply: Option<&Error>,
    ) {
        let (outcome, error) = match (outcome, reply) {
            // A savepoint whose copy failed: its checkpoint completed, the
            // savepoint did not.
            (Outcome::Complete, Some(e)) => ("failed", Some(e.report().to_string())),
            (Outcome::Complete, None) => ("completed", None),
            (Outcome::Failed(why), _) => ("failed", Some(why.clone())),
            (Outcome::Fenced(e), _) => ("failed", Some(e.report().to_string())),
            (Outcome::Stopped, _) => return,
        };
        let bytes = match (outcome, &self.previous) {
            // The files this checkpoint wrote, not those it carried.
            ("completed", Some(m)) if m.checkpoint == n => {
                self.history.positions(m.sources.iter().map(|s| (s.source.clone(), s.partition, s.position)).collect());
                let mut sizes: Vec<(String, u64, u64)> = Vec::new();
                for file in &m.states {
                    let size = file.bytes.unwrap_or(0);
                    match sizes.iter_mut().find(|(op, _, _)| *op == file.operator) {
                        Some(entry) => {
                            entry.1 += size;
                            entry.2 += 1;
                        }
                        None => sizes.push((file.operator.clone(), size, 1)),
                    }
                }
                self.history.state_sizes(sizes);
                m.states.iter().filter(|s| s.checkpoint == n).filter_map(|s| s.bytes).sum()
            }
            _ => 0,
        };
        let kind = match (&savepoint, is_final) {
            (Some(_), _) => "savepoint",
            (None, true) => "final",
            (None, false) => "checkpoint",
        };
        self.history.push(super::history::CheckpointRecord {
            id: n.get(),
            kind,
            savepoint,
            started_unix_ms: super::history::unix_ms(at),
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            bytes,
            outcome,
            error,
        });
    }

    /// Collects every task's part in checkpoint `n` and completes it.
    async fn take(
        &mut self,
        n: CheckpointId,
        is_final: bool,
        timeout: Duration,
        ended: &mut std::collections::BTreeSet<String>,
        stop: &mut tokio::sync::oneshot::Receiver<()>,
    ) -> Outcome {
        self.history.started();
        let mut acks: BTreeMap<String, Ack> = BTreeMap::new();
        // A checkpoint that cannot complete in time (a task stuck in user
        // code, a task that failed to take its part) is abandoned.
        let deadline = tokio::time::Instant::now() + timeout;
        // Every task's part: its inputs' barriers aligned, its state exported.
        let acknowledging = tracing::info_span!("checkpoint.acknowledge", tasks = self.tasks);
        let stopped = {
            use tracing::Instrument as _;
            let (events, tasks) = (&mut self.events, self.tasks);
            async {
                while acks.len() < tasks {
                    let event = tokio::select! {
                        _ = &mut *stop => return true,
                        () = tokio::time::sleep_until(deadline) => break,
                        event = events.recv() => event,
                    };
                    match event {
                        Some(TaskEvent::Ack(ack)) if ack.checkpoint == n => {
                            acks.insert(ack.task.clone(), ack);
                        }
                        Some(TaskEvent::Ack(_)) => {}
                        Some(TaskEvent::SourceEnded { task }) => {
                            ended.insert(task);
                        }
                        None => return true,
                    }
                }
                false
            }
            .instrument(acknowledging)
            .await
        };
        if stopped {
            return Outcome::Stopped;
        }
        if acks.len() < self.tasks {
            let missing = self.tasks - acks.len();
            tracing::warn!(job = %self.job, checkpoint = n.get(), missing, "checkpoint abandoned: not every task acknowledged in time");
            return Outcome::Failed(format!(
                "checkpoint {n} did not complete in time: abandoned after {timeout:?}, with {missing} of {} tasks yet to take their part",
                self.tasks
            ));
        }
        match self.complete(n, acks.into_values().collect(), is_final) {
            Ok(()) => {
                self.completed.store(n.get(), std::sync::atomic::Ordering::Relaxed);
                tracing::info!(job = %self.job, checkpoint = n.get(), "checkpoint complete");
                Outcome::Complete
            }
            Err(Completion::Fenced(e)) => Outcome::Fenced(e),
            Err(Completion::Failed(e)) => {
                tracing::warn!(job = %self.job, checkpoint = n.get(), error = %e.report(), "checkpoint failed");
                Outcome::Failed(e.report().to_string())
            }
        }
    }

    /// After the final checkpoint `n`: commits that failed with it are
    /// tried a few more times (there is no later checkpoint to carry them);
    /// if they still fail, the job fails, and its next start commits them
    /// (they are in the final checkpoint's manifest).
    async fn commit_leftovers(&mut self, n: CheckpointId) -> Result<()> {
        if self.commits.owes()
            && let Err(Completion::Fenced(e) | Completion::Failed(e)) = self.check_lease()
        {
            // Owed commits wait for the job's next start.
            return Err(e);
        }
        match self.commits.retry_leftovers().await {
            None => Ok(()),
            Some((entry, owed, why)) => Err(Error::Checkpoint {
                path: self.config.storage.locate(&checkpoint_name(n)),
                message: format!(
                    "the final checkpoint is complete, but sink `{}` could not commit `{}` (and {} more): the job's next start commits them; the last failure: {why}",
                    entry.sink,
                    entry.handle,
                    owed - 1
                ),
                source: None,
            }),
        }
    }

    fn final_failed(&self, why: &str) -> Error {
        let last = self.completed.load(std::sync::atomic::Ordering::Relaxed);
        Error::Checkpoint {
            path: self.config.storage.locate(""),
            message: format!(
                "the final checkpoint of job `{}` did not complete ({why}): what the job wrote after checkpoint {last} is not committed; a restart restores checkpoint {last} and writes it again",
                self.job
            ),
            source: None,
        }
    }

    /// Checks that this run still holds its storage.
    fn check_lease(&self) -> std::result::Result<(), Completion> {
        let Some(lease) = &self.lease else { return Ok(()) };
        crate::task::blocking(|| lease.check()).map_err(|e| match e {
            super::LeaseError::Lost(why) => Completion::Fenced(super::fenced(&*self.config.storage, why)),
            other => Completion::Failed(Error::Checkpoint {
                path: self.config.storage.locate(""),
                message: "the checkpoint is not completed".into(),
                source: Some(other.into()),
            }),
        })
    }

    fn complete(&mut self, n: CheckpointId, acks: Vec<Ack>, is_final: bool) -> std::result::Result<(), Completion> {
        let name = checkpoint_name(n);
        let dir = self.config.storage.locate(&name);
        let mut sources = Vec::new();
        let mut states = Vec::new();
        let mut schemas = BTreeMap::new();
        for ack in acks {
            if let Some(failure) = ack.failure {
                return Err(Completion::Failed(bad(&dir, failure)));
            }
            sources.extend(ack.sources);
            states.extend(ack.states);
            schemas.extend(ack.schemas);
        }
        // A delta continues its chain: keep the files of the previous
        // checkpoint's chain for the same state and key groups.
        if let Some(previous) = &self.previous {
            let carried: Vec<StateFileEntry> = previous
                .states
                .iter()
                .filter(|p| {
                    states.iter().any(|s| {
                        !s.base && s.operator == p.operator && s.state == p.state && s.key_groups == p.key_groups
                    })
                })
                .cloned()
                .collect();
            for id in carried.iter().filter_map(|c| c.schema.as_ref()) {
                if let Some(schema) = previous.schemas.get(id) {
                    schemas.entry(id.clone()).or_insert_with(|| schema.clone());
                }
            }
            states.extend(carried);
        }
        // A delta without its chain would restore only what changed.
        for s in states.iter().filter(|s| !s.base) {
            let chained = states.iter().any(|b| {
                b.base
                    && b.operator == s.operator
                    && b.state == s.state
                    && b.key_groups == s.key_groups
                    && b.checkpoint < s.checkpoint
            });
            if !chained {
                return Err(Completion::Failed(bad(
                    &dir,
                    format!(
                        "the delta {} of `{}`/{} has no base in the previous checkpoint to build on",
                        s.file, s.operator, s.state
                    ),
                )));
            }
        }
        sources.sort_by(|a, b| (&a.source, a.partition).cmp(&(&b.source, b.partition)));
        states.sort_by(|a, b| {
            (&a.operator, &a.state, a.key_groups, a.checkpoint).cmp(&(
                &b.operator,
                &b.state,
                b.key_groups,
                b.checkpoint,
            ))
        });
        let commits = self.commits.collect(n);
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            job: self.job.clone(),
            checkpoint: n,
            graph_fingerprint: self.fingerprint.clone(),
            max_key_groups: self.max_key_groups,
            operators: self.operators.clone(),
            sources,
            states,
            schemas,
            commits: commits.entries.clone(),
        };
        // A run that lost its storage completes nothing.
        if let Err(fenced) = self.check_lease() {
            self.commits.keep(commits);
            return Err(fenced);
        }
        let written = crate::task::blocking(|| {
            let _manifest = tracing::info_span!("checkpoint.manifest", states = manifest.states.len()).entered();
            write_manifest(&*self.config.storage, &name, &manifest)
        });
        if let Err(e) = written {
            // Not complete: its transactions (and those carried from
            // before) are committed with the next checkpoint that is.
            self.commits.keep(commits);
            return Err(Completion::Failed(e));
        }
        faults::point(if is_final { "after-final-manifest" } else { "after-manifest" });
        let positions = manifest.sources.clone();
        self.previous = Some(manifest);
        // Complete, but a run that lost its storage meanwhile commits
        // nothing: the run that took it commits the manifest's handles
        // when it restores this checkpoint. A run that cannot tell now
        // commits them with the next checkpoint, which asks again.
        match self.check_lease() {
            Ok(()) => {}
            Err(Completion::Failed(e)) => {
                tracing::warn!(job = %self.job, checkpoint = n.get(), error = %e.report(), "checkpoint complete; its commits wait for the next checkpoint");
                self.commits.keep(commits);
                return Ok(());
            }
            Err(fenced) => return Err(fenced),
        }
        // The checkpoint is complete: now the sinks may show its records.
        // Commits wait on external systems: off the runtime's workers.
        crate::task::blocking(|| {
            let _commit = tracing::info_span!("checkpoint.commit", transactions = commits.entries.len()).entered();
            let count = self.commits.commit_completed(commits, &positions, || {
                faults::point(if is_final { "between-final-commits" } else { "between-commits" });
            });
            if count > 0 {
                faults::point("after-commits");
            }
            if let Err(e) = self.retain(n) {
                tracing::warn!(job = %self.job, error = %e.report(), "cannot delete old checkpoints; tried again after the next one");
            }
        });
        Ok(())
    }

    /// Copies complete checkpoint `n` to `savepoints/<name>`, outside
    /// retention (the manifest last, so a half-copied savepoint is not one).
    /// `Err` if a savepoint named `name` exists already.
    fn savepoint_taken(&self, name: &str) -> Result<()> {
        let storage = &*self.config.storage;
        let to = storage::join(SAVEPOINTS, name);
        let manifest_name = storage::join(&to, MANIFEST);
        let taken = crate::task::blocking(|| storage.exists(&manifest_name))
            .map_err(io("cannot read checkpoint storage", storage.locate(&manifest_name)))?;
        if taken {
            return Err(bad(&storage.locate(&to), SAVEPOINT_EXISTS.into()));
        }
        Ok(())
    }

    fn copy_to_savepoint(&self, n: CheckpointId, name: &str) -> Result<PathBuf> {
        if let Err(Completion::Fenced(e) | Completion::Failed(e)) = self.check_lease() {
            return Err(e);
        }
        let storage = &*self.config.storage;
        let from = checkpoint_name(n);
        let to = storage::join(SAVEPOINTS, name);
        let manifest_name = storage::join(&to, MANIFEST);
        crate::task::blocking(|| {
            let taken = storage
                .exists(&manifest_name)
                .map_err(io("cannot read checkpoint storage", storage.locate(&manifest_name)))?;
            if taken {
                return Err(bad(&storage.locate(&to), SAVEPOINT_EXISTS.into()));
            }
            let mut manifest = read_manifest_in(storage, &from)?;
            for s in &mut manifest.states {
                let source = storage::join(&from, &s.file);
                let file = source.rsplit('/').next().unwrap_or_default().to_string();
                let target = storage::join(&to, &file);
                // A copy left by an earlier attempt that failed before its
                // manifest: no savepoint refers to it.
                storage.delete(&target).map_err(io("cannot copy into savepoint", storage.locate(&target)))?;
                storage.copy(&source, &target).map_err(io("cannot copy into savepoint", storage.locate(&target)))?;
                s.file = file;
            }
            write_manifest(storage, &to, &manifest)
        })?;
        let located = storage.locate(&to);
        tracing::info!(job = %self.job, savepoint = %located.display(), checkpoint = n.get(), "savepoint taken");
        Ok(located)
    }

    /// Deletes all but the newest `retain` complete checkpoints, and any
    /// older incomplete ones, and the state files no kept checkpoint
    /// refers to.
    fn retain(&self, newest: CheckpointId) -> Result<()> {
        let storage = &*self.config.storage;
        let list = |prefix: &str| storage.list(prefix).map_err(io("cannot list checkpoints", storage.locate(prefix)));
        let complete = complete_checkpoints_in(storage, "")?;
        let keep: Vec<CheckpointId> = complete.iter().take(self.config.retain.max(1)).map(|(n, _)| *n).collect();
        let oldest_kept = keep.last().copied().unwrap_or(newest);
        // What the kept checkpoints refer to, read before anything is
        // deleted: without knowing it, delete nothing.
        let mut referenced = std::collections::HashSet::new();
        for (_, dir) in complete.iter().filter(|(n, _)| keep.contains(n)) {
            let m = read_manifest_in(storage, dir)?;
            referenced.extend(m.states.into_iter().map(|s| storage::join(dir, &s.file)));
        }
        // The checkpoint just completed, even if a listing does not show
        // its manifest yet.
        if let Some(m) = &self.previous {
            let dir = checkpoint_name(m.checkpoint);
            referenced.extend(m.states.iter().map(|s| storage::join(&dir, &s.file)));
        }
        for name in list("chk-")? {
            let n = name.split('/').next().and_then(checkpoint_number);
            if n.is_some_and(|n| n < oldest_kept && !keep.contains(&n)) {
                storage.delete(&name).map_err(io("cannot delete old checkpoint", storage.locate(&name)))?;
            }
        }
        // State files up to the newest complete checkpoint (newer ones
        // belong to checkpoints in flight).
        for name in list(&format!("{SHARED}/"))? {
            if written_by(&name).is_some_and(|w| w <= newest) && !referenced.contains(&name) {
                storage.delete(&name).map_err(io("cannot delete old state file", storage.locate(&name)))?;
            }
        }
        Ok(())
    }
}
