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
//! manifest, atomically: only then is the checkpoint complete, and only
//! complete checkpoints are restored from.
//!
//! Checkpoints go to a [`CheckpointStorage`]: a local directory
//! ([`LocalDir`]), memory ([`MemoryStorage`]), or an object store. Its
//! layout:
//!
//! ```text
//! chk-00000000000000000007/MANIFEST   JSON: positions, state files, fingerprint, commits
//! shared/<operator>-<instance>-<state>-<checkpoint>-<run>.state
//! savepoints/<name>/                 a manifest and copies of its state files
//! ```
//!
//! State files are shared between checkpoints: value state is written
//! incrementally (a base every few checkpoints, deltas between), and a
//! manifest lists each state's chain of files.
//!
//! A state file (version 4, written now) is a 16-byte head — magic
//! `WEIBOSTA`, state-file version (u32 LE), reserved (u32) — then the
//! payload, then a 24-byte trailer: the payload's length (u64 LE), its
//! xxh3-64 (u64 LE) and `WEIBOEND`. With length and checksum at the end, a
//! file is written front to back in one pass, as an object store's upload
//! streams. The payload is a sequence of frames, each a length (u64 LE) and
//! an rkyv archive: the first a [`StateFile`] naming the state and its
//! codec, the others each a [`SnapshotFrame`] carrying entries a chunk at a time
//! (a key group, or part of one), their keys and values concatenated with
//! their end offsets, so neither writing nor reading a file holds all of it
//! in memory, and writing costs a few allocations per frame, not two per
//! entry. Versions 1 to 3 (still read) have a 32-byte header instead — the
//! head, the payload's length and checksum — and no trailer; version 3's
//! frames are version 4's, version 2's frames are each a [`StateFile`], and
//! in version 1 the payload is one archive. Each frame is read into an
//! aligned buffer and validated (archive and offsets) before use, after the
//! whole payload's length and checksum were checked.

#[doc(hidden)]
pub(crate) mod aligner;
pub(crate) mod commit;
pub mod faults;
pub(crate) mod naming;
pub mod storage;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

pub(crate) use self::naming::{checkpoint_name, checkpoint_number, run_token, written_by};
pub use self::storage::{CheckpointStorage, LocalDir, MemoryStorage, ObjectReader, ObjectWriter};
use crate::error::{Error, Result};
use crate::state::SnapshotFrame;
use crate::state::{ArchivedSnapshotFrame, slices};

/// The version of the manifest and state-file formats this build writes
/// and reads.
pub const FORMAT_VERSION: u32 = 1;

const MAGIC: &[u8; 8] = b"WEIBOSTA";
/// Magic, version and a reserved word: a state file's first bytes.
const HEAD: usize = 16;
/// The header of versions 1 to 3: the head, the payload's length and checksum.
const OLD_HEADER: usize = 32;
/// Version 4's trailer: the payload's length and checksum, and `END_MAGIC`.
const TRAILER: usize = 24;
const END_MAGIC: &[u8; 8] = b"WEIBOEND";
/// The name of a checkpoint's manifest, in its directory.
const MANIFEST: &str = "MANIFEST";

/// The state-file version this build writes (frames of concatenated
/// entries, length and checksum in a trailer); it reads 1 to 4.
const STATE_FILE_VERSION: u32 = 4;

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

/// The entries and removed keys, of a frame (versions 3 and 4), by key group (in the order
/// they come), checked: `None` if its offsets are inconsistent.
fn archived_part_as_file(part: &ArchivedSnapshotFrame) -> Option<StateFile> {
    fn by_group<'a>(
        groups: impl Iterator<Item = u16>,
        mut items: impl Iterator<Item = Option<&'a [u8]>>,
        mut push: impl FnMut(u16, &'a [u8]),
    ) -> Option<()> {
        for g in groups {
            push(g, items.next()??);
        }
        items.next().is_none().then_some(())
    }
    let n = part.groups.len();
    if part.key_ends.len() != n || part.value_ends.len() != n || part.removed_ends.len() != part.removed_groups.len() {
        return None;
    }
    // Every byte belongs to an entry: the last end is the buffer's length.
    let ends_at = |ends: &rkyv::vec::ArchivedVec<rkyv::rend::u32_le>, len: usize| {
        ends.last().map_or(0, |e| e.to_native() as usize) == len
    };
    if !ends_at(&part.key_ends, part.keys.len())
        || !ends_at(&part.value_ends, part.values.len())
        || !ends_at(&part.removed_ends, part.removed.len())
    {
        return None;
    }
    let mut groups: Vec<GroupEntries> = Vec::new();
    let keys = slices(&part.keys, part.key_ends.iter().map(|e| e.to_native()));
    let values = slices(&part.values, part.value_ends.iter().map(|e| e.to_native()));
    let mut pairs = keys.zip(values).map(|(k, v)| Some((k?, v?)));
    for g in part.groups.iter().map(|g| g.to_native()) {
        let (k, v) = pairs.next()??;
        match groups.last_mut() {
            Some(last) if last.group == g => last.entries.push((k.to_vec(), v.to_vec())),
            _ => groups.push(GroupEntries { group: g, entries: vec![(k.to_vec(), v.to_vec())] }),
        }
    }
    let mut removed: Vec<GroupKeys> = Vec::new();
    by_group(
        part.removed_groups.iter().map(|g| g.to_native()),
        slices(&part.removed, part.removed_ends.iter().map(|e| e.to_native())),
        |g, k| match removed.last_mut() {
            Some(last) if last.group == g => last.keys.push(k.to_vec()),
            _ => removed.push(GroupKeys { group: g, keys: vec![k.to_vec()] }),
        },
    )?;
    Some(StateFile { operator: String::new(), state: String::new(), codec: String::new(), groups, removed })
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

/// The directory, beside the checkpoints, that holds savepoints.
pub const SAVEPOINTS: &str = "savepoints";

/// A source partition's position in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePositionEntry {
    /// The source's name.
    pub source: String,
    /// The partition.
    pub partition: u32,
    /// Where reading resumes.
    pub position: u64,
    /// What the partition is outside Weibo, when the source names it (see
    /// [`Source::partition_name`](crate::sources::Source::partition_name)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_name: Option<String>,
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
    pub(crate) storage: Arc<dyn CheckpointStorage>,
    pub(crate) interval: Duration,
    pub(crate) retain: usize,
    /// How long a checkpoint may take before it is abandoned; `None`: ten
    /// intervals, at least a minute.
    pub(crate) timeout: Option<Duration>,
}

fn io(action: &'static str, path: PathBuf) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { action, path, source }
}

fn bad(path: &Path, what: String) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), message: what }
}

/// Writes the state of one task (`operator`'s instance `instance`, owning
/// key groups `groups`) for checkpoint `n`: a file per state, a frame per
/// part of its snapshot, so the state is never all in memory, encoded or
/// not. Returns the manifest's entries for the files. Blocks.
pub(crate) fn write_task_state(
    storage: &dyn CheckpointStorage,
    run: &str,
    operator: &str,
    instance: usize,
    groups: &std::ops::Range<u16>,
    n: u64,
    snapshots: Vec<crate::state::StateSnapshot>,
) -> Result<Vec<StateFileEntry>> {
    let mut files = Vec::new();
    for snap in snapshots {
        let (name, in_manifest) = naming::state_file(operator, instance, snap.state, n, run);
        let meta = StateFile {
            operator: operator.to_string(),
            state: snap.state.to_string(),
            codec: snap.codec,
            groups: Vec::new(),
            removed: Vec::new(),
        };
        let mut writer = StateFileWriter::create(storage, &name, &meta)?;
        let base = (snap.snapshot)(&mut |part| writer.part(&part.part))?;
        writer.finish()?;
        files.push(StateFileEntry {
            operator: operator.to_string(),
            state: snap.state.to_string(),
            file: in_manifest,
            key_groups: (groups.start, groups.end),
            checkpoint: n,
            base,
        });
    }
    Ok(files)
}

/// Writes a state file frame by frame, front to back (the length and
/// checksum go in a trailer), so that it streams to any storage.
pub(crate) struct StateFileWriter {
    out: Box<dyn ObjectWriter>,
    hasher: xxhash_rust::xxh3::Xxh3,
    len: u64,
    path: PathBuf,
}

impl StateFileWriter {
    /// Creates object `name` in `storage`, with a first frame naming the
    /// state (`meta`).
    pub(crate) fn create(storage: &dyn CheckpointStorage, name: &str, meta: &StateFile) -> Result<Self> {
        let path = storage.locate(name);
        let mut out = storage.create(name).map_err(io("cannot create checkpoint file", path.clone()))?;
        let mut head = Vec::with_capacity(HEAD);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&STATE_FILE_VERSION.to_le_bytes());
        head.extend_from_slice(&0u32.to_le_bytes());
        out.write_all(&head).map_err(io("cannot write checkpoint file", path.clone()))?;
        let mut writer = Self { out, hasher: xxhash_rust::xxh3::Xxh3::new(), len: 0, path };
        writer.frame(meta)?;
        Ok(writer)
    }

    /// Appends a frame holding a [`StateFile`] (the first frame; every
    /// frame in version 2).
    pub(crate) fn frame(&mut self, part: &StateFile) -> Result<()> {
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(part)
            .map_err(|e| bad(&self.path, format!("cannot encode the state: {e}")))?;
        self.raw_frame(&bytes)
    }

    /// Appends a frame holding entries (versions 3 and 4).
    pub(crate) fn part(&mut self, part: &SnapshotFrame) -> Result<()> {
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(part)
            .map_err(|e| bad(&self.path, format!("cannot encode the state: {e}")))?;
        self.raw_frame(&bytes)
    }

    fn raw_frame(&mut self, bytes: &[u8]) -> Result<()> {
        let len = (bytes.len() as u64).to_le_bytes();
        self.hasher.update(&len);
        self.hasher.update(bytes);
        self.out.write_all(&len).map_err(io("cannot write checkpoint file", self.path.clone()))?;
        self.out.write_all(bytes).map_err(io("cannot write checkpoint file", self.path.clone()))?;
        self.len += 8 + bytes.len() as u64;
        Ok(())
    }

    /// Writes the trailer and completes the object.
    pub(crate) fn finish(mut self) -> Result<()> {
        let mut trailer = Vec::with_capacity(TRAILER);
        trailer.extend_from_slice(&self.len.to_le_bytes());
        trailer.extend_from_slice(&self.hasher.digest().to_le_bytes());
        trailer.extend_from_slice(END_MAGIC);
        self.out.write_all(&trailer).map_err(io("cannot write checkpoint file", self.path.clone()))?;
        self.out.finish().map_err(io("cannot complete checkpoint file", self.path))
    }
}

/// Writes a whole state file (its state's name, then its entries in one
/// frame).
#[cfg(test)]
pub(crate) fn write_state_file(storage: &dyn CheckpointStorage, name: &str, file: &StateFile) -> Result<()> {
    let meta = StateFile {
        operator: file.operator.clone(),
        state: file.state.clone(),
        codec: file.codec.clone(),
        groups: Vec::new(),
        removed: Vec::new(),
    };
    let mut part = SnapshotFrame::default();
    for g in &file.groups {
        for (k, v) in &g.entries {
            part.push(g.group, k, v)?;
        }
    }
    for r in &file.removed {
        for k in &r.keys {
            part.push_removed(r.group, k)?;
        }
    }
    let mut writer = StateFileWriter::create(storage, name, &meta)?;
    writer.part(&part)?;
    writer.finish()
}

/// A state file's payload, read through a buffer.
type Payload = std::io::BufReader<Box<dyn ObjectReader>>;

/// Opens a state file and checks its head, its length and the checksum of
/// its payload (read in pieces); returns its version, its payload's length
/// and the file, positioned at the payload.
fn open_checked(storage: &dyn CheckpointStorage, name: &str) -> Result<(u32, u64, Payload)> {
    use std::io::{Read, Seek, SeekFrom};
    let path = storage.locate(name);
    let read_error = || io("cannot read checkpoint file", path.clone());
    let mut file = storage.open(name).map_err(read_error())?;
    let size = file.seek(SeekFrom::End(0)).map_err(read_error())?;
    file.seek(SeekFrom::Start(0)).map_err(read_error())?;
    let field = |bytes: &[u8], at: usize| -> u64 {
        let mut b = [0u8; 8];
        if let Some(s) = bytes.get(at..at + 8) {
            b.copy_from_slice(s);
        }
        u64::from_le_bytes(b)
    };
    let mut head = [0u8; HEAD];
    if size < HEAD as u64 {
        return Err(bad(&path, format!("truncated: {size} bytes, shorter than the header")));
    }
    file.read_exact(&mut head).map_err(read_error())?;
    if head.get(..8) != Some(MAGIC.as_slice()) {
        return Err(bad(&path, "not a Weibo state file (wrong magic)".into()));
    }
    let version = field(&head, 8) as u32;
    if !(1..=STATE_FILE_VERSION).contains(&version) {
        return Err(bad(
            &path,
            format!("format version {version}, this build reads versions 1 to {STATE_FILE_VERSION}"),
        ));
    }
    // Versions 1 to 3: length and checksum in a 32-byte header; version 4:
    // in a trailer.
    let (start, len, sum) = if version <= 3 {
        let mut rest = [0u8; OLD_HEADER - HEAD];
        if size < OLD_HEADER as u64 {
            return Err(bad(&path, format!("truncated: {size} bytes, shorter than the header")));
        }
        file.read_exact(&mut rest).map_err(read_error())?;
        (OLD_HEADER as u64, field(&rest, 0), field(&rest, 8))
    } else {
        let mut trailer = [0u8; TRAILER];
        if size < (HEAD + TRAILER) as u64 {
            return Err(bad(&path, format!("truncated: {size} bytes, shorter than its header and trailer")));
        }
        file.seek(SeekFrom::Start(size - TRAILER as u64)).map_err(read_error())?;
        file.read_exact(&mut trailer).map_err(read_error())?;
        if trailer.get(16..) != Some(END_MAGIC.as_slice()) {
            return Err(bad(&path, "truncated: the trailer (length and checksum) is missing".into()));
        }
        (HEAD as u64, field(&trailer, 0), field(&trailer, 8))
    };
    let payload = size - start - if version <= 3 { 0 } else { TRAILER as u64 };
    if len != payload {
        return Err(bad(&path, format!("truncated: the file says {len} payload bytes, it has {payload}")));
    }
    file.seek(SeekFrom::Start(start)).map_err(read_error())?;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        let chunk = buf.get_mut(..want).unwrap_or_default();
        file.read_exact(chunk).map_err(read_error())?;
        hasher.update(chunk);
        left -= want as u64;
    }
    if sum != hasher.digest() {
        return Err(bad(&path, "checksum mismatch: the file is corrupt".into()));
    }
    file.seek(SeekFrom::Start(start)).map_err(read_error())?;
    Ok((version, len, std::io::BufReader::with_capacity(1 << 20, file)))
}

/// Reads `len` bytes into an aligned buffer (`what` names the part in errors).
fn read_aligned(
    path: &Path,
    input: &mut impl std::io::Read,
    len: u64,
    what: &str,
) -> Result<rkyv::util::AlignedVec<16>> {
    let len = usize::try_from(len).map_err(|_| bad(path, format!("{what} is {len} bytes long")))?;
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(len);
    aligned.resize(len, 0);
    input.read_exact(&mut aligned).map_err(|e| bad(path, format!("{what} is cut short: {e}")))?;
    Ok(aligned)
}

/// Reads `len` bytes into an aligned buffer and validates them as a
/// [`StateFile`] archive (`what` names the part in errors).
fn read_archive(path: &Path, input: &mut impl std::io::Read, len: u64, what: &str) -> Result<StateFile> {
    let aligned = read_aligned(path, input, len, what)?;
    rkyv::from_bytes::<StateFile, rkyv::rancor::Error>(&aligned)
        .map_err(|e| bad(path, format!("{what} does not validate: {e}")))
}

/// Reads `len` bytes into an aligned buffer and validates them as a
/// [`SnapshotFrame`] archive with consistent offsets; returns its entries by
/// key group.
fn read_part_archive(path: &Path, input: &mut impl std::io::Read, len: u64, what: &str) -> Result<StateFile> {
    let aligned = read_aligned(path, input, len, what)?;
    let part = rkyv::access::<ArchivedSnapshotFrame, rkyv::rancor::Error>(&aligned)
        .map_err(|e| bad(path, format!("{what} does not validate: {e}")))?;
    archived_part_as_file(part)
        .ok_or_else(|| bad(path, format!("{what} does not validate: its entries' offsets are inconsistent")))
}

/// Checks state file `name` (header, length, checksum), then passes its
/// parts to `f` one at a time: first the part naming the state and codec,
/// then the parts holding entries (a version-1 file is one part holding
/// both; the entries of version 3's and 4's frames come grouped by key
/// group, in their order).
pub(crate) fn read_state_file_parts(
    storage: &dyn CheckpointStorage,
    name: &str,
    f: &mut dyn FnMut(StateFile) -> Result<()>,
) -> Result<()> {
    use std::io::Read;
    let path = storage.locate(name);
    let (version, mut left, mut input) = open_checked(storage, name)?;
    if version == 1 {
        let mut payload = Vec::new();
        input.read_to_end(&mut payload).map_err(io("cannot read checkpoint file", path.clone()))?;
        return f(read_archive(&path, &mut payload.as_slice(), payload.len() as u64, "the state")?);
    }
    let mut index = 0usize;
    loop {
        if left == 0 && index > 0 {
            return Ok(());
        }
        let mut len = [0u8; 8];
        if left < 8 {
            return Err(bad(&path, format!("frame {index} is cut short: {left} bytes left, a frame's length takes 8")));
        }
        input.read_exact(&mut len).map_err(|e| bad(&path, format!("frame {index} is cut short: {e}")))?;
        let len = u64::from_le_bytes(len);
        left -= 8;
        if len > left {
            return Err(bad(&path, format!("frame {index} claims {len} bytes, the file has {left} left")));
        }
        left -= len;
        let what = format!("frame {index}");
        f(if version >= 3 && index > 0 {
            read_part_archive(&path, &mut input, len, &what)?
        } else {
            read_archive(&path, &mut input, len, &what)?
        })?;
        index += 1;
    }
}

/// Reads and checks a whole state file.
pub(crate) fn read_state_file(storage: &dyn CheckpointStorage, name: &str) -> Result<StateFile> {
    let mut whole: Option<StateFile> = None;
    read_state_file_parts(storage, name, &mut |part| {
        match whole.as_mut() {
            None => whole = Some(part),
            Some(w) => {
                w.groups.extend(part.groups);
                w.removed.extend(part.removed);
            }
        }
        Ok(())
    })?;
    whole.ok_or_else(|| bad(&storage.locate(name), "the file holds no state".into()))
}

/// Writes the manifest of checkpoint (or savepoint) `dir` atomically: only
/// a checkpoint with a manifest is complete.
pub(crate) fn write_manifest(storage: &dyn CheckpointStorage, dir: &str, manifest: &Manifest) -> Result<()> {
    let name = storage::join(dir, MANIFEST);
    let path = storage.locate(&name);
    let json = serde_json::to_vec_pretty(manifest).map_err(|e| bad(&path, format!("cannot encode: {e}")))?;
    storage.put(&name, &json).map_err(io("cannot publish checkpoint manifest", path))
}

/// Reads the manifest of checkpoint (or savepoint) `dir` in `storage` and
/// checks its version.
///
/// # Errors
/// When it cannot be read, is not a manifest, or has another format version.
pub fn read_manifest_in(storage: &dyn CheckpointStorage, dir: &str) -> Result<Manifest> {
    let name = storage::join(dir, MANIFEST);
    let path = storage.locate(&name);
    let mut bytes = Vec::new();
    storage
        .open(&name)
        .and_then(|mut r| r.read_to_end(&mut bytes))
        .map_err(io("cannot read checkpoint manifest", path.clone()))?;
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

/// Reads the manifest of the checkpoint (or savepoint) in directory `dir`
/// and checks its version.
///
/// # Errors
/// As [`read_manifest_in`].
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    read_manifest_in(&LocalDir::new(dir), "")
}

/// The highest checkpoint number in `storage`, complete or not (0 if
/// none): of a manifest, or of a state file a checkpoint in flight wrote.
pub(crate) fn highest_checkpoint(storage: &dyn CheckpointStorage) -> Result<u64> {
    let list = |prefix: &str| storage.list(prefix).map_err(io("cannot list checkpoints", storage.locate(prefix)));
    let checkpoints = list("chk-")?.into_iter().filter_map(|n| checkpoint_number(n.split('/').next()?));
    let files = list(&format!("{SHARED}/"))?.into_iter().filter_map(|n| written_by(&n));
    Ok(checkpoints.chain(files).max().unwrap_or(0))
}

/// The complete checkpoints in `storage` under `dir` (`""` for the top),
/// newest first: their numbers and directories' names.
///
/// # Errors
/// When the storage cannot be listed.
pub fn complete_checkpoints_in(storage: &dyn CheckpointStorage, dir: &str) -> Result<Vec<(u64, String)>> {
    let prefix = storage::join(dir, "chk-");
    let names = storage.list(&prefix).map_err(io("cannot list checkpoints", storage.locate(&prefix)))?;
    let mut found: Vec<(u64, String)> = names
        .into_iter()
        .filter_map(|name| {
            let checkpoint = name.strip_suffix(MANIFEST)?.strip_suffix('/')?;
            let n = checkpoint_number(checkpoint.rsplit('/').next()?)?;
            Some((n, checkpoint.to_string()))
        })
        .collect();
    found.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    Ok(found)
}

/// The complete checkpoints in directory `root`, newest first (none when
/// it cannot be read).
pub fn complete_checkpoints(root: &Path) -> Vec<(u64, PathBuf)> {
    complete_checkpoints_in(&LocalDir::new(root), "")
        .unwrap_or_default()
        .into_iter()
        .map(|(n, dir)| (n, root.join(dir)))
        .collect()
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
    pub(crate) max_key_groups: u16,
    /// One per source task; dropped when the job is done with
    /// checkpoints, which lets sources at their end stop.
    pub(crate) triggers: Vec<mpsc::UnboundedSender<u64>>,
    pub(crate) events: mpsc::UnboundedReceiver<TaskEvent>,
    /// How many acknowledgements complete a checkpoint (one per task).
    pub(crate) tasks: usize,
    /// The first checkpoint number to use (after the restored one).
    pub(crate) next: u64,
    pub(crate) completed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub(crate) commits: commit::TwoPhaseCommits,
    /// Transactions whose commit failed: carried into the next manifest.

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

/// Why no checkpoint or savepoint can be taken once every source has
/// reached its end (the final checkpoint is, or was, being taken).
pub(crate) const ALL_SOURCES_ENDED: &str =
    "every source has reached the end of its input: the job is finishing with its final checkpoint, and takes no other";

/// How a checkpoint attempt ended.
enum Outcome {
    Complete,
    /// Abandoned or failed, with the reason.
    Failed(String),
    /// The job is ending: stop.
    Stopped,
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
                            let _ = request.reply.send(Err(Error::Runtime { job: self.job.clone(), message: ALL_SOURCES_ENDED.into() }));
                            continue;
                        }
                        Some(request) => Some(request),
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
                tracing::info!(job = %self.job, checkpoint = n, "every source has reached its end: taking the final checkpoint");
            }
            let mut triggered = false;
            for t in &self.triggers {
                triggered |= t.send(n).is_ok();
            }
            if !triggered {
                // The sources are gone: the job is failing or cancelled.
                if let Some(request) = savepoint {
                    let _ = request.reply.send(Err(Error::Runtime {
                        job: self.job.clone(),
                        message: "the job's sources have stopped".into(),
                    }));
                }
                return Ok(());
            }
            if is_final {
                faults::point("final-barrier");
            }
            let outcome = self.take(n, is_final, timeout, &mut ended, &mut stop).await;
            let reply = match &outcome {
                Outcome::Complete => match savepoint.as_ref().and_then(|r| r.name.clone()) {
                    Some(name) => self.copy_to_savepoint(n, &name),
                    None => Ok(self.config.storage.locate(&checkpoint_name(n))),
                },
                Outcome::Failed(why) => Err(Error::Checkpoint {
                    path: self.config.storage.locate(&checkpoint_name(n)),
                    message: why.clone(),
                }),
                Outcome::Stopped => Err(Error::Runtime {
                    job: self.job.clone(),
                    message: "the job stopped before the checkpoint completed".into(),
                }),
            };
            if let Some(request) = savepoint {
                let _ = request.reply.send(reply);
            }
            match outcome {
                Outcome::Stopped => return Ok(()),
                Outcome::Complete if is_final => {
                    let committed = self.commit_leftovers(n).await;
                    // Requests that came meanwhile: the job is done.
                    while let Ok(request) = self.savepoints.try_recv() {
                        let _ = request
                            .reply
                            .send(Err(Error::Runtime { job: self.job.clone(), message: ALL_SOURCES_ENDED.into() }));
                    }
                    committed?;
                    tracing::info!(job = %self.job, checkpoint = n, "final checkpoint complete");
                    return Ok(());
                }
                Outcome::Complete => {}
                Outcome::Failed(why) => {
                    if is_final {
                        tracing::warn!(job = %self.job, checkpoint = n, reason = %why, "the final checkpoint failed; taking it again");
                        final_failure = why;
                        final_failures += 1;
                        final_backoff = (final_backoff * 2).min(self.config.interval.min(Duration::from_secs(5)));
                    }
                }
            }
            n += 1;
        }
    }

    /// Collects every task's part in checkpoint `n` and completes it.
    async fn take(
        &mut self,
        n: u64,
        is_final: bool,
        timeout: Duration,
        ended: &mut std::collections::BTreeSet<String>,
        stop: &mut tokio::sync::oneshot::Receiver<()>,
    ) -> Outcome {
        let mut acks: BTreeMap<String, Ack> = BTreeMap::new();
        // A checkpoint that cannot complete in time (a task stuck in user
        // code, a task that failed to take its part) is abandoned.
        let deadline = tokio::time::Instant::now() + timeout;
        while acks.len() < self.tasks {
            let event = tokio::select! {
                _ = &mut *stop => return Outcome::Stopped,
                () = tokio::time::sleep_until(deadline) => break,
                event = self.events.recv() => event,
            };
            match event {
                Some(TaskEvent::Ack(ack)) if ack.checkpoint == n => {
                    acks.insert(ack.task.clone(), ack);
                }
                Some(TaskEvent::Ack(_)) => {}
                Some(TaskEvent::SourceEnded { task }) => {
                    ended.insert(task);
                }
                None => return Outcome::Stopped,
            }
        }
        if acks.len() < self.tasks {
            let missing = self.tasks - acks.len();
            tracing::warn!(job = %self.job, checkpoint = n, missing, "checkpoint abandoned: not every task acknowledged in time");
            return Outcome::Failed(format!(
                "checkpoint {n} did not complete in time: abandoned after {timeout:?}, with {missing} of {} tasks yet to take their part",
                self.tasks
            ));
        }
        match self.complete(n, acks.into_values().collect(), is_final) {
            Ok(()) => {
                self.completed.store(n, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(job = %self.job, checkpoint = n, "checkpoint complete");
                Outcome::Complete
            }
            Err(e) => {
                tracing::warn!(job = %self.job, checkpoint = n, error = %e, "checkpoint failed");
                Outcome::Failed(e.to_string())
            }
        }
    }

    /// After the final checkpoint `n`: commits that failed with it are
    /// tried a few more times (there is no later checkpoint to carry them);
    /// if they still fail, the job fails, and its next start commits them
    /// (they are in the final checkpoint's manifest).
    async fn commit_leftovers(&mut self, n: u64) -> Result<()> {
        match self.commits.retry_leftovers().await {
            None => Ok(()),
            Some((entry, owed)) => Err(Error::Checkpoint {
                path: self.config.storage.locate(&checkpoint_name(n)),
                message: format!(
                    "the final checkpoint is complete, but sink `{}` could not commit `{}` (and {} more): the job's next start commits them",
                    entry.sink,
                    entry.handle,
                    owed - 1
                ),
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
        }
    }

    fn complete(&mut self, n: u64, acks: Vec<Ack>, is_final: bool) -> Result<()> {
        let name = checkpoint_name(n);
        let dir = self.config.storage.locate(&name);
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
        let commits = self.commits.collect(n);
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            job: self.job.clone(),
            checkpoint: n,
            graph_fingerprint: self.fingerprint.clone(),
            max_key_groups: self.max_key_groups,
            sources,
            states,
            commits: commits.entries.clone(),
        };
        if let Err(e) = crate::task::blocking(|| write_manifest(&*self.config.storage, &name, &manifest)) {
            // Not complete: its transactions (and those carried from
            // before) are committed with the next checkpoint that is.
            self.commits.keep(commits);
            return Err(e);
        }
        faults::point(if is_final { "after-final-manifest" } else { "after-manifest" });
        let positions = manifest.sources.clone();
        self.previous = Some(manifest);
        // The checkpoint is complete: now the sinks may show its records.
        // Commits wait on external systems: off the runtime's workers.
        crate::task::blocking(|| {
            let count = self.commits.commit_completed(commits, &positions, || {
                faults::point(if is_final { "between-final-commits" } else { "between-commits" });
            });
            if count > 0 {
                faults::point("after-commits");
            }
            if let Err(e) = self.retain(n) {
                tracing::warn!(job = %self.job, error = %e, "cannot delete old checkpoints; tried again after the next one");
            }
        });
        Ok(())
    }

    /// Copies complete checkpoint `n` to `savepoints/<name>`, outside
    /// retention (the manifest last, so a half-copied savepoint is not one).
    fn copy_to_savepoint(&self, n: u64, name: &str) -> Result<PathBuf> {
        let storage = &*self.config.storage;
        let from = checkpoint_name(n);
        let to = storage::join(SAVEPOINTS, name);
        let manifest_name = storage::join(&to, MANIFEST);
        crate::task::blocking(|| {
            let taken = storage
                .exists(&manifest_name)
                .map_err(io("cannot read checkpoint storage", storage.locate(&manifest_name)))?;
            if taken {
                return Err(bad(
                    &storage.locate(&to),
                    "a savepoint of this name exists already: choose another name".into(),
                ));
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
        tracing::info!(job = %self.job, savepoint = %located.display(), checkpoint = n, "savepoint taken");
        Ok(located)
    }

    /// Deletes all but the newest `retain` complete checkpoints, and any
    /// older incomplete ones, and the state files no kept checkpoint
    /// refers to.
    fn retain(&self, newest: u64) -> Result<()> {
        let storage = &*self.config.storage;
        let list = |prefix: &str| storage.list(prefix).map_err(io("cannot list checkpoints", storage.locate(prefix)));
        let complete = complete_checkpoints_in(storage, "")?;
        let keep: Vec<u64> = complete.iter().take(self.config.retain.max(1)).map(|(n, _)| *n).collect();
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

/// What a restored job starts from.
#[derive(Debug)]
pub(crate) struct Restore {
    pub(crate) checkpoint: u64,
    pub(crate) storage: Arc<dyn CheckpointStorage>,
    /// The checkpoint's (or savepoint's) directory in `storage`.
    pub(crate) dir: String,
    pub(crate) positions: HashMap<(String, u32), u64>,
    /// Per operator: its state files.
    pub(crate) states: BTreeMap<String, Vec<StateFileEntry>>,
    /// Sink transactions the checkpoint committed.
    pub(crate) commits: Vec<CommitEntry>,
}

impl crate::state::RestoreSource for Restore {
    fn load_entries(
        &self,
        operator: &str,
        state: &str,
        codec: &str,
        groups: &std::ops::Range<u16>,
        f: &mut dyn FnMut(crate::state::Entries, crate::state::RemovedKeys) -> Result<()>,
    ) -> Result<()> {
        self.load_entries_of(operator, state, codec, groups, f)
    }
}

impl Restore {
    /// Reads checkpoint (or savepoint) `dir` in `storage` for a job with
    /// `fingerprint` and `max_key_groups`, and checks every state file it
    /// names.
    pub(crate) fn load(
        storage: &Arc<dyn CheckpointStorage>,
        dir: &str,
        fingerprint: &str,
        max_key_groups: u16,
    ) -> Result<Self> {
        let manifest = read_manifest_in(&**storage, dir)?;
        let located = storage.locate(dir);
        if manifest.graph_fingerprint != fingerprint {
            return Err(bad(
                &located,
                "it was taken by a different pipeline (operators or types changed): restore it into the job that wrote it"
                    .into(),
            ));
        }
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
            read_state_file_parts(&**storage, &name, &mut |_| Ok(()))?;
        }
        let mut states: BTreeMap<String, Vec<StateFileEntry>> = BTreeMap::new();
        for s in manifest.states {
            states.entry(s.operator.clone()).or_default().push(s);
        }
        Ok(Self {
            checkpoint: manifest.checkpoint,
            storage: storage.clone(),
            dir: dir.to_string(),
            positions: manifest.sources.into_iter().map(|s| ((s.source, s.partition), s.position)).collect(),
            states,
            commits: manifest.commits,
        })
    }

    /// The newest complete checkpoint in `storage` under `dir` that loads,
    /// falling back to older ones when one is damaged (each failure is
    /// logged).
    pub(crate) fn latest(
        storage: &Arc<dyn CheckpointStorage>,
        dir: &str,
        fingerprint: &str,
        max_key_groups: u16,
    ) -> Result<Option<Self>> {
        let mut last_error = None;
        for (_, checkpoint) in complete_checkpoints_in(&**storage, dir)? {
            match Self::load(storage, &checkpoint, fingerprint, max_key_groups) {
                Ok(r) => return Ok(Some(r)),
                Err(e) => {
                    tracing::warn!(checkpoint = %storage.locate(&checkpoint).display(), error = %e, "cannot restore; trying an older one");
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
    /// must have been written with `codec`.
    fn read_checked(&self, file: &str, codec: &str) -> Result<StateFile> {
        let name = storage::join(&self.dir, file);
        let file = read_state_file(&*self.storage, &name)?;
        if file.codec != codec {
            return Err(bad(
                &self.storage.locate(&name),
                format!("its values were written with codec {}, the job reads {codec}", file.codec),
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

    /// Passes the entries of `operator`'s `state` in key groups `groups` to
    /// `f` a part at a time, as (entries to put, keys to remove first), so
    /// that the whole state is never in memory: each file of its chain in
    /// checkpoint order, each base or delta part as written. Applying the
    /// parts in order (removals, then puts) gives the state. Chains whose
    /// bases overlap (none that this build writes) are merged in memory
    /// and passed whole.
    fn load_entries_of(
        &self,
        operator: &str,
        state: &str,
        codec: &str,
        groups: &std::ops::Range<u16>,
        f: &mut dyn FnMut(crate::state::Entries, crate::state::RemovedKeys) -> Result<()>,
    ) -> Result<()> {
        let files = self.chain(operator, state, groups)?;
        let bases: Vec<(u16, u16)> = files.iter().filter(|s| s.base).map(|s| s.key_groups).collect();
        let overlapping =
            bases.iter().enumerate().any(|(i, a)| bases.iter().skip(i + 1).any(|b| a.0 < b.1 && b.0 < a.1));
        if overlapping {
            return f(self.entries(operator, state, codec, groups)?, Vec::new());
        }
        for s in files {
            let name = storage::join(&self.dir, &s.file);
            let path = self.storage.locate(&name);
            let mut first = true;
            read_state_file_parts(&*self.storage, &name, &mut |part| {
                if std::mem::take(&mut first) && part.codec != codec {
                    return Err(bad(
                        &path,
                        format!("its values were written with codec {}, the job reads {codec}", part.codec),
                    ));
                }
                let removed: crate::state::RemovedKeys = part
                    .removed
                    .into_iter()
                    .filter(|r| groups.contains(&r.group))
                    .flat_map(|r| r.keys.into_iter().map(move |k| (r.group, k)))
                    .collect();
                let entries: crate::state::Entries = part
                    .groups
                    .into_iter()
                    .filter(|g| groups.contains(&g.group))
                    .flat_map(|g| g.entries.into_iter().map(move |(k, v)| (g.group, k, v)))
                    .collect();
                if entries.is_empty() && removed.is_empty() {
                    return Ok(());
                }
                f(entries, removed)
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
        codec: &str,
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
        let storage = MemoryStorage::new();
        let name = "shared/sum-0-value.state";
        write_state_file(&storage, name, &sample()).unwrap();
        assert_eq!(read_state_file(&storage, name).unwrap(), sample());

        let good = storage.get(name).unwrap().to_vec();
        let mut flipped = good.clone();
        flipped[HEAD + 3] ^= 1;
        storage.set(name, flipped);
        let err = read_state_file(&storage, name).unwrap_err().to_string();
        assert!(err.contains("checksum") && err.contains("sum-0-value.state"), "{err}");

        storage.set(name, &good[..good.len() - 3]);
        let err = read_state_file(&storage, name).unwrap_err().to_string();
        assert!(err.contains("truncated") && err.contains("trailer") && err.contains("sum-0-value.state"), "{err}");

        // Cut between frames, with a trailer that says so: the length is wrong.
        let mut short = good[..HEAD + 4].to_vec();
        short.extend_from_slice(&good[good.len() - TRAILER..]);
        storage.set(name, short);
        let err = read_state_file(&storage, name).unwrap_err().to_string();
        assert!(
            err.contains("truncated") && err.contains("payload bytes") && err.contains("sum-0-value.state"),
            "{err}"
        );

        let mut old = good.clone();
        old[8] = 9;
        storage.set(name, old);
        assert!(read_state_file(&storage, name).unwrap_err().to_string().contains("format version 9"));

        storage.set(name, &b"short"[..]);
        assert!(read_state_file(&storage, name).unwrap_err().to_string().contains("truncated"));

        storage.set(name, &b"WEIBOSTAxxxxxxxxxxxxxxxxxxxx"[..]);
        assert!(read_state_file(&storage, name).unwrap_err().to_string().contains("format version"));

        let missing = read_state_file(&storage, "shared/missing.state").unwrap_err().to_string();
        assert!(missing.contains("missing.state"), "{missing}");
    }

    /// `file`'s entries and removed keys as one part.
    fn part_of(file: &StateFile) -> SnapshotFrame {
        let mut part = SnapshotFrame::default();
        for g in &file.groups {
            for (k, v) in &g.entries {
                part.push(g.group, k, v).unwrap();
            }
        }
        for r in &file.removed {
            for k in &r.keys {
                part.push_removed(r.group, k).unwrap();
            }
        }
        part
    }

    /// A version-4 file's payload under the 32-byte header of versions 1
    /// to 3, as those versions wrote it.
    fn with_old_header(version: u32, v4: &[u8]) -> Vec<u8> {
        let payload = &v4[HEAD..v4.len() - TRAILER];
        let mut old = Vec::new();
        old.extend_from_slice(MAGIC);
        old.extend_from_slice(&version.to_le_bytes());
        old.extend_from_slice(&0u32.to_le_bytes());
        old.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        old.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(payload).to_le_bytes());
        old.extend_from_slice(payload);
        old
    }

    /// Rewrites a version-4 file's trailer to fit its (changed) payload.
    fn reseal(file: &mut [u8]) {
        let end = file.len() - TRAILER;
        let len = (end - HEAD) as u64;
        let digest = xxhash_rust::xxh3::xxh3_64(&file[HEAD..end]);
        file[end..end + 8].copy_from_slice(&len.to_le_bytes());
        file[end + 8..end + 16].copy_from_slice(&digest.to_le_bytes());
    }

    #[test]
    fn state_file_names_tell_the_checkpoint_that_wrote_them() {
        assert_eq!(written_by("sums-0-value-00000000000000000012-3f9c2a6b1d4e8f07.state"), Some(12));
        assert_eq!(written_by("sums-0-value-00000000000000000012.state"), Some(12), "as earlier builds named them");
        assert_eq!(written_by("a-b-fire-timers-00000000000000000003-0123456789abcdef.state"), Some(3));
        assert_eq!(written_by("MANIFEST"), None);
        assert_ne!(run_token(), run_token());
        assert_eq!(run_token().len(), 16);
    }

    #[test]
    fn parts_hold_entries_and_removed_keys_in_order() {
        let mut part = SnapshotFrame::default();
        part.push(3, b"a", b"1").unwrap();
        part.push(3, b"", b"").unwrap();
        part.push(5, b"bc", b"234").unwrap();
        part.push_removed(4, b"gone").unwrap();
        let entries: Vec<(u16, &[u8], &[u8])> = part.entries().collect();
        assert_eq!(entries, vec![(3, &b"a"[..], &b"1"[..]), (3, &b""[..], &b""[..]), (5, &b"bc"[..], &b"234"[..])]);
        assert_eq!(part.removed_keys().collect::<Vec<_>>(), vec![(4, &b"gone"[..])]);
        assert_eq!((part.len(), part.bytes()), (3, 3 + 4 + 4));
        part.clear();
        assert!(part.is_empty() && part.entries().next().is_none());
    }

    #[test]
    fn state_files_are_written_and_read_a_frame_at_a_time() {
        let storage = MemoryStorage::new();
        let mut n = 0;
        // A fresh name per file: storage objects are written once.
        let mut name = || {
            n += 1;
            format!("shared/sum-0-value-{n}.state")
        };
        let mut whole = sample();
        whole.groups.push(GroupEntries { group: 4, entries: vec![(b"k2".to_vec(), b"v2".to_vec())] });
        let meta = StateFile { groups: Vec::new(), removed: Vec::new(), ..whole.clone() };
        let path = name();
        let mut writer = StateFileWriter::create(&storage, &path, &meta).unwrap();
        // One frame per key group, as an export passes them.
        for g in &whole.groups {
            writer.part(&part_of(&StateFile { groups: vec![g.clone()], removed: Vec::new(), ..meta.clone() })).unwrap();
        }
        writer.part(&part_of(&StateFile { groups: Vec::new(), ..whole.clone() })).unwrap();
        writer.finish().unwrap();
        let mut parts = Vec::new();
        read_state_file_parts(&storage, &path, &mut |p| {
            parts.push(p);
            Ok(())
        })
        .unwrap();
        assert_eq!(parts.len(), whole.groups.len() + 2, "the meta frame and one per part");
        assert_eq!(read_state_file(&storage, &path).unwrap(), whole);
        assert_eq!(storage.get(&path).unwrap()[8], 4);

        // A version-3 file (the same frames, under a header) still reads.
        let v4 = storage.get(&path).unwrap().to_vec();
        let v3 = name();
        storage.set(&v3, with_old_header(3, &v4));
        assert_eq!(read_state_file(&storage, &v3).unwrap(), whole);

        // A version-2 file (frames of whole archives) still reads.
        let frames = name();
        let mut v2 = StateFileWriter::create(&storage, &frames, &meta).unwrap();
        for g in &whole.groups {
            v2.frame(&StateFile { groups: vec![g.clone()], removed: Vec::new(), ..meta.clone() }).unwrap();
        }
        v2.frame(&StateFile { groups: Vec::new(), ..whole.clone() }).unwrap();
        v2.finish().unwrap();
        let v2 = with_old_header(2, &storage.get(&frames).unwrap());
        let path = name();
        storage.set(&path, v2);
        assert_eq!(read_state_file(&storage, &path).unwrap(), whole);

        // A version-1 file (one archive) still reads.
        let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&whole).unwrap();
        let mut v1 = Vec::new();
        v1.extend_from_slice(MAGIC);
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&0u32.to_le_bytes());
        v1.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        v1.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
        v1.extend_from_slice(&payload);
        let path = name();
        storage.set(&path, v1);
        assert_eq!(read_state_file(&storage, &path).unwrap(), whole);

        // A frame whose length lies, with a checksum to match, is refused
        // naming the frame.
        let good = {
            let path = name();
            let mut w = StateFileWriter::create(&storage, &path, &meta).unwrap();
            w.part(&part_of(&whole)).unwrap();
            w.finish().unwrap();
            storage.get(&path).unwrap().to_vec()
        };
        let mut lying = good.clone();
        let at = HEAD + 8 + usize::try_from(u64::from_le_bytes(good[HEAD..HEAD + 8].try_into().unwrap())).unwrap();
        lying[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        reseal(&mut lying);
        let path = name();
        storage.set(&path, lying);
        let err = read_state_file(&storage, &path).unwrap_err().to_string();
        assert!(err.contains("frame 1") && err.contains("sum-0-value"), "{err}");

        // Bytes after the last frame, with a trailer to match, are refused.
        let mut trailing = good.clone();
        let end = trailing.len() - TRAILER;
        trailing.splice(end..end, [1, 2, 3]);
        reseal(&mut trailing);
        let path = name();
        storage.set(&path, trailing);
        let err = read_state_file(&storage, &path).unwrap_err().to_string();
        assert!(err.contains("frame 2 is cut short"), "{err}");

        // A frame whose offsets run past its bytes is refused naming the frame.
        let mut bad_part = part_of(&whole);
        bad_part.value_ends[0] = 1_000;
        let path = name();
        let mut w = StateFileWriter::create(&storage, &path, &meta).unwrap();
        w.part(&bad_part).unwrap();
        w.finish().unwrap();
        let err = read_state_file(&storage, &path).unwrap_err().to_string();
        assert!(err.contains("frame 1") && err.contains("offsets"), "{err}");

        // So is one with bytes after its last value.
        let mut trailing_part = part_of(&whole);
        trailing_part.values.push(7);
        let path = name();
        let mut w = StateFileWriter::create(&storage, &path, &meta).unwrap();
        w.part(&trailing_part).unwrap();
        w.finish().unwrap();
        let err = read_state_file(&storage, &path).unwrap_err().to_string();
        assert!(err.contains("frame 1") && err.contains("offsets"), "{err}");
    }

    #[test]
    fn only_checkpoints_with_a_manifest_are_complete() {
        let root = tempfile::tempdir().unwrap();
        let local: Arc<dyn CheckpointStorage> = Arc::new(LocalDir::new(root.path()));
        let memory: Arc<dyn CheckpointStorage> = Arc::new(MemoryStorage::new());
        for storage in [local, memory] {
            for n in [1u64, 2, 3] {
                let dir = checkpoint_name(n);
                // An incomplete checkpoint: state files, no manifest.
                write_state_file(&*storage, &format!("{SHARED}/op-0-value-{n:020}.state"), &sample()).unwrap();
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
                    write_manifest(&*storage, &dir, &m).unwrap();
                }
            }
            let found: Vec<u64> = complete_checkpoints_in(&*storage, "").unwrap().into_iter().map(|(n, _)| n).collect();
            assert_eq!(found, vec![2, 1]);
            assert_eq!(highest_checkpoint(&*storage).unwrap(), 3, "counting the one in flight");
            let two = checkpoint_name(2);
            let err = Restore::load(&storage, &two, "other", 8).unwrap_err().to_string();
            assert!(err.contains("different pipeline"), "{err}");
            assert!(Restore::load(&storage, &two, "f", 16).unwrap_err().to_string().contains("key groups"));
            assert_eq!(Restore::latest(&storage, "", "f", 8).unwrap().unwrap().checkpoint, 2);
        }
        let listed: Vec<u64> = complete_checkpoints(root.path()).into_iter().map(|(n, _)| n).collect();
        assert_eq!(listed, vec![2, 1]);

        // A manifest naming a file outside the storage is refused.
        let storage: Arc<dyn CheckpointStorage> = Arc::new(MemoryStorage::new());
        let m = Manifest {
            format_version: FORMAT_VERSION,
            job: "j".into(),
            checkpoint: 4,
            graph_fingerprint: "f".into(),
            max_key_groups: 8,
            sources: vec![],
            states: vec![StateFileEntry {
                operator: "op".into(),
                state: "value".into(),
                file: "../../etc/x.state".into(),
                key_groups: (0, 8),
                checkpoint: 4,
                base: true,
            }],
            commits: vec![],
        };
        write_manifest(&*storage, &checkpoint_name(4), &m).unwrap();
        let err = Restore::load(&storage, &checkpoint_name(4), "f", 8).unwrap_err().to_string();
        assert!(err.contains("outside the checkpoint storage") && err.contains("chk-"), "{err}");
        assert_eq!(read_manifest(&root.path().join(checkpoint_name(2))).unwrap().checkpoint, 2);
    }
}
