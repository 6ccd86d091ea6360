//! A job's run-time settings, and where it restores from.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::commit::TwoPhaseCommits;
use crate::checkpoint::{CheckpointConfig, CheckpointStorage, LocalDir, Restore};
use crate::error::{Error, Result};
use crate::state::StateBackend;

/// How far a source partition reads ahead of the slowest partition of its
/// source, in event time, unless a job says otherwise.
pub(crate) const DEFAULT_MAX_WATERMARK_DRIFT: Duration = Duration::from_secs(10);

/// The longest buffer timeout a job takes (`Job::with_buffer_timeout`):
/// the runtime adds it to instants and multiplies it, which a timeout of
/// `Duration::MAX` would overflow.
pub(crate) const MAX_BUFFER_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// How a job runs: batching, channels, state, checkpoints. (What it
/// runs, and its name and key groups, are its graph's.)
#[derive(Clone, Debug)]
pub(crate) struct JobConfig {
    pub(crate) batch_size: usize,
    pub(crate) batch_bytes: usize,
    pub(crate) buffer_timeout: Duration,
    pub(crate) channel_capacity: usize,
    /// How far (in event time) a source partition may read ahead of the
    /// slowest partition of its source; `None`: as far as it likes.
    pub(crate) watermark_alignment: Option<Duration>,
    pub(crate) state: Arc<dyn StateBackend>,
    /// Where and how often checkpoints are taken, if at all.
    pub(crate) checkpoint: Option<CheckpointConfig>,
    /// A checkpoint (or a directory of them) to start from.
    pub(crate) restore_from: Option<RestoreFrom>,
    /// Whether a restore may drop state the job has no operator for
    /// (logged), rather than refuse it.
    pub(crate) allow_unrestored_state: bool,
    /// Ways to read state written with an earlier layout of its type.
    pub(crate) migrations: Vec<crate::checkpoint::Migration>,
    /// The exactly-once sinks, for the coordinator to commit.
    pub(crate) commits: TwoPhaseCommits,
    /// How long a start waits for another run to release the checkpoint
    /// storage; `None`: it is refused at once.
    pub(crate) storage_wait: Option<Duration>,
    /// Whether every value goes through its codec where bytes would be
    /// needed beyond one process (`weibo::testing`'s jobs): records on
    /// hash edges are encoded and decoded, and state kept in memory is
    /// kept as bytes.
    pub(crate) verify_codecs: bool,
    /// The clock processing-time timers follow (the system's, or a test
    /// harness's).
    pub(crate) clock: crate::time::clock::Clock,
}

impl Default for JobConfig {
    /// The settings of a new `Job`.
    fn default() -> Self {
        Self {
            batch_size: 1024,
            batch_bytes: 256 * 1024,
            buffer_timeout: Duration::from_millis(10),
            channel_capacity: 4,
            watermark_alignment: Some(DEFAULT_MAX_WATERMARK_DRIFT),
            state: Arc::new(crate::state::MemoryBackend),
            checkpoint: None,
            restore_from: None,
            allow_unrestored_state: false,
            migrations: Vec::new(),
            commits: TwoPhaseCommits::default(),
            storage_wait: None,
            verify_codecs: false,
            clock: crate::time::clock::Clock::default(),
        }
    }
}

/// Where a job restores from, as configured.
#[derive(Clone, Debug)]
pub(crate) enum RestoreFrom {
    /// A local checkpoint's or savepoint's directory, or a directory of
    /// checkpoints.
    Path(PathBuf),
    /// The same, as a directory in a storage (`""`: its top).
    Stored(Arc<dyn CheckpointStorage>, String),
}

impl RestoreFrom {
    /// Finds the checkpoint to restore and loads it.
    pub(crate) fn load(&self, max_key_groups: u16) -> Result<Restore> {
        let (storage, dir): (Arc<dyn CheckpointStorage>, String) = match self {
            // A checkpoint's manifest names its state files relative to
            // itself (`../shared/..`): the storage is its parent directory.
            RestoreFrom::Path(path) if path.join("MANIFEST").is_file() => {
                let path = std::fs::canonicalize(path).map_err(|source| Error::Io {
                    action: "cannot read checkpoint directory",
                    path: path.clone(),
                    source,
                })?;
                match (path.parent(), path.file_name()) {
                    (Some(parent), Some(name)) => {
                        (Arc::new(LocalDir::new(parent)), name.to_string_lossy().into_owned())
                    }
                    _ => (Arc::new(LocalDir::new(path)), String::new()),
                }
            }
            RestoreFrom::Path(path) => (Arc::new(LocalDir::new(path)), String::new()),
            RestoreFrom::Stored(storage, dir) => (storage.clone(), dir.clone()),
        };
        let manifest = crate::checkpoint::storage::join(&dir, "MANIFEST");
        let is_checkpoint = storage.exists(&manifest).map_err(|source| Error::Io {
            action: "cannot read checkpoint storage",
            path: storage.locate(&manifest),
            source,
        })?;
        if is_checkpoint {
            return Restore::load(&storage, &dir, max_key_groups);
        }
        Restore::latest(&storage, &dir, max_key_groups)?.ok_or_else(|| Error::Checkpoint {
            path: storage.locate(&dir),
            message: "holds no complete checkpoint".into(),
            source: None,
        })
    }
}
