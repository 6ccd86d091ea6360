//! Who owns a checkpoint storage: one run of one job at a time.
//!
//! A run takes its checkpoint storage before it reads anything from it
//! ([`CheckpointStorage::try_lock`](super::CheckpointStorage::try_lock))
//! and keeps it until it ends. While it holds it, no other run can start
//! on the same storage: a second start is refused with an error naming
//! the holder, or waits for it (`Job::with_storage_wait`). The hold is a
//! [`StorageLease`]; the run checks it before it writes a manifest and
//! before it commits ([`StorageLease::check`]), so a run that lost its
//! storage (an object store's lease taken over after it expired) can
//! neither complete a checkpoint nor make output visible.
//!
//! How each storage holds:
//! - [`LocalDir`](super::LocalDir): an exclusive lock of the operating
//!   system on the file `LOCK` at its root, held for the life of the
//!   open file: a process that dies releases it at once. The file holds
//!   the holder's description, for the error of the run it refuses. A
//!   check makes sure the file is still the one locked (a `LOCK` deleted
//!   and made again by hand would let a second run in).
//! - [`MemoryStorage`](super::MemoryStorage): a slot beside its objects,
//!   shared by its clones.
//! - An object store: a lease object written with conditional puts,
//!   renewed while the run lasts (`weibo_connectors::s3::S3Storage`).

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// Who holds a checkpoint storage: written where the storage keeps its
/// lock, and named in the error of a run the storage refuses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageHolder {
    /// The job's name.
    pub job: String,
    /// The holding process's id.
    pub pid: u32,
    /// The host the process runs on (empty when it cannot be told).
    pub host: String,
    /// When the run took the storage, in milliseconds since the Unix epoch.
    pub since_unix_ms: u64,
    /// The run's token: unique to one run of one process.
    pub run: String,
    /// The fencing token: greater than that of every run that held the
    /// storage before (0 until the storage hands one out).
    #[serde(default)]
    pub generation: u64,
}

impl StorageHolder {
    /// This process, for a run of job `job` with token `run`, from now.
    pub fn this_process(job: &str, run: &str) -> Self {
        Self {
            job: job.to_string(),
            pid: std::process::id(),
            host: host_name(),
            since_unix_ms: super::history::unix_ms(std::time::SystemTime::now()),
            run: run.to_string(),
            generation: 0,
        }
    }
}

impl fmt::Display for StorageHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job `{}` (process {}", self.job, self.pid)?;
        if !self.host.is_empty() {
            write!(f, " on {}", self.host)?;
        }
        write!(f, ", run {}, since {})", self.run, utc(self.since_unix_ms))
    }
}

/// The machine's name, as the kernel has it (empty when it cannot be told).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// `ms` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
}

/// A run's hold on its checkpoint storage, released when dropped.
pub trait StorageLease: Send + Sync + fmt::Debug {
    /// The fencing token this run holds the storage with: greater than
    /// that of every run that held it before.
    fn generation(&self) -> u64;

    /// Whether this run still holds the storage, renewing the hold where
    /// it expires. Weibo calls it before writing a manifest and before
    /// committing an exactly-once sink's output.
    ///
    /// # Errors
    /// [`LeaseError::Lost`] when another run took the storage or the hold
    /// expired: the run is fenced, writes and commits nothing more, and
    /// stops. [`LeaseError::Unavailable`] when the storage cannot tell
    /// now: the checkpoint at hand fails, and the next one asks again.
    fn check(&self) -> Result<(), LeaseError>;
}

/// Why a [`StorageLease::check`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// Another run took the storage, or this run's hold expired: this run
    /// is fenced for good.
    #[error("{0}")]
    Lost(String),
    /// The storage could not be asked.
    #[error("cannot tell whether this run still holds the storage: {0}")]
    Unavailable(#[from] io::Error),
}

/// What [`CheckpointStorage::try_lock`](super::CheckpointStorage::try_lock)
/// found.
#[derive(Debug)]
pub enum LockAttempt {
    /// The storage is this run's until the lease is dropped.
    Acquired(Box<dyn StorageLease>),
    /// Another run holds it: who, when the storage can tell.
    HeldBy(Option<StorageHolder>),
}

/// The name of the lock object at a storage's root.
pub const LOCK: &str = "LOCK";

/// A [`LocalDir`](super::LocalDir)'s hold: the locked `LOCK` file.
#[derive(Debug)]
pub(crate) struct LocalLease {
    pub(crate) file: std::fs::File,
    pub(crate) path: std::path::PathBuf,
    pub(crate) generation: u64,
}

impl LocalLease {
    /// Takes the lock of `path` (created if missing) for `holder`.
    pub(crate) fn try_take(path: &std::path::Path, holder: &StorageHolder) -> io::Result<LockAttempt> {
        use std::io::{Read as _, Seek as _, Write as _};
        // A `LOCK` replaced between opening and locking it (deleted by
        // hand) is opened again. A lock held by a run that does not name
        // itself in the file (it is writing itself in, or letting go) is
        // tried again for a moment.
        let mut replaced = 0;
        for attempt in 0.. {
            let mut file =
                std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => match read_holder(path) {
                    Some(h) => return Ok(LockAttempt::HeldBy(Some(h))),
                    None if attempt < UNNAMED_TRIES => {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        continue;
                    }
                    None => return Ok(LockAttempt::HeldBy(None)),
                },
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
            if !same_file(&file, path)? {
                replaced += 1;
                if replaced < 3 {
                    continue;
                }
                break;
            }
            let mut before = String::new();
            file.read_to_string(&mut before)?;
            let generation = serde_json::from_str::<serde_json::Value>(&before)
                .ok()
                .and_then(|v| v.get("generation").and_then(serde_json::Value::as_u64))
                .unwrap_or(0)
                .saturating_add(1);
            let mut mine = holder.clone();
            mine.generation = generation;
            let json = serde_json::to_vec(&mine).map_err(io::Error::other)?;
            file.set_len(0)?;
            file.rewind()?;
            file.write_all(&json)?;
            file.sync_all()?;
            return Ok(LockAttempt::Acquired(Box::new(LocalLease { file, path: path.to_path_buf(), generation })));
        }
        Err(io::Error::other(format!("the lock file {} keeps being replaced", path.display())))
    }
}

/// How often (5 ms apart) a lock held by a run that does not name itself
/// is tried again: the holder writes itself in just after it locked the
/// file, and one letting go leaves only the last generation in it.
const UNNAMED_TRIES: u32 = 40;

/// The holder a lock file names (`None` when it names nobody, or is not
/// Weibo's).
fn read_holder(path: &std::path::Path) -> Option<StorageHolder> {
    serde_json::from_slice::<StorageHolder>(&std::fs::read(path).ok()?).ok()
}

/// Whether `file` is the file now at `path`.
#[cfg(unix)]
fn same_file(file: &std::fs::File, path: &std::path::Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt as _;
    let (open, there) = match std::fs::metadata(path) {
        Ok(there) => (file.metadata()?, there),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(open.dev() == there.dev() && open.ino() == there.ino())
}

#[cfg(not(unix))]
fn same_file(_file: &std::fs::File, path: &std::path::Path) -> io::Result<bool> {
    Ok(path.exists())
}

impl Drop for LocalLease {
    /// The file keeps the generation, and no longer names this run: a run
    /// that finds it locked by the next holder (in the moment before that
    /// one writes itself in) reads it again rather than name this one.
    fn drop(&mut self) {
        use std::io::{Seek as _, Write as _};
        if self.file.set_len(0).is_ok() && self.file.rewind().is_ok() {
            let _ = write!(self.file, "{{\"generation\":{}}}", self.generation);
        }
    }
}

impl StorageLease for LocalLease {
    fn generation(&self) -> u64 {
        self.generation
    }

    fn check(&self) -> Result<(), LeaseError> {
        if same_file(&self.file, &self.path)? {
            return Ok(());
        }
        Err(LeaseError::Lost(format!(
            "the lock file {} this run holds was deleted or replaced: another run may have taken the storage",
            self.path.display()
        )))
    }
}

/// A [`MemoryStorage`](super::MemoryStorage)'s lock slot, shared by its
/// clones.
#[derive(Debug, Default)]
pub(crate) struct MemorySlot {
    holder: Option<StorageHolder>,
    /// The last generation handed out.
    generation: u64,
}

/// A [`MemoryStorage`](super::MemoryStorage)'s hold.
#[derive(Debug)]
pub(crate) struct MemoryLease {
    slot: Arc<Mutex<MemorySlot>>,
    generation: u64,
}

impl MemoryLease {
    pub(crate) fn try_take(slot: &Arc<Mutex<MemorySlot>>, holder: &StorageHolder) -> LockAttempt {
        let mut s = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(other) = &s.holder {
            return LockAttempt::HeldBy(Some(other.clone()));
        }
        s.generation += 1;
        let mut mine = holder.clone();
        mine.generation = s.generation;
        s.holder = Some(mine);
        LockAttempt::Acquired(Box::new(MemoryLease { slot: slot.clone(), generation: s.generation }))
    }
}

impl StorageLease for MemoryLease {
    fn generation(&self) -> u64 {
        self.generation
    }

    fn check(&self) -> Result<(), LeaseError> {
        let s = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        match &s.holder {
            Some(h) if h.generation == self.generation => Ok(()),
            Some(h) => Err(LeaseError::Lost(format!("the storage was taken by {h}"))),
            None => Err(LeaseError::Lost("the storage's lock was released under this run".into())),
        }
    }
}

impl Drop for MemoryLease {
    fn drop(&mut self) {
        let mut s = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if s.holder.as_ref().is_some_and(|h| h.generation == self.generation) {
            s.holder = None;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn times_print_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_796_556_494_000), "2026-12-06T11:28:14Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn a_local_lock_is_held_once_and_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK);
        let first = StorageHolder::this_process("j", "run-a");
        let LockAttempt::Acquired(a) = LocalLease::try_take(&path, &first).unwrap() else { panic!("free") };
        assert_eq!(a.generation(), 1);
        let second = StorageHolder::this_process("j", "run-b");
        match LocalLease::try_take(&path, &second).unwrap() {
            LockAttempt::HeldBy(Some(h)) => assert_eq!((h.run.as_str(), h.generation), ("run-a", 1)),
            other => panic!("{other:?}"),
        }
        a.check().unwrap();
        drop(a);
        let LockAttempt::Acquired(b) = LocalLease::try_take(&path, &second).unwrap() else { panic!("released") };
        assert_eq!(b.generation(), 2, "the generation grows with every holder");
        // A lock file replaced under the holder: the holder is fenced.
        std::fs::remove_file(&path).unwrap();
        assert!(b.check().unwrap_err().to_string().contains("deleted or replaced"));
    }

    #[test]
    fn a_memory_lock_is_held_once_and_released_when_dropped() {
        let slot = Arc::new(Mutex::new(MemorySlot::default()));
        let LockAttempt::Acquired(a) = MemoryLease::try_take(&slot, &StorageHolder::this_process("j", "a")) else {
            panic!("free")
        };
        assert!(matches!(
            MemoryLease::try_take(&slot, &StorageHolder::this_process("j", "b")),
            LockAttempt::HeldBy(Some(h)) if h.run == "a"
        ));
        a.check().unwrap();
        drop(a);
        let LockAttempt::Acquired(b) = MemoryLease::try_take(&slot, &StorageHolder::this_process("j", "b")) else {
            panic!("released")
        };
        assert_eq!(b.generation(), 2);
    }
}
