//! State on disk: the fjall backend.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::state::{ExpiryClock, ObjectCache, StateBackend, StateScope, StateTable, Writes};

/// Keyed state in fjall, an LSM tree on local disk: state larger than memory.
///
/// Every (job, operator, state) gets its own fjall keyspace; inside it a
/// key is the key group (two bytes, big-endian) followed by the encoded key,
/// so one key group is one contiguous range of the keyspace.
///
/// In front of fjall, value state keeps recently used values as live
/// objects in a write-back cache (see [`ObjectCache`]): a hit costs what the
/// in-memory backend costs; a miss reads fjall (unless fjall holds nothing
/// of the key group yet) and decodes; changed values are encoded and
/// written to fjall in batches when the cache is over its budget. Tumbling
/// and sliding windows stay in memory, one map per window, within their
/// share of the same budget, and move to fjall whole past it.
/// [`FjallBackend::builder`] sets the memory it may use.
///
/// The entries of a state with a time-to-live are also dropped by a
/// compaction filter once expired, as fjall compacts the tables that hold
/// them: a state much larger than memory loses its expired entries without
/// the sweep reading them back.
///
/// Between checkpoints fjall's own journal is not synced: a checkpoint, not
/// the database directory, is what a job restores from. When a job starts,
/// the backend drops whatever an earlier run of the same job left in the
/// directory.
///
/// ```
/// # fn main() -> weibo::Result<()> {
/// let dir = std::env::temp_dir().join(format!("weibo-doc-{}", std::process::id()));
/// let backend = weibo::state::FjallBackend::open(&dir)?;
/// let mut totals = weibo::testing::TestJob::new("totals").configure(|j| j.with_state_backend(backend));
/// let out = totals.input(vec![("a".to_string(), 1), ("a".to_string(), 2)]);
/// let out = totals.collect(&out.key_by(|r: &(String, i32)| r.0.clone()).reduce(|a, b| (a.0, a.1 + b.1)));
/// totals.run()?;
/// assert_eq!(out.values().last(), Some(&("a".to_string(), 3)));
/// # let _ = std::fs::remove_dir_all(&dir);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FjallBackend {
    db: fjall::Database,
    path: PathBuf,
    cache: Arc<ObjectCache>,
    memtable: u64,
    timers_on_disk: bool,
    expiring: ExpiringKeyspaces,
}

/// The clocks of the keyspaces whose entries expire, by keyspace name.
type ExpiringKeyspaces = Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<ExpiryClock>>>>;

/// Makes the compaction filter of one keyspace whose entries expire: it
/// reads the keyspace's clock when a compaction starts.
struct ExpiryFilters {
    name: String,
    expiring: ExpiringKeyspaces,
}

impl fjall::compaction::filter::Factory for ExpiryFilters {
    fn name(&self) -> &str {
        "weibo-ttl"
    }

    fn make_filter(
        &self,
        _: &fjall::compaction::filter::Context,
    ) -> Box<dyn fjall::compaction::filter::CompactionFilter> {
        let clock = self.expiring.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&self.name).cloned();
        Box::new(ExpiryFilter { clock })
    }
}

/// Drops the entries that have expired at its clock.
struct ExpiryFilter {
    clock: Option<Arc<ExpiryClock>>,
}

impl fjall::compaction::filter::CompactionFilter for ExpiryFilter {
    fn filter_item(
        &mut self,
        item: fjall::compaction::filter::ItemAccessor<'_>,
        _: &fjall::compaction::filter::Context,
    ) -> fjall::compaction::filter::CompactionFilterResult {
        use fjall::compaction::filter::Verdict;
        let Some(clock) = &self.clock else { return Ok(Verdict::Keep) };
        // A tombstone, not a silent drop: an older version of the entry in
        // a lower level must not come back.
        Ok(if clock.drops(&item.value()?) { Verdict::Remove } else { Verdict::Keep })
    }
}

/// The memory budgets of a [`FjallBackend`], set before it opens.
///
/// ```
/// # fn main() -> weibo::Result<()> {
/// # let dir = tempfile::tempdir().map_err(|e| weibo::Error::Internal(e.to_string()))?;
/// let backend = weibo::state::FjallBackend::builder(dir.path())
///     .with_object_cache(256 << 20) // live values in front of fjall
///     .with_block_cache(64 << 20) // fjall's cache of decompressed blocks
///     .with_memtable(16 << 20) // per state, before fjall writes a table file
///     .open()?;
/// # drop(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct FjallOptions {
    path: PathBuf,
    object_cache: usize,
    block_cache: u64,
    memtable: u64,
    timers_on_disk: bool,
    background_threads: usize,
}

impl FjallOptions {
    /// The budget of the cache of live values, shared by every state of
    /// the job (default [`FjallOptions::DEFAULT_OBJECT_CACHE`]). With 0,
    /// every state access reads and writes fjall.
    pub fn with_object_cache(mut self, bytes: usize) -> Self {
        self.object_cache = bytes;
        self
    }

    /// The size of fjall's block cache (default
    /// [`FjallOptions::DEFAULT_BLOCK_CACHE`]).
    pub fn with_block_cache(mut self, bytes: u64) -> Self {
        self.block_cache = bytes;
        self
    }

    /// The size a state's fjall memtable grows to before it is written
    /// out as a table file (default [`FjallOptions::DEFAULT_MEMTABLE`];
    /// at least 1 MiB).
    pub fn with_memtable(mut self, bytes: u64) -> Self {
        self.memtable = bytes.max(1 << 20);
        self
    }

    /// Whether event-time timers (of session windows and keyed `process`)
    /// are kept in fjall, ordered by time, behind the cache of live values
    /// (within its budget, [`FjallOptions::with_object_cache`]), with only each
    /// key group's first timers and earliest time in memory besides,
    /// rather than all in memory (the default).
    ///
    /// In memory a timer costs about what its key takes, and setting or
    /// firing one is a map operation. In fjall their number is bounded by
    /// disk, not memory; a timer set and removed while cached costs no
    /// more than a map operation and a share of a sort when its key group
    /// is read in order, one written back costs fjall writes and reads:
    /// the benchmark's `sessions` workload (a timer set and one fired per
    /// event) runs about three times slower than with timers in memory (the
    /// State backends chapter has the figures). Use it when a job keeps
    /// many more timers than fit in memory.
    pub fn with_timers_on_disk(mut self, on_disk: bool) -> Self {
        self.timers_on_disk = on_disk;
        self
    }

    /// How many threads fjall runs for its flushes and compactions
    /// (default [`FjallOptions::DEFAULT_BACKGROUND_THREADS`]; at least 1).
    ///
    /// With more than one, fjall (3.1) keeps its first thread for flushes
    /// by handing every compaction on to the others, and that thread hands
    /// the same compaction on again and again, without waiting, while the
    /// others are busy: it takes a core for as long as a compaction runs.
    /// On a 2-core machine `bench w3` and `bench sessions` on fjall run
    /// faster with one thread than with two, which spend a core passing
    /// compactions around. More threads pay off only where cores are to
    /// spare and compactions are what holds the job back.
    pub fn with_background_threads(mut self, threads: usize) -> Self {
        self.background_threads = threads.max(1);
        self
    }

    /// Default number of fjall's background threads: 1 (see
    /// [`FjallOptions::with_background_threads`]).
    pub const DEFAULT_BACKGROUND_THREADS: usize = 1;

    /// Default budget of the cache of live values: 24 MiB. With the other
    /// defaults, fjall's filters and indexes, the backend holds 5 million
    /// keys of `w3` state in about 55 MiB of heap.
    pub const DEFAULT_OBJECT_CACHE: usize = 24 << 20;
    /// Default size of fjall's block cache: 16 MiB.
    pub const DEFAULT_BLOCK_CACHE: u64 = 16 << 20;
    /// Default memtable size: 8 MiB.
    pub const DEFAULT_MEMTABLE: u64 = 8 << 20;

    /// Opens (or creates) the database.
    ///
    /// # Errors
    /// [`Error::State`] naming the directory when fjall cannot open it.
    pub fn open(self) -> Result<FjallBackend> {
        let path = self.path;
        start_afresh_if_incomplete(&path)?;
        let expiring = ExpiringKeyspaces::default();
        let registered = expiring.clone();
        let db = fjall::Database::builder(&path)
            .with_compaction_filter_factories(Arc::new(move |name: &str| {
                let expires = registered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(name);
                expires.then(|| {
                    Arc::new(ExpiryFilters { name: name.to_string(), expiring: registered.clone() })
                        as Arc<dyn fjall::compaction::filter::Factory>
                })
            }))
            .manual_journal_persist(true)
            .cache_size(self.block_cache)
            .worker_threads(self.background_threads)
            .open()
            .map_err(|e| Error::State {
                operator: String::new(),
                message: format!("cannot open the fjall database in `{}`", path.display()),
                source: Some(e.into()),
            })?;
        Ok(FjallBackend {
            db,
            path,
            cache: Arc::new(ObjectCache::new(self.object_cache)),
            memtable: self.memtable,
            timers_on_disk: self.timers_on_disk,
            expiring,
        })
    }
}

/// What fjall creates in a new database's directory before the version
/// marker it writes last: a directory holding only these (and no marker,
/// or an empty one) is a database whose creation was cut short.
fn is_fjall_creation_leftover(name: &str, is_dir: bool) -> bool {
    match (name, is_dir) {
        ("lock", false) | ("keyspaces", true) => true,
        (name, false) => name.strip_suffix(".jnl").is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())),
        _ => false,
    }
}

/// The start of fjall's version marker (`FJL`, then a version byte).
const VERSION_MAGIC: &[u8] = b"FJL";

/// Whether the file at `path` is a version marker whose writing was cut
/// short: a file holding a strict prefix of `FJL` (nothing, or part of it)
/// and no version byte.
fn is_partial_version_marker(path: &Path) -> bool {
    let short = std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() < VERSION_MAGIC.len() as u64 + 1);
    short
        && std::fs::read(path)
            .is_ok_and(|bytes| bytes.len() <= VERSION_MAGIC.len() && VERSION_MAGIC.starts_with(&bytes))
}

/// fjall writes its version marker last when it creates a database, and
/// takes a directory without one for a new database: a process killed
/// while creating one (a job's first start) leaves a directory that every
/// later open refuses (the journal exists already). Weibo's state in
/// fjall is rebuilt from the checkpoint whenever a job starts, so such a
/// directory holds nothing to keep: its leftovers are removed (logged,
/// naming the directory) and the database created again. A directory with
/// a version marker (more than a cut-short `FJL`) is opened as it is, whatever else it
/// holds; one without, holding anything else (but a volume's
/// `lost+found`), is refused untouched, and one whose lock another process
/// holds is left alone.
fn start_afresh_if_incomplete(path: &Path) -> Result<()> {
    let refuse = |message: String| Error::State { operator: String::new(), message, source: None };
    let refuse_io =
        |message: String, e: std::io::Error| Error::State { operator: String::new(), message, source: Some(e.into()) };
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(refuse_io(format!("cannot read the fjall directory `{}`", path.display()), e)),
    };
    // Every entry first: the answer must not depend on the listing's order.
    let mut leftovers = Vec::new();
    let mut foreign = None;
    for entry in entries {
        let entry = entry.map_err(|e| refuse_io(format!("cannot read the fjall directory `{}`", path.display()), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if name == "version" {
            // Created, but killed before its few bytes were all written
            // (fjall writes `FJL`, then the version byte, in two writes):
            // still a creation cut short. Any other marker is fjall's to
            // read.
            if !is_partial_version_marker(&entry.path()) {
                return Ok(());
            }
            leftovers.push((entry.path(), false));
        } else if name == "lost+found" && is_dir {
            // A file system's own, at the root of a volume: not ours to judge.
        } else if is_fjall_creation_leftover(&name, is_dir) {
            leftovers.push((entry.path(), is_dir));
        } else {
            foreign.get_or_insert(name);
        }
    }
    if leftovers.is_empty() {
        return Ok(());
    }
    if let Some(name) = foreign {
        return Err(refuse(format!(
            "`{}` holds `{name}` but no fjall database (no `version` file): it is not a database Weibo made, \
             so it is neither opened nor cleared; give the backend a directory of its own",
            path.display()
        )));
    }
    // A process still creating the database holds its lock: leave it be.
    let lock = path.join("lock");
    let held = match std::fs::File::open(&lock) {
        Ok(f) => match f.try_lock() {
            Ok(()) => Some(f),
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(refuse(format!(
                    "the fjall database in `{}` is being created by another process (its lock is held)",
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(refuse_io(format!("cannot lock `{}`", lock.display()), e));
            }
        },
        Err(_) => None,
    };
    tracing::warn!(dir = %path.display(), files = leftovers.len(), "the fjall database in this directory was never completely created (a process stopped while creating it): starting it afresh");
    for (p, is_dir) in leftovers {
        let removed = if is_dir { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        removed
            .map_err(|e| refuse_io(format!("cannot clear `{}` to start the fjall database afresh", p.display()), e))?;
    }
    drop(held);
    Ok(())
}

impl fmt::Debug for FjallBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FjallBackend")
            .field("path", &self.path)
            .field("object_cache", &self.cache.bytes())
            .field("timers_on_disk", &self.timers_on_disk)
            .finish_non_exhaustive()
    }
}

fn state_error(operator: &str, what: &str, e: fjall::Error) -> Error {
    Error::State { operator: operator.to_string(), message: format!("fjall {what}"), source: Some(e.into()) }
}

impl FjallBackend {
    /// Opens (or creates) the database in directory `dir`, with the
    /// default memory budgets (see [`FjallOptions`]).
    ///
    /// # Errors
    /// [`Error::State`] naming the directory when fjall cannot open it.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::builder(dir).open()
    }

    /// Options for a database in directory `dir`: set the memory budgets,
    /// then [`FjallOptions::open`].
    pub fn builder(dir: impl AsRef<Path>) -> FjallOptions {
        FjallOptions {
            path: dir.as_ref().to_path_buf(),
            object_cache: FjallOptions::DEFAULT_OBJECT_CACHE,
            block_cache: FjallOptions::DEFAULT_BLOCK_CACHE,
            memtable: FjallOptions::DEFAULT_MEMTABLE,
            timers_on_disk: false,
            background_threads: FjallOptions::DEFAULT_BACKGROUND_THREADS,
        }
    }

    /// The database's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes every keyspace's memtable to a table and compacts all of
    /// its tables into one (running the compaction filters).
    ///
    /// # Errors
    /// [`Error::State`] when fjall fails.
    #[cfg(test)]
    pub(crate) fn compact_all(&self) -> Result<()> {
        for name in self.db.list_keyspace_names() {
            let keyspace = self
                .db
                .keyspace(&name, fjall::KeyspaceCreateOptions::default)
                .map_err(|e| state_error("", "keyspace", e))?;
            keyspace.rotate_memtable_and_wait().map_err(|e| state_error("", "flush", e))?;
            keyspace.major_compact().map_err(|e| state_error("", "compaction", e))?;
        }
        Ok(())
    }

    /// The keyspace name of a state: readable, and at most 255 bytes (a
    /// longer one keeps its start and gets a hash of the whole).
    fn keyspace_name(scope: &StateScope) -> String {
        let name = format!("{}/{}/{}", scope.job, scope.operator, scope.state);
        if name.len() < 256 {
            return name;
        }
        let hash = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
        let mut cut = 200;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}#{hash:016x}", name.get(..cut).unwrap_or_default())
    }
}

impl StateBackend for FjallBackend {
    fn name(&self) -> &'static str {
        "fjall"
    }

    /// Deletes the keyspaces a previous run of `job` left.
    fn prepare(&self, job: &str) -> Result<()> {
        let prefix = format!("{job}/");
        for name in self.db.list_keyspace_names() {
            let name: &str = &name;
            if name.starts_with(&prefix) {
                let keyspace = self
                    .db
                    .keyspace(name, fjall::KeyspaceCreateOptions::default)
                    .map_err(|e| state_error(job, &format!("cannot open keyspace `{name}`"), e))?;
                self.db
                    .delete_keyspace(keyspace)
                    .map_err(|e| state_error(job, &format!("cannot drop old keyspace `{name}`"), e))?;
            }
        }
        Ok(())
    }

    fn object_cache(&self) -> Option<Arc<ObjectCache>> {
        Some(self.cache.clone())
    }

    fn timers_in_table(&self) -> bool {
        self.timers_on_disk
    }

    fn expire_entries(&self, scope: &StateScope, clock: Arc<ExpiryClock>) {
        self.expiring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(Self::keyspace_name(scope), clock);
    }

    fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>> {
        let name = Self::keyspace_name(scope);
        let memtable = self.memtable;
        let keyspace = self
            .db
            .keyspace(&name, || {
                // Filters and indexes stay in memory at every level (about
                // 10 bits a key, and a few bytes a block): otherwise a point
                // read of a large table reads and checksums its whole filter
                // block again whenever the block cache has dropped it.
                // The journal is not flushed to the OS after every write
                // (fjall's database-wide setting covers batches only; single
                // writes follow the keyspace's): a write was one `write`
                // system call, which `bench sessions` with timers on disk
                // paid for every timer. Nothing
                // reads the journal back: a job's fjall state comes from its
                // checkpoint whenever it starts.
                fjall::KeyspaceCreateOptions::default()
                    .manual_journal_persist(true)
                    .max_memtable_size(memtable)
                    .filter_block_pinning_policy(fjall::config::PinningPolicy::all(true))
                    .index_block_pinning_policy(fjall::config::PinningPolicy::all(true))
            })
            .map_err(|e| state_error(&scope.operator, &format!("cannot open keyspace `{name}`"), e))?;
        Ok(Box::new(FjallTable {
            db: self.db.clone(),
            keyspace,
            operator: scope.operator.clone(),
            buf: Vec::with_capacity(64),
        }))
    }
}

/// One state's keyspace.
struct FjallTable {
    db: fjall::Database,
    keyspace: fjall::Keyspace,
    operator: String,
    buf: Vec<u8>,
}

impl FjallTable {
    fn key(&mut self, group: u16, key: &[u8]) -> &[u8] {
        self.buf.clear();
        self.buf.extend_from_slice(&group.to_be_bytes());
        self.buf.extend_from_slice(key);
        &self.buf
    }
}

impl StateTable for FjallTable {
    fn size(&self) -> Option<(u64, u64)> {
        Some((self.keyspace.approximate_len() as u64, self.keyspace.disk_space()))
    }

    fn get(&mut self, group: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let k = self.key(group, key).to_vec();
        match self.keyspace.get(&k) {
            Ok(v) => Ok(v.map(|v| v.to_vec())),
            Err(e) => Err(state_error(&self.operator, "read", e)),
        }
    }

    fn put(&mut self, group: u16, key: &[u8], value: &[u8]) -> Result<()> {
        let k = self.key(group, key).to_vec();
        self.keyspace.insert(k, value).map_err(|e| state_error(&self.operator, "write", e))
    }

    /// Writes in batches of 16,384 (one journal write each).
    fn put_all(&mut self, entries: &[super::EntryRef<'_>]) -> Result<()> {
        for chunk in entries.chunks(16_384) {
            let mut batch = self.db.batch();
            for (group, key, value) in chunk {
                let mut k = Vec::with_capacity(2 + key.len());
                k.extend_from_slice(&group.to_be_bytes());
                k.extend_from_slice(key);
                batch.insert(&self.keyspace, k, *value);
            }
            batch.commit().map_err(|e| state_error(&self.operator, "batch write", e))?;
        }
        Ok(())
    }

    /// Writes in batches of 16,384 (one journal write each).
    fn apply(&mut self, writes: Writes) -> Result<()> {
        let mut writes = writes.into_iter().peekable();
        while writes.peek().is_some() {
            let mut batch = self.db.batch();
            for (group, key, value) in writes.by_ref().take(16_384) {
                let mut k = Vec::with_capacity(2 + key.len());
                k.extend_from_slice(&group.to_be_bytes());
                k.extend_from_slice(&key);
                match value {
                    Some(value) => batch.insert(&self.keyspace, k, value),
                    None => batch.remove(&self.keyspace, k),
                }
            }
            batch.commit().map_err(|e| state_error(&self.operator, "batch write", e))?;
        }
        Ok(())
    }

    fn delete(&mut self, group: u16, key: &[u8]) -> Result<()> {
        let k = self.key(group, key).to_vec();
        self.keyspace.remove(k).map_err(|e| state_error(&self.operator, "delete", e))
    }

    /// Takes an fjall snapshot now (cheap: MVCC) and reads it later, a key
    /// group (or [`SNAPSHOT_PART`](crate::state::SNAPSHOT_PART) entries of one)
    /// at a time.
    fn snapshot_deferred(&mut self, groups: std::ops::Range<u16>) -> Result<crate::state::Snapshot> {
        let snapshot = self.db.snapshot();
        let keyspace = self.keyspace.clone();
        let operator = self.operator.clone();
        Ok(Box::new(move |sink| {
            use fjall::Readable;
            let mut part = crate::state::SnapshotPart::new(true);
            for group in groups {
                for guard in snapshot.prefix(&keyspace, group.to_be_bytes()) {
                    let (k, v) = guard.into_inner().map_err(|e| state_error(&operator, "snapshot read", e))?;
                    part.part.push(group, k.get(2..).unwrap_or_default(), &v)?;
                    super::snapshot::pass_if_full(&mut part, sink)?;
                }
                super::snapshot::flush_part(&mut part, sink)?;
            }
            Ok(true)
        }))
    }

    fn scan_group(&mut self, group: u16, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        for guard in self.keyspace.prefix(group.to_be_bytes()) {
            let (k, v) = guard.into_inner().map_err(|e| state_error(&self.operator, "scan", e))?;
            f(k.get(2..).unwrap_or_default(), &v);
        }
        Ok(())
    }

    /// Seeks to `from` in the key group's range.
    fn scan_from(&mut self, group: u16, from: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        let start = self.key(group, from).to_vec();
        // Bounded by the key group's end. Without the bound, a scan in a
        // group that has no live key left runs on through the tombstones
        // of the groups after it, to the next live key anywhere: with
        // timers on disk, a session workload deletes a timer (its group's
        // only one, often) before it sets the next, and such scans made it
        // quadratic in the number of records.
        let end = group.checked_add(1).map(u16::to_be_bytes);
        let range = match &end {
            Some(end) => self.keyspace.range(start..end.to_vec()),
            None => self.keyspace.range(start..),
        };
        for guard in range {
            let (k, v) = guard.into_inner().map_err(|e| state_error(&self.operator, "scan", e))?;
            if k.get(..2) != Some(&group.to_be_bytes()[..]) || !f(k.get(2..).unwrap_or_default(), &v) {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// What a process killed while fjall created its database leaves: the
    /// lock, the keyspaces and the journal, without the version marker
    /// fjall writes last.
    fn cut_short(dir: &Path) {
        drop(fjall::Database::builder(dir).open().unwrap());
        std::fs::remove_file(dir.join("version")).unwrap();
        assert!(dir.join("lock").exists() && dir.join("keyspaces").is_dir() && dir.join("0.jnl").exists());
    }

    #[test]
    fn a_database_whose_creation_was_cut_short_is_started_afresh() {
        let dir = tempfile::tempdir().unwrap();
        cut_short(dir.path());
        let err = fjall::Database::builder(dir.path()).open().err().map(|e| e.to_string());
        assert!(err.is_some(), "fjall alone refuses such a directory");
        let backend = FjallBackend::open(dir.path()).unwrap();
        drop(backend);
        assert!(dir.path().join("version").exists(), "created again");
        // And it opens again after that, as any database does.
        drop(FjallBackend::open(dir.path()).unwrap());
    }

    #[test]
    fn an_empty_version_marker_is_a_creation_cut_short_too() {
        let dir = tempfile::tempdir().unwrap();
        cut_short(dir.path());
        std::fs::write(dir.path().join("version"), b"").unwrap();
        drop(FjallBackend::open(dir.path()).unwrap());
        assert_eq!(std::fs::read(dir.path().join("version")).unwrap().get(..3), Some(&b"FJL"[..]));
    }

    #[test]
    fn a_version_marker_cut_short_is_a_creation_cut_short_too() {
        // fjall writes `FJL` and the version byte in two writes: a kill
        // between them leaves the magic alone, which fjall refuses.
        for partial in [&b"F"[..], b"FJ", b"FJL"] {
            let dir = tempfile::tempdir().unwrap();
            cut_short(dir.path());
            std::fs::write(dir.path().join("version"), partial).unwrap();
            assert!(fjall::Database::builder(dir.path()).open().is_err(), "fjall alone refuses it");
            drop(FjallBackend::open(dir.path()).unwrap());
            assert_eq!(std::fs::read(dir.path().join("version")).unwrap().get(..3), Some(&b"FJL"[..]));
        }
        // A marker that is not fjall's is left for fjall to judge.
        let dir = tempfile::tempdir().unwrap();
        cut_short(dir.path());
        std::fs::write(dir.path().join("version"), b"XY").unwrap();
        assert!(FjallBackend::open(dir.path()).is_err());
        assert_eq!(std::fs::read(dir.path().join("version")).unwrap(), b"XY", "left untouched");
    }

    #[test]
    fn a_directory_that_is_not_a_database_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        cut_short(dir.path());
        std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
        let err = FjallBackend::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("notes.txt") && err.contains(&dir.path().display().to_string()), "{err}");
        assert!(dir.path().join("notes.txt").exists() && dir.path().join("0.jnl").exists(), "nothing removed");
    }

    #[test]
    fn a_complete_database_opens_whatever_else_its_directory_holds() {
        let dir = tempfile::tempdir().unwrap();
        drop(FjallBackend::open(dir.path()).unwrap());
        std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
        std::fs::create_dir(dir.path().join("lost+found")).unwrap();
        drop(FjallBackend::open(dir.path()).unwrap());
        assert!(dir.path().join("notes.txt").exists());
    }

    #[test]
    fn a_volume_root_with_only_lost_and_found_gets_a_new_database() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("lost+found")).unwrap();
        drop(FjallBackend::open(dir.path()).unwrap());
        assert!(dir.path().join("version").exists() && dir.path().join("lost+found").is_dir());
    }

    #[test]
    fn an_empty_or_missing_directory_gets_a_new_database() {
        let dir = tempfile::tempdir().unwrap();
        drop(FjallBackend::open(dir.path()).unwrap());
        drop(FjallBackend::open(dir.path().join("new")).unwrap());
        assert!(dir.path().join("new/version").exists());
    }

    /// Scans stay in their key group: a group whose keys were all deleted
    /// scans empty (it does not run on into the groups after it), and the
    /// last key group (no group after it) scans to the table's end.
    #[test]
    fn a_scan_stays_in_its_key_group_past_deleted_keys() {
        let dir = tempfile::tempdir().unwrap();
        let backend = FjallBackend::open(dir.path()).unwrap();
        let scope = |groups: std::ops::Range<u16>| StateScope {
            job: "scan".into(),
            operator: "op".into(),
            state: "timers".into(),
            key_groups: groups,
            max_key_groups: u16::MAX,
        };
        let mut table = backend.open_table(&scope(0..u16::MAX)).unwrap();
        for k in 0u8..50 {
            table.put(3, &[k], b"v").unwrap();
            table.put(4, &[k], b"w").unwrap();
        }
        for k in 0u8..50 {
            table.delete(3, &[k]).unwrap();
        }
        table.put(u16::MAX, &[9], b"last").unwrap();
        let scan = |table: &mut Box<dyn StateTable>, group: u16, from: &[u8]| {
            let mut seen = Vec::new();
            table
                .scan_from(group, from, &mut |k, v| {
                    seen.push((k.to_vec(), v.to_vec()));
                    true
                })
                .unwrap();
            seen
        };
        assert!(scan(&mut table, 3, &[]).is_empty(), "every key of group 3 was deleted");
        let four = scan(&mut table, 4, &[10]);
        assert_eq!(four.len(), 40, "from key 10 on, only group 4's keys");
        assert!(four.iter().all(|(_, v)| v == b"w"));
        assert_eq!(scan(&mut table, u16::MAX, &[]), vec![(vec![9], b"last".to_vec())]);
        assert!(scan(&mut table, 5, &[]).is_empty());
    }
}
