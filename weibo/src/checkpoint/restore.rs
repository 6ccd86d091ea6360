//! Restoring: finding the checkpoint to start from, and reading its state
//! back for the operators.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use super::format::{Frame, StateFile, check_state_file, read_state_file, walk_state_file};
use super::manifest::{complete_checkpoints_in, read_manifest_in};
use super::storage::CheckpointStorage;
use super::{CommitEntry, OperatorEntry, SourcePositionEntry, StateFileEntry, bad, bad_caused, storage};
use crate::error::Result;
use crate::record::CheckpointId;

/// What a restored job starts from.
#[derive(Debug)]
pub(crate) struct Restore {
    pub(crate) checkpoint: CheckpointId,
    pub(crate) storage: Arc<dyn CheckpointStorage>,
    /// The checkpoint's (or savepoint's) directory in `storage`.
    pub(crate) dir: String,
    pub(crate) positions: HashMap<(String, u32), u64>,
    /// The same, as the manifest lists them (for sinks that commit them).
    pub(crate) sources: Vec<SourcePositionEntry>,
    /// Per operator: its state files.
    pub(crate) states: BTreeMap<String, Vec<StateFileEntry>>,
    /// Sink transactions the checkpoint committed.
    pub(crate) commits: Vec<CommitEntry>,
    /// The keyed operators the checkpoint recorded (none from earlier
    /// builds).
    pub(crate) operators: Vec<OperatorEntry>,
    /// The (operator id, state) pairs operators have read: after the job
    /// is built, any other the checkpoint holds was not restored.
    pub(crate) read: std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
    /// The schemas of the states' values, by id.
    pub(crate) schemas: BTreeMap<String, crate::codec::schema::Schema>,
    /// The migrations the job offers for earlier layouts of its states.
    pub(crate) migrations: Vec<Migration>,
    /// Entries migrated, per (operator id, state).
    pub(crate) migrated: std::sync::Mutex<Vec<(String, String, u64)>>,
    /// How far the restore is.
    pub(crate) progress: Progress,
}

/// How far a restore is: entries read of all its files hold, logged every
/// few seconds (a large state takes a while).
#[derive(Debug)]
pub(crate) struct Progress {
    /// Entries the checkpoint's files hold (0 when their manifest does not
    /// say: checkpoints of earlier builds).
    pub(crate) total: u64,
    done: std::sync::atomic::AtomicU64,
    started: std::time::Instant,
    logged: std::sync::Mutex<std::time::Instant>,
    /// A bar on stderr, when it is a terminal (feature `progress`).
    #[cfg(feature = "progress")]
    bar: Option<indicatif::ProgressBar>,
}

/// How often a restore logs its progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl Progress {
    fn new(total: u64) -> Self {
        let now = std::time::Instant::now();
        Self {
            total,
            done: std::sync::atomic::AtomicU64::new(0),
            started: now,
            logged: std::sync::Mutex::new(now),
            #[cfg(feature = "progress")]
            bar: Self::bar(total),
        }
    }

    /// A bar of `total` entries, if stderr is a terminal and the total
    /// is known. indicatif redraws it at most a few times a second.
    #[cfg(feature = "progress")]
    fn bar(total: u64) -> Option<indicatif::ProgressBar> {
        use std::io::IsTerminal as _;
        if total == 0 || !std::io::stderr().is_terminal() {
            return None;
        }
        let bar = indicatif::ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr());
        let style = indicatif::ProgressStyle::with_template(
            "restoring {bar:40} {human_pos}/{human_len} entries ({percent}%, {elapsed}, {eta} left)",
        );
        if let Ok(style) = style {
            bar.set_style(style);
        }
        Some(bar)
    }

    /// The restore is over: the bar (if any) goes.
    pub(crate) fn finish(&self) {
        #[cfg(feature = "progress")]
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// Entries read so far.
    pub(crate) fn done(&self) -> u64 {
        self.done.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Since the restore began.
    pub(crate) fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// Counts `n` entries read from checkpoint `checkpoint`; logs where the
    /// restore is if it has not for a while.
    fn read(&self, n: usize, checkpoint: CheckpointId) {
        let done = self.done.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed) + n as u64;
        #[cfg(feature = "progress")]
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
        let mut logged = self.logged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.elapsed() >= PROGRESS_EVERY {
            *logged = std::time::Instant::now();
            #[expect(clippy::cast_precision_loss, reason = "a percentage")]
            let percent = if self.total > 0 { (done as f64 * 100.0 / self.total as f64).min(100.0) } else { 0.0 };
            tracing::info!(checkpoint = checkpoint.get(), entries = done, of = self.total, percent = format!("{percent:.0}"),
                elapsed = ?self.started.elapsed(), "restoring");
        }
    }
}

/// A restore that failed leaves no bar behind either.
#[cfg(feature = "progress")]
impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A checkpoint as one operator restores from it: its state filed under
/// the operator's id (see [`Restore::for_operator`]).
pub(crate) struct OperatorRestore<'a> {
    restore: &'a Restore,
    id: &'a str,
    /// The version of the operator's state in the job (`Node::state_version`).
    version: u32,
    /// Only check each state against what the operator reads: pass no
    /// entries.
    checking: bool,
}

/// A state type's earlier layout and how to bring its values to the
/// current one (`Job::with_state_migration`).
#[derive(Clone)]
pub(crate) struct Migration {
    /// The operator whose state it migrates (`None`: any operator's state
    /// of its earlier layout).
    pub(crate) operator: Option<String>,
    pub(crate) from: crate::state::StateType,
    pub(crate) to: crate::state::StateType,
    pub(crate) convert: Arc<Convert>,
}

/// Brings one encoded value from a migration's earlier layout to its
/// current one.
pub(crate) type Convert = dyn Fn(&[u8]) -> std::result::Result<Vec<u8>, crate::codec::CodecError> + Send + Sync;

impl std::fmt::Debug for Migration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Migration({} -> {}", self.from.codec, self.to.codec)?;
        match &self.operator {
            Some(op) => write!(f, " for `{op}`)"),
            None => f.write_str(")"),
        }
    }
}

/// How the codec a state file names is checked against the one the
/// operator reads.
#[derive(Clone, Copy)]
pub(crate) struct CodecCheck<'a> {
    codec: &'a str,
    /// The schemas were compared (equal, or migrated): the codecs need
    /// only be of one format, whatever their types' names.
    by_format: bool,
}

impl CodecCheck<'_> {
    /// Accepts any codec (the inspector reads bytes, whatever wrote them).
    pub(crate) fn any() -> CodecCheck<'static> {
        CodecCheck { codec: "", by_format: false }
    }

    fn accepts(&self, written: &str) -> bool {
        if self.codec.is_empty() {
            return true;
        }
        let format = |c: &str| c.split('<').next().unwrap_or_default().to_string();
        if self.by_format { format(written) == format(self.codec) } else { written == self.codec }
    }
}

/// The clock a chain of state files recorded (see
/// [`StateFileEntry::expired_before`]): its newest file's, the highest.
fn chain_clock(files: &[&StateFileEntry], key_groups: (u16, u16)) -> Option<i64> {
    files.iter().filter(|f| f.key_groups == key_groups).filter_map(|f| f.expired_before).max()
}

impl crate::state::RestoreSource for OperatorRestore<'_> {
    /// `operator`, the name the operator knows itself by, is not used: the
    /// state is the one filed under the node's id. Before any file is
    /// read, the schemas the checkpoint recorded for the state are
    /// compared with `ty`'s: equal, the state restores; different, it
    /// restores through a migration from the recorded schema to `ty`'s,
    /// or is refused naming the first field that differs.
    fn load_entries(
        &self,
        _operator: &str,
        state: &str,
        ty: &crate::state::StateType,
        groups: &std::ops::Range<u16>,
        f: &mut crate::state::LoadPart<'_>,
    ) -> Result<()> {
        let (id, restore) = (self.id, self.restore);
        restore
            .read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((id.to_string(), state.to_string()));
        let files = restore.chain(id, state, groups)?;
        let recorded: std::collections::BTreeSet<&str> = files.iter().filter_map(|f| f.schema.as_deref()).collect();
        // One layout per state: a migration converts every entry.
        let layouts: Vec<&crate::codec::schema::Schema> =
            recorded.iter().filter_map(|id| restore.schemas.get(*id)).collect();
        if layouts.windows(2).any(|pair| matches!(pair, [a, b] if a.first_difference(b).is_some())) {
            return Err(bad(
                &restore.location(),
                format!("the files of state `{state}` of operator `{id}` were written with different layouts"),
            ));
        }
        // The user's version of the state: a changed one migrates even an
        // unchanged layout (its meaning changed).
        // A state declared with its own version records it in its files;
        // otherwise the operator's version is the state's.
        let was_version = files
            .iter()
            .find_map(|f| f.version)
            .unwrap_or_else(|| restore.operators.iter().find(|o| o.id == id).map_or(1, |o| o.state_version));
        let version = ty.version.unwrap_or(self.version);
        if ty.user && was_version > version && !files.is_empty() {
            return Err(bad(
                &restore.location(),
                format!(
                    "the state `{state}` of operator `{id}` is of version {was_version} in the checkpoint, the job \
                     reads version {version}: a savepoint of a later version does not restore into an earlier one"
                ),
            ));
        }
        let bumped = ty.user && was_version != version;
        if bumped && recorded.is_empty() && !files.is_empty() {
            return Err(bad(
                &restore.location(),
                format!(
                    "the state `{state}` of operator `{id}` is of version {was_version} in the checkpoint, the job \
                     reads version {version}, and the checkpoint records no layout to migrate it from"
                ),
            ));
        }
        let mut migration = None;
        for schema in &recorded {
            let Some(was) = restore.schemas.get(*schema) else {
                return Err(bad(
                    &restore.location(),
                    format!("the state `{state}` of `{id}` names schema {schema}, which its manifest does not hold"),
                ));
            };
            // Layouts, not names: a renamed type with the same fields
            // reads the same bytes.
            let difference = was.first_difference(&ty.schema);
            if difference.is_none() && !bumped {
                continue;
            }
            let same =
                |a: &crate::codec::schema::Schema, b: &crate::codec::schema::Schema| a.first_difference(b).is_none();
            // The codec's format (postcard, or one of Weibo's containers)
            // as well as the layout: a user's `struct Batch(Vec<T>)` has
            // the layout of a window's `Elements<T>`, not its encoding.
            let format = |codec: &str| codec.split('<').next().unwrap_or_default().to_string();
            let written = files.iter().find(|f| f.schema.as_deref() == Some(*schema)).and_then(|f| f.codec.as_deref());
            let encodes = |m: &Migration| {
                written.is_none_or(|w| format(w) == format(&m.from.codec)) && format(&m.to.codec) == format(&ty.codec)
            };
            // One for this operator first, then one for any operator.
            let found = |scope: Option<&str>| {
                restore.migrations.iter().find(|m| {
                    m.operator.as_deref() == scope
                        && same(&m.from.schema, was)
                        && same(&m.to.schema, &ty.schema)
                        && encodes(m)
                })
            };
            match found(Some(id)).or_else(|| found(None)) {
                Some(m) => migration = Some(m),
                None => {
                    let what = match difference {
                        Some(difference) => format!("was written with another layout than the job reads: {difference}"),
                        None => format!(
                            "is of version {was_version} in the checkpoint and the job reads version {version} (its \
                             layout did not change, its meaning did)"
                        ),
                    };
                    return Err(bad(
                        &restore.location(),
                        format!(
                            "the state `{state}` of operator `{id}` {what}. Restore it through a migration from its \
                             earlier type (`Job::with_state_migration`, or `Job::with_state_migration_for` this \
                             operator), or give the operator another id to start it empty"
                        ),
                    ));
                }
            }
        }
        if self.checking {
            return Ok(());
        }
        let check = CodecCheck { codec: &ty.codec, by_format: !recorded.is_empty() };
        let Some(m) = migration else {
            return restore.load_entries_of(id, state, check, groups, f);
        };
        // The chain (a base and its deltas) merged first, so that each key
        // is converted once, as the state holds it: converting each file's
        // entries as they are read would convert a key once per file it
        // appears in. A migration holds this instance's share of the state
        // in memory while it runs.
        let location = restore.location();
        let merged = restore.entries(id, state, check, groups)?;
        restore.progress.read(merged.len(), restore.checkpoint);
        let clock = restore.merged_clock(id, state, groups)?;
        let mut migrated = 0u64;
        for chunk in merged.chunks(MIGRATE_CHUNK) {
            let mut values = Vec::with_capacity(chunk.len());
            for (group, key, value) in chunk {
                values.push((m.convert)(value).map_err(|e| {
                    let key = crate::codec::schema::hex(key);
                    let what = format!("the entry of key {key} (key group {group}) of `{id}`/{state} does not migrate");
                    bad_caused(&location, what, e)
                })?);
            }
            let mut converted: Vec<crate::state::EntryRef<'_>> =
                chunk.iter().zip(&values).map(|((g, k, _), v)| (*g, k.as_slice(), v.as_slice())).collect();
            migrated += converted.len() as u64;
            f(&mut converted, &[], clock)?;
        }
        tracing::info!(operator = id, state, entries = migrated, from = %m.from.codec, to = %m.to.codec,
            "migrated state to the job's layout");
        restore.migrated.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((
            id.to_string(),
            state.to_string(),
            migrated,
        ));
        Ok(())
    }
}

/// Entries a migration converts and hands on at a time.
const MIGRATE_CHUNK: usize = 4096;

impl Restore {
    /// Reads checkpoint (or savepoint) `dir` in `storage` for a job with
    /// `max_key_groups`, and checks every state file it names. Which of
    /// its state goes to which operator is matched by id when the job is
    /// built (`runtime::matching`).
    pub(crate) fn load(storage: &Arc<dyn CheckpointStorage>, dir: &str, max_key_groups: u16) -> Result<Self> {
        let manifest = read_manifest_in(&**storage, dir)?;
        let located = storage.locate(dir);
        if manifest.max_key_groups != max_key_groups {
            return Err(bad(
                &located,
                format!(
                    "it was taken with {} key groups, the job has {max_key_groups}: key groups cannot change",
                    manifest.max_key_groups
                ),
            ));
        }
        // Read every state file once now, so that a corrupt one is found
        // before anything runs; none may lie outside the storage.
        for s in &manifest.states {
            let name = storage::join(dir, &s.file);
            if name.starts_with("..") || s.file.starts_with('/') {
                return Err(bad(&located, format!("its state file `{}` lies outside the checkpoint storage", s.file)));
            }
            check_state_file(&**storage, &name)?;
        }
        let total = manifest.states.iter().filter_map(|s| s.entries).sum();
        let mut states: BTreeMap<String, Vec<StateFileEntry>> = BTreeMap::new();
        for s in manifest.states {
            states.entry(s.operator.clone()).or_default().push(s);
        }
        Ok(Self {
            checkpoint: manifest.checkpoint,
            storage: storage.clone(),
            dir: dir.to_string(),
            positions: manifest.sources.iter().map(|s| ((s.source.clone(), s.partition), s.position)).collect(),
            sources: manifest.sources,
            states,
            commits: manifest.commits,
            operators: manifest.operators,
            read: std::sync::Mutex::default(),
            schemas: manifest.schemas,
            migrations: Vec::new(),
            migrated: std::sync::Mutex::default(),
            progress: Progress::new(total),
        })
    }

    /// The checkpoint as the operator with id `id` restores from it.
    /// `checking`: only check each state's schema, pass no entries.
    /// `version`: the version of its state in the job.
    pub(crate) fn for_operator<'a>(&'a self, id: &'a str, version: u32, checking: bool) -> OperatorRestore<'a> {
        OperatorRestore { restore: self, id, version, checking }
    }

    /// The newest complete checkpoint in `storage` under `dir` that loads,
    /// falling back to older ones when one is damaged (each failure is
    /// logged).
    pub(crate) fn latest(storage: &Arc<dyn CheckpointStorage>, dir: &str, max_key_groups: u16) -> Result<Option<Self>> {
        let mut last_error = None;
        for (_, checkpoint) in complete_checkpoints_in(&**storage, dir)? {
            match Self::load(storage, &checkpoint, max_key_groups) {
                Ok(r) => return Ok(Some(r)),
                Err(e) => {
                    tracing::warn!(checkpoint = %storage.locate(&checkpoint).display(), error = %e.report(), "cannot restore; trying an older one");
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

    /// Where the checkpoint is, for logs and errors.
    pub(crate) fn location(&self) -> PathBuf {
        self.storage.locate(&self.dir)
    }

    /// Reads state file `file` (relative to the checkpoint), whose values
    /// must have been written with a codec `check` accepts.
    fn read_checked(&self, file: &str, check: CodecCheck<'_>) -> Result<StateFile> {
        let name = storage::join(&self.dir, file);
        let file = read_state_file(&*self.storage, &name)?;
        if !check.accepts(&file.codec) {
            return Err(bad(
                &self.storage.locate(&name),
                format!("its values were written with codec {}, the job reads {}", file.codec, check.codec),
            ));
        }
        Ok(file)
    }

    /// The files of `operator`'s `state` that hold key groups of `groups`,
    /// in checkpoint order, each delta after a base of its key groups.
    fn chain(&self, operator: &str, state: &str, groups: &std::ops::Range<u16>) -> Result<Vec<&StateFileEntry>> {
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
                    &self.location(),
                    format!(
                        "the delta {} of `{operator}`/{state} (key groups {:?}) has no base before it",
                        s.file, s.key_groups
                    ),
                ));
            }
        }
        Ok(files)
    }

    /// The clock recorded with the chains of `operator`'s `state` in key
    /// groups `groups`, for their entries merged in one: the earliest of
    /// the chains' (an entry expired in one chain's clock may have been
    /// live in another's), if every chain recorded one.
    fn merged_clock(&self, operator: &str, state: &str, groups: &std::ops::Range<u16>) -> Result<Option<i64>> {
        let files = self.chain(operator, state, groups)?;
        let clocks: Option<Vec<i64>> = files.iter().map(|f| chain_clock(&files, f.key_groups)).collect();
        Ok(clocks.and_then(|c| c.into_iter().min()))
    }

    /// Passes the entries of `operator`'s `state` in key groups `groups` to
    /// `f` a part at a time, as (entries to put, keys to remove first), so
    /// that the whole state is never in memory: each file of its chain in
    /// checkpoint order, each base or delta part as written, its bytes
    /// borrowed from the frame read in place. Applying the parts in order
    /// (removals, then puts) gives the state. Chains whose bases overlap
    /// (none that this build writes) are merged in memory and passed whole.
    pub(crate) fn load_entries_of(
        &self,
        operator: &str,
        state: &str,
        check: CodecCheck<'_>,
        groups: &std::ops::Range<u16>,
        f: &mut crate::state::LoadPart<'_>,
    ) -> Result<()> {
        let files = self.chain(operator, state, groups)?;
        let bases: Vec<(u16, u16)> = files.iter().filter(|s| s.base).map(|s| s.key_groups).collect();
        let overlapping =
            bases.iter().enumerate().any(|(i, a)| bases.iter().skip(i + 1).any(|b| a.0 < b.1 && b.0 < a.1));
        if overlapping {
            let merged = self.entries(operator, state, check, groups)?;
            self.progress.read(merged.len(), self.checkpoint);
            return f(&mut crate::state::entry_refs(&merged), &[], self.merged_clock(operator, state, groups)?);
        }
        for s in &files {
            let clock = chain_clock(&files, s.key_groups);
            let name = storage::join(&self.dir, &s.file);
            let path = self.storage.locate(&name);
            let mut first = true;
            walk_state_file(&*self.storage, &name, &mut |frame| {
                if std::mem::take(&mut first)
                    && let Frame::File(file) = &frame
                    && !check.accepts(&file.codec)
                {
                    return Err(bad(
                        &path,
                        format!("its values were written with codec {}, the job reads {}", file.codec, check.codec),
                    ));
                }
                let (mut entries, removed) = frame.entries_in(groups);
                if entries.is_empty() && removed.is_empty() {
                    return Ok(());
                }
                self.progress.read(entries.len(), self.checkpoint);
                f(&mut entries, &removed, clock)
            })?;
        }
        Ok(())
    }

    /// The entries of `operator`'s `state` in key groups `groups`, merged
    /// in memory.
    pub(crate) fn entries(
        &self,
        operator: &str,
        state: &str,
        check: CodecCheck<'_>,
        groups: &std::ops::Range<u16>,
    ) -> Result<crate::state::Entries> {
        // Chains in checkpoint order: a base replaces its key groups'
        // entries, a delta removes and then puts.
        let files = self.chain(operator, state, groups)?;
        // Only bases, one per key-group range: nothing to merge.
        let mut ranges: Vec<(u16, u16)> = files.iter().map(|s| s.key_groups).collect();
        ranges.sort_unstable();
        ranges.dedup();
        if files.iter().all(|s| s.base) && ranges.len() == files.len() {
            let mut out = Vec::new();
            for s in files {
                let file = self.read_checked(&s.file, check)?;
                for g in file.groups.into_iter().filter(|g| groups.contains(&g.group)) {
                    out.extend(g.entries.into_iter().map(|(k, v)| (g.group, k, v)));
                }
            }
            return Ok(out);
        }
        let mut merged: BTreeMap<(u16, Vec<u8>), Vec<u8>> = BTreeMap::new();
        for s in files {
            let file = self.read_checked(&s.file, check)?;
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
