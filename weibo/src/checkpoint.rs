//! Checkpoints: consistent snapshots of source positions and keyed state,
//! taken with barriers that flow through the job in-band.
//!
//! Every `interval`, the coordinator asks each source partition for
//! checkpoint `n`. A source records its position and sends `Barrier(n)`
//! after the records before it. A keyed operator instance that receives
//! `Barrier(n)` on an input stops reading that input until the barrier has
//! come on all of them (alignment), then exports its state, forwards the
//! barrier and goes on; its state files are written in the background. When
//! every task has acknowledged `n`, the coordinator writes the checkpoint's
//! manifest, atomically (write, sync, rename): only then is the checkpoint
//! complete, and only complete checkpoints are restored from.
//!
//! Layout of the checkpoint directory:
//!
//! ```text
//! <dir>/chk-00000000000000000007/MANIFEST   JSON: positions, state files, fingerprint, commits
//! <dir>/shared/<operator>-<instance>-<state>-<checkpoint>.state
//! <dir>/savepoints/<name>/                 a manifest and copies of its state files
//! ```
//!
//! State files are shared between checkpoints: value state is written
//! incrementally (a base every few checkpoints, deltas between), and a
//! manifest lists each state's chain of files.
//!
//! A state file is a 32-byte header — magic `WEIBOSTA`, format version (u32
//! LE), reserved (u32), payload length (u64 LE), xxh3-64 of the payload (u64
//! LE) — followed by an rkyv archive of [`StateFile`], read back into an
//! aligned buffer and validated before use.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::error::{Error, Result};

/// The version of the manifest and state-file formats this build writes
/// and reads.
pub const FORMAT_VERSION: u32 = 1;

const MAGIC: &[u8; 8] = b"WEIBOSTA";
const HEADER: usize = 32;

/// (key, value) pairs of one key group, encoded.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Entries of one key group: encoded key → encoded value.
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct GroupEntries {
    /// The key group.
    pub group: u16,
    /// (key, value) pairs.
    pub entries: Pairs,
}

/// One operator instance's state, as stored in a checkpoint.
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct StateFile {
    /// The operator's name.
    pub operator: String,
    /// The state's name within the operator.
    pub state: String,
    /// The codec identity of the values (checked on restore).
    pub codec: String,
    /// The entries, by key group, in key-group order.
    pub groups: Vec<GroupEntries>,
    /// In a delta file: keys removed since the previous file of the chain.
    pub removed: Vec<GroupKeys>,
}

/// Keys of one key group.
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct GroupKeys {
    /// The key group.
    pub group: u16,
    /// Encoded keys.
    pub keys: Vec<Vec<u8>>,
}

/// The directory, beside the checkpoints, that holds their state files.
pub const SHARED: &str = "shared";

/// A source partition's position in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePositionEntry {
    /// The source's name.
    pub source: String,
    /// The partition.
    pub partition: u32,
    /// Where reading resumes.
    pub position: u64,
}

/// A state file in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFileEntry {
    /// The operator's name.
    pub operator: String,
    /// The state's name.
    pub state: String,
    /// The file, relative to the checkpoint's directory.
    pub file: String,
    /// The key groups it holds, `[start, end)`.
    pub key_groups: (u16, u16),
    /// The checkpoint that wrote it.
    pub checkpoint: u64,
    /// Whether it holds all of its key groups' entries (a base), or the
    /// changes since the previous file of its chain (a delta). Restore
    /// applies a chain in checkpoint order: the newest base, then deltas.
    pub base: bool,
}

/// What a complete checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] of the build that wrote it.
    pub format_version: u32,
    /// The job's name.
    pub job: String,
    /// The checkpoint's number.
    pub checkpoint: u64,
    /// A hash of the job's operators and types (not their parallelism):
    /// a checkpoint restores only into the same pipeline.
    pub graph_fingerprint: String,
    /// The job's number of key groups.
    pub max_key_groups: u16,
    /// Every source partition's position.
    pub sources: Vec<SourcePositionEntry>,
    /// Every state file.
    pub states: Vec<StateFileEntry>,
    /// Exactly-once sink transactions this checkpoint commits (committed
    /// again on restore, which is harmless: commits are idempotent).
    #[serde(default)]
    pub commits: Vec<CommitEntry>,
}

/// A sink transaction to commit with a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitEntry {
    /// The sink's name.
    pub sink: String,
    /// The sink's handle of the transaction.
    pub handle: String,
}

/// Where checkpoints go and how often.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointConfig {
    pub(crate) dir: PathBuf,
    pub(crate) interval: Duration,
    pub(crate) retain: usize,
    /// How long a checkpoint may take before it is abandoned; `None`: ten
    /// intervals, at least a minute.
    pub(crate) timeout: Option<Duration>,
}

fn io<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> Error + 'p {
    move |source| Error::Io { action, path: path.to_path_buf(), source }
}

fn bad(path: &Path, what: String) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), message: what }
}

/// The directory of checkpoint `n` under `root`.
pub(crate) fn checkpoint_dir(root: &Path, n: u64) -> PathBuf {
    root.join(format!("chk-{n:020}"))
}

/// Writes a state file (header, payload) and syncs it.
pub(crate) fn write_state_file(path: &Path, file: &StateFile) -> Result<()> {
    let payload =
        rkyv::to_bytes::<rkyv::rancor::Error>(file).map_err(|e| bad(path, format!("cannot encode the state: {e}")))?;
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    let mut f = fs::File::create(path).map_err(io("cannot create checkpoint file", path))?;
    f.write_all(&out).map_err(io("cannot write checkpoint file", path))?;
    f.sync_all().map_err(io("cannot sync checkpoint file", path))
}

/// Reads and checks a state file: magic, version, length, checksum, then
/// validates the archive in an aligned buffer.
pub(crate) fn read_state_file(path: &Path) -> Result<StateFile> {
    let bytes = fs::read(path).map_err(io("cannot read checkpoint file", path))?;
    let (header, payload) = bytes
        .split_at_checked(HEADER)
        .ok_or_else(|| bad(path, format!("truncated: {} bytes, shorter than the header", bytes.len())))?;
    let field = |at: usize| -> u64 {
        let mut b = [0u8; 8];
        if let Some(s) = header.get(at..at + 8) {
            b.copy_from_slice(s);
        }
        u64::from_le_bytes(b)
    };
    if header.get(..8) != Some(MAGIC.as_slice()) {
        return Err(bad(path, "not a Weibo state file (wrong magic)".into()));
    }
    let version = field(8) as u32;
    if version != FORMAT_VERSION {
        return Err(bad(path, format!("format version {version}, this build reads version {FORMAT_VERSION}")));
    }
    let len = field(16);
    if len != payload.len() as u64 {
        return Err(bad(
            path,
            format!("truncated: the header says {len} payload bytes, the file has {}", payload.len()),
        ));
    }
    if field(24) != xxhash_rust::xxh3::xxh3_64(payload) {
        return Err(bad(path, "checksum mismatch: the file is corrupt".into()));
    }
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(payload.len());
    aligned.extend_from_slice(payload);
    rkyv::from_bytes::<StateFile, rkyv::rancor::Error>(&aligned)
        .map_err(|e| bad(path, format!("the state does not validate: {e}")))
}

/// Writes the manifest of a checkpoint atomically: only a checkpoint with a
/// manifest is complete.
pub(crate) fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<()> {
    let tmp = dir.join("MANIFEST.tmp");
    let path = dir.join("MANIFEST");
    let json = serde_json::to_vec_pretty(manifest).map_err(|e| bad(&path, format!("cannot encode: {e}")))?;
    let mut f = fs::File::create(&tmp).map_err(io("cannot create checkpoint manifest", &tmp))?;
    f.write_all(&json).map_err(io("cannot write checkpoint manifest", &tmp))?;
    f.sync_all().map_err(io("cannot sync checkpoint manifest", &tmp))?;
    fs::rename(&tmp, &path).map_err(io("cannot publish checkpoint manifest", &path))?;
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads a checkpoint's manifest and checks its version.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join("MANIFEST");
    let bytes = fs::read(&path).map_err(io("cannot read checkpoint manifest", &path))?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| bad(&path, format!("not a valid manifest: {e}")))?;
    if manifest.format_version != FORMAT_VERSION {
        return Err(bad(
            &path,
            format!("format version {}, this build reads version {FORMAT_VERSION}", manifest.format_version),
        ));
    }
    Ok(manifest)
}

/// The highest checkpoint number under `root`, complete or not (0 if none).
pub(crate) fn highest_checkpoint(root: &Path) -> u64 {
    fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().strip_prefix("chk-")?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

/// The complete checkpoints under `root`, newest first.
pub fn complete_checkpoints(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n = name.strip_prefix("chk-")?.parse::<u64>().ok()?;
            e.path().join("MANIFEST").is_file().then(|| (n, e.path()))
        })
        .collect();
    found.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    found
}

/// What a task reports when checkpoint `n` has passed it.
#[derive(Debug)]
pub(crate) struct Ack {
    pub(crate) checkpoint: u64,
    pub(crate) sources: Vec<SourcePositionEntry>,
    pub(crate) states: Vec<StateFileEntry>,
    /// Set when the task could not take its part.
    pub(crate) failure: Option<String>,
    /// The task that acknowledges.
    pub(crate) task: String,
    /// Set once, when the task has finished: the last barrier it passed (0
    /// for none). It takes part in no later checkpoint, and stands for
    /// itself in each of them with `sources` (a source's final position)
    /// and no state: all of its input has been processed and passed on.
    pub(crate) finished: Option<u64>,
}

/// The coordinator's side of the job: triggers and acknowledgements.
pub(crate) struct Coordinator {
    pub(crate) config: CheckpointConfig,
    pub(crate) job: String,
    pub(crate) fingerprint: String,
    pub(crate) max_key_groups: u16,
    pub(crate) triggers: Vec<mpsc::UnboundedSender<u64>>,
    pub(crate) acks: mpsc::UnboundedReceiver<Ack>,
    /// How many acknowledgements complete a checkpoint (one per task).
    pub(crate) tasks: usize,
    /// The first checkpoint number to use (after the restored one).
    pub(crate) next: u64,
    pub(crate) completed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub(crate) committers: Vec<std::sync::Arc<dyn crate::sinks::Committer>>,
    /// Transactions whose commit failed: carried into the next manifest.
    pub(crate) uncommitted: Vec<CommitEntry>,
    /// Requests for savepoints.
    pub(crate) savepoints: mpsc::UnboundedReceiver<SavepointRequest>,
    /// The last complete checkpoint's manifest, whose chains deltas extend.
    pub(crate) previous: Option<Manifest>,
}

/// A request for a savepoint: a checkpoint now, copied under `name`.
#[derive(Debug)]
pub(crate) struct SavepointRequest {
    /// `None`: a plain checkpoint, now.
    pub(crate) name: Option<String>,
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<PathBuf>>,
}

/// For crash tests: with `WEIBO_CRASH_BEFORE_COMMIT=<n>` in the
/// environment, the process aborts right after publishing checkpoint `n`'s
/// manifest, before any sink commits it: the narrowest window a real crash
/// can hit, which recovery must close by committing on restore.
fn crash_point_before_commit(n: u64) {
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var("WEIBO_CRASH_BEFORE_COMMIT").ok().and_then(|v| v.parse().ok()));
    if *at == Some(n) {
        tracing::warn!(checkpoint = n, "WEIBO_CRASH_BEFORE_COMMIT: aborting the process before the commit");
        std::process::abort();
    }
}

impl Coordinator {
    /// Triggers checkpoints until every source has finished or the job
    /// ends.
    ///
    /// A task that has finished (a source at the end of its input, an
    /// operator whose inputs have all ended) says so once, with the last
    /// barrier it passed; every later checkpoint counts it as acknowledged,
    /// with a source's final position and no state. A task that passed
    /// barrier `n` acknowledges `n` itself, even if it finished since.
    pub(crate) async fn run(mut self, mut stop: tokio::sync::oneshot::Receiver<()>) {
        let mut ticker = tokio::time::interval(self.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut n = self.next;
        // Finished tasks, by task: the last barrier each passed, and its
        // standing acknowledgement.
        let mut finished: BTreeMap<String, (u64, Ack)> = BTreeMap::new();
        loop {
            // A checkpoint on schedule, or a savepoint on request, until
            // the job ends.
            let savepoint = tokio::select! {
                _ = &mut stop => return,
                _ = ticker.tick() => None,
                request = self.savepoints.recv() => match request {
                    Some(request) => Some(request),
                    None => std::future::pending().await,
                },
            };
            // Sources that have finished get no trigger (their final
            // position stands in); once all have, the job is ending.
            let mut triggered = false;
            for t in &self.triggers {
                triggered |= t.send(n).is_ok();
            }
            if !triggered {
                tracing::info!(job = %self.job, "every source has finished: no more checkpoints");
                if let Some(request) = savepoint {
                    let _ = request.reply.send(Err(Error::Runtime {
                        job: self.job.clone(),
                        message: "every source has finished, so no savepoint can be taken".into(),
                    }));
                }
                return;
            }
            let mut acks: BTreeMap<String, Ack> = BTreeMap::new();
            let counted = |acks: &BTreeMap<String, Ack>, finished: &BTreeMap<String, (u64, Ack)>| {
                acks.len() + finished.iter().filter(|(task, (last, _))| *last < n && !acks.contains_key(*task)).count()
            };
            // A checkpoint that cannot complete in time (a task stuck in
            // user code, a task that failed to take its part) is abandoned.
            let timeout =
                self.config.timeout.unwrap_or_else(|| (self.config.interval * 10).max(Duration::from_secs(60)));
            let deadline = tokio::time::Instant::now() + timeout;
            while counted(&acks, &finished) < self.tasks {
                let ack = tokio::select! {
                    _ = &mut stop => return,
                    () = tokio::time::sleep_until(deadline) => break,
                    ack = self.acks.recv() => ack,
                };
                match ack {
                    Some(ack) => match ack.finished {
                        Some(last) => {
                            finished.insert(ack.task.clone(), (last, ack));
                        }
                        None if ack.checkpoint == n => {
                            acks.insert(ack.task.clone(), ack);
                        }
                        None => {}
                    },
                    None => return,
                }
            }
            if counted(&acks, &finished) < self.tasks {
                tracing::warn!(job = %self.job, checkpoint = n, "checkpoint abandoned: not every task acknowledged in time");
                if let Some(request) = savepoint {
                    let _ = request.reply.send(Err(Error::Runtime {
                        job: self.job.clone(),
                        message: format!("checkpoint {n} did not complete in time"),
                    }));
                }
                n += 1;
                continue;
            }
            let mut all: Vec<Ack> = Vec::with_capacity(self.tasks);
            for (task, (last, ack)) in &finished {
                if *last < n && !acks.contains_key(task) {
                    all.push(Ack {
                        checkpoint: n,
                        sources: ack.sources.clone(),
                        states: Vec::new(),
                        failure: ack.failure.clone(),
                        task: task.clone(),
                        finished: None,
                    });
                }
            }
            all.extend(acks.into_values());
            let result = self.complete(n, all);
            match &result {
                Ok(()) => {
                    self.completed.store(n, std::sync::atomic::Ordering::Relaxed);
                    tracing::info!(job = %self.job, checkpoint = n, "checkpoint complete");
                }
                Err(e) => tracing::warn!(job = %self.job, checkpoint = n, error = %e, "checkpoint failed"),
            }
            if let Some(request) = savepoint {
                let reply = result.and_then(|()| match &request.name {
                    Some(name) => self.copy_to_savepoint(n, name),
                    None => Ok(checkpoint_dir(&self.config.dir, n)),
                });
                let _ = request.reply.send(reply);
            }
            n += 1;
        }
    }

    fn complete(&mut self, n: u64, acks: Vec<Ack>) -> Result<()> {
        let dir = checkpoint_dir(&self.config.dir, n);
        let mut sources = Vec::new();
        let mut states = Vec::new();
        for ack in acks {
            if let Some(failure) = ack.failure {
                return Err(bad(&dir, failure));
            }
            sources.extend(ack.sources);
            states.extend(ack.states);
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
                return Err(bad(
                    &dir,
                    format!(
                        "the delta {} of `{}`/{} has no base in the previous checkpoint to build on",
                        s.file, s.operator, s.state
                    ),
                ));
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
        let mut commits = std::mem::take(&mut self.uncommitted);
        let retried = commits.clone();
        for c in &self.committers {
            commits.extend(c.take_prepared(n).into_iter().map(|handle| CommitEntry { sink: c.name(), handle }));
        }
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            job: self.job.clone(),
            checkpoint: n,
            graph_fingerprint: self.fingerprint.clone(),
            max_key_groups: self.max_key_groups,
            sources,
            states,
            commits: commits.clone(),
        };
        fs::create_dir_all(&dir).map_err(io("cannot create checkpoint directory", &dir))?;
        write_manifest(&dir, &manifest)?;
        crash_point_before_commit(n);
        let positions = manifest.sources.clone();
        self.previous = Some(manifest);
        // The checkpoint is complete: now the sinks may show its records.
        // Commits wait on external systems: off the runtime's workers.
        crate::runtime::blocking(|| {
            for entry in commits {
                let Some(c) = self.committers.iter().find(|c| c.name() == entry.sink) else { continue };
                // Only this checkpoint's own handles go with its positions:
                // a commit retried from an earlier one must not claim more.
                let fresh = !retried.contains(&entry);
                if let Err(e) = c.commit(&entry.handle, if fresh { &positions } else { &[] }) {
                    tracing::warn!(sink = %entry.sink, handle = %entry.handle, error = %e, "commit failed; retried with the next checkpoint");
                    self.uncommitted.push(entry);
                }
            }
        });
        self.retain(n);
        Ok(())
    }

    /// Copies complete checkpoint `n` to `<dir>/savepoints/<name>`, outside
    /// retention (the manifest last, so a half-copied savepoint is not one).
    fn copy_to_savepoint(&self, n: u64, name: &str) -> Result<PathBuf> {
        let from = checkpoint_dir(&self.config.dir, n);
        let to = self.config.dir.join("savepoints").join(name);
        if to.join("MANIFEST").exists() {
            return Err(bad(&to, "a savepoint of this name exists already: choose another name".into()));
        }
        fs::create_dir_all(&to).map_err(io("cannot create savepoint directory", &to))?;
        let mut manifest = read_manifest(&from)?;
        for s in &mut manifest.states {
            let source = from.join(&s.file);
            let name = Path::new(&s.file).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            let target = to.join(&name);
            fs::copy(&source, &target).map_err(io("cannot copy into savepoint", &target))?;
            s.file = name;
        }
        write_manifest(&to, &manifest)?;
        tracing::info!(job = %self.job, savepoint = %to.display(), checkpoint = n, "savepoint taken");
        Ok(to)
    }

    /// Deletes all but the newest `retain` complete checkpoints, and any
    /// older incomplete ones.
    fn retain(&self, newest: u64) {
        let complete = complete_checkpoints(&self.config.dir);
        let keep: Vec<u64> = complete.iter().take(self.config.retain.max(1)).map(|(n, _)| *n).collect();
        let oldest_kept = keep.last().copied().unwrap_or(newest);
        for e in fs::read_dir(&self.config.dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(n) = name.strip_prefix("chk-").and_then(|s| s.parse::<u64>().ok()) else { continue };
            if n < oldest_kept && !keep.contains(&n) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        // State files no kept checkpoint refers to, up to the newest
        // complete one (newer files belong to checkpoints in flight).
        let mut referenced = std::collections::HashSet::new();
        for (_, dir) in complete.iter().filter(|(n, _)| keep.contains(n)) {
            match read_manifest(dir) {
                Ok(m) => referenced.extend(
                    m.states
                        .into_iter()
                        .filter_map(|s| Path::new(&s.file).file_name().map(|f| f.to_string_lossy().into_owned())),
                ),
                // Without knowing what it refers to, delete nothing.
                Err(_) => return,
            }
        }
        let shared = self.config.dir.join(SHARED);
        for e in fs::read_dir(&shared).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let written =
                name.strip_suffix(".state").and_then(|s| s.rsplit('-').next()).and_then(|n| n.parse::<u64>().ok());
            if written.is_some_and(|w| w <= newest) && !referenced.contains(&name) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// What a restored job starts from.
#[derive(Debug, Default)]
pub(crate) struct Restore {
    pub(crate) checkpoint: u64,
    pub(crate) dir: PathBuf,
    pub(crate) positions: HashMap<(String, u32), u64>,
    /// Per operator: its state files.
    pub(crate) states: BTreeMap<String, Vec<StateFileEntry>>,
    /// Sink transactions the checkpoint committed.
    pub(crate) commits: Vec<CommitEntry>,
}

impl Restore {
    /// Reads checkpoint `dir` for a job with `fingerprint` and `max_key_groups`.
    pub(crate) fn load(dir: &Path, fingerprint: &str, max_key_groups: u16) -> Result<Self> {
        let manifest = read_manifest(dir)?;
        if manifest.graph_fingerprint != fingerprint {
            return Err(bad(
                dir,
                "it was taken by a different pipeline (operators or types changed): restore it into the job that wrote it"
                    .into(),
            ));
        }
        if manifest.max_key_groups != max_key_groups {
            return Err(bad(
                dir,
                format!(
                    "it was taken with {} key groups, the job has {max_key_groups}: key groups cannot change",
                    manifest.max_key_groups
                ),
            ));
        }
        // Read every state file once now, so that a corrupt one is found
        // before anything runs.
        for s in &manifest.states {
            read_state_file(&dir.join(&s.file))?;
        }
        let mut states: BTreeMap<String, Vec<StateFileEntry>> = BTreeMap::new();
        for s in manifest.states {
            states.entry(s.operator.clone()).or_default().push(s);
        }
        Ok(Self {
            checkpoint: manifest.checkpoint,
            dir: dir.to_path_buf(),
            positions: manifest.sources.into_iter().map(|s| ((s.source, s.partition), s.position)).collect(),
            states,
            commits: manifest.commits,
        })
    }

    /// The newest complete checkpoint under `root` that loads, falling back
    /// to older ones when one is damaged (each failure is logged).
    pub(crate) fn latest(root: &Path, fingerprint: &str, max_key_groups: u16) -> Result<Option<Self>> {
        let mut last_error = None;
        for (_, dir) in complete_checkpoints(root) {
            match Self::load(&dir, fingerprint, max_key_groups) {
                Ok(r) => return Ok(Some(r)),
                Err(e) => {
                    tracing::warn!(checkpoint = %dir.display(), error = %e, "cannot restore; trying an older one");
                    last_error = Some(e);
                }
            }
        }
        match last_error {
            // Checkpoints exist but none loads: refuse to start from scratch silently.
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// The entries of `operator`'s `state` in key groups `groups`.
    /// Reads state file `file` (relative to the checkpoint), whose values
    /// must have been written with `codec`.
    fn read_checked(&self, file: &str, codec: &str) -> Result<StateFile> {
        let path = self.dir.join(file);
        let file = read_state_file(&path)?;
        if file.codec != codec {
            return Err(bad(
                &path,
                format!("its values were written with codec {}, the job reads {codec}", file.codec),
            ));
        }
        Ok(file)
    }

    pub(crate) fn entries(
        &self,
        operator: &str,
        state: &str,
        codec: &str,
        groups: &std::ops::Range<u16>,
    ) -> Result<crate::state::Entries> {
        // Chains in checkpoint order: a base replaces its key groups'
        // entries, a delta removes and then puts.
        let mut files: Vec<&StateFileEntry> = self
            .states
            .get(operator)
            .into_iter()
            .flatten()
            .filter(|s| s.state == state && s.key_groups.1 > groups.start && s.key_groups.0 < groups.end)
            .collect();
        files.sort_by_key(|s| s.checkpoint);
        // Every chain starts with a base: a delta alone is not the state.
        for (i, s) in files.iter().enumerate() {
            if !s.base && !files.iter().take(i).any(|b| b.base && b.key_groups == s.key_groups) {
                return Err(bad(
                    &self.dir,
                    format!(
                        "the delta {} of `{operator}`/{state} (key groups {:?}) has no base before it",
                        s.file, s.key_groups
                    ),
                ));
            }
        }
        // Only bases, one per key-group range: nothing to merge.
        let mut ranges: Vec<(u16, u16)> = files.iter().map(|s| s.key_groups).collect();
        ranges.sort_unstable();
        ranges.dedup();
        if files.iter().all(|s| s.base) && ranges.len() == files.len() {
            let mut out = Vec::new();
            for s in files {
                let file = self.read_checked(&s.file, codec)?;
                for g in file.groups.into_iter().filter(|g| groups.contains(&g.group)) {
                    out.extend(g.entries.into_iter().map(|(k, v)| (g.group, k, v)));
                }
            }
            return Ok(out);
        }
        let mut merged: BTreeMap<(u16, Vec<u8>), Vec<u8>> = BTreeMap::new();
        for s in files {
            let file = self.read_checked(&s.file, codec)?;
            let (lo, hi) = s.key_groups;
            if s.base {
                merged.retain(|(g, _), _| *g < lo || *g >= hi);
            }
            for r in file.removed {
                for k in r.keys {
                    merged.remove(&(r.group, k));
                }
            }
            for g in file.groups {
                for (k, v) in g.entries {
                    merged.insert((g.group, k), v);
                }
            }
        }
        Ok(merged.into_iter().filter(|((g, _), _)| groups.contains(g)).map(|((g, k), v)| (g, k, v)).collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn sample() -> StateFile {
        StateFile {
            operator: "sum".into(),
            state: "value".into(),
            codec: "serde-postcard/1<u64>".into(),
            groups: vec![GroupEntries { group: 3, entries: vec![(b"k".to_vec(), b"v".to_vec())] }],
            removed: vec![GroupKeys { group: 3, keys: vec![b"gone".to_vec()] }],
        }
    }

    #[test]
    fn state_files_round_trip_and_refuse_damage_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sum-0-value.state");
        write_state_file(&path, &sample()).unwrap();
        assert_eq!(read_state_file(&path).unwrap(), sample());

        let good = fs::read(&path).unwrap();
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        fs::write(&path, &flipped).unwrap();
        let err = read_state_file(&path).unwrap_err().to_string();
        assert!(err.contains("checksum") && err.contains("sum-0-value.state"), "{err}");

        fs::write(&path, &good[..good.len() - 3]).unwrap();
        assert!(read_state_file(&path).unwrap_err().to_string().contains("truncated"));

        let mut old = good.clone();
        old[8] = 9;
        fs::write(&path, &old).unwrap();
        assert!(read_state_file(&path).unwrap_err().to_string().contains("format version 9"));

        fs::write(&path, b"short").unwrap();
        assert!(read_state_file(&path).unwrap_err().to_string().contains("truncated"));
    }

    #[test]
    fn only_checkpoints_with_a_manifest_are_complete() {
        let root = tempfile::tempdir().unwrap();
        for n in [1u64, 2, 3] {
            let dir = checkpoint_dir(root.path(), n);
            fs::create_dir_all(&dir).unwrap();
            if n != 3 {
                let m = Manifest {
                    format_version: FORMAT_VERSION,
                    job: "j".into(),
                    checkpoint: n,
                    graph_fingerprint: "f".into(),
                    max_key_groups: 8,
                    sources: vec![],
                    states: vec![],
                    commits: vec![],
                };
                write_manifest(&dir, &m).unwrap();
            }
        }
        let found: Vec<u64> = complete_checkpoints(root.path()).into_iter().map(|(n, _)| n).collect();
        assert_eq!(found, vec![2, 1]);
        assert!(
            Restore::load(&checkpoint_dir(root.path(), 2), "other", 8)
                .unwrap_err()
                .to_string()
                .contains("different pipeline")
        );
        assert!(
            Restore::load(&checkpoint_dir(root.path(), 2), "f", 16).unwrap_err().to_string().contains("key groups")
        );
        assert_eq!(Restore::latest(root.path(), "f", 8).unwrap().unwrap().checkpoint, 2);
    }
}
