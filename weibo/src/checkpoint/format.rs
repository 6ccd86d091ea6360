//! The state-file format: how a task's snapshot is written, frame by
//! frame, and read back (versions 1 to 4).

use std::path::{Path, PathBuf};

use super::storage::{CheckpointStorage, ObjectReader, ObjectWriter};
use super::{StateFileEntry, bad, bad_caused, io, naming};
use crate::error::Result;
use crate::record::CheckpointId;
use crate::state::{ArchivedSnapshotFrame, SnapshotFrame, slices};

pub(super) const MAGIC: &[u8; 8] = b"WEIBOSTA";
/// Magic, version and a reserved word: a state file's first bytes.
pub(super) const HEAD: usize = 16;
/// The header of versions 1 to 3: the head, the payload's length and checksum.
pub(super) const OLD_HEADER: usize = 32;
/// Version 4's trailer: the payload's length and checksum, and `END_MAGIC`.
pub(super) const TRAILER: usize = 24;
pub(super) const END_MAGIC: &[u8; 8] = b"WEIBOEND";
/// The state-file version this build writes (frames of concatenated
/// entries, length and checksum in a trailer); it reads 1 to 4.
pub(super) const STATE_FILE_VERSION: u32 = 4;

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
pub(super) fn archived_part_as_file(part: &ArchivedSnapshotFrame) -> Option<StateFile> {
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

/// A task's state files for a checkpoint, and the schemas they name.
pub(crate) type TaskState = (Vec<StateFileEntry>, Vec<(String, crate::codec::schema::Schema)>);

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
    n: CheckpointId,
    snapshots: Vec<crate::state::StateSnapshot>,
) -> Result<TaskState> {
    let mut files = Vec::new();
    let mut schemas = Vec::new();
    for snap in snapshots {
        let (name, in_manifest) = naming::state_file(operator, instance, &snap.state, n, run);
        let meta = StateFile {
            operator: operator.to_string(),
            state: snap.state.to_string(),
            codec: snap.ty.codec.clone(),
            groups: Vec::new(),
            removed: Vec::new(),
        };
        let schema_id = snap.ty.schema.id();
        schemas.push((schema_id.clone(), (*snap.ty.schema).clone()));
        let mut writer = StateFileWriter::create(storage, &name, &meta)?;
        let base = (snap.snapshot)(&mut |part| writer.part(&part.part))?;
        let (bytes, entries) = writer.finish()?;
        files.push(StateFileEntry {
            operator: operator.to_string(),
            state: snap.state.to_string(),
            codec: Some(meta.codec.clone()),
            schema: Some(schema_id.clone()),
            file: in_manifest,
            key_groups: (groups.start, groups.end),
            checkpoint: n,
            base,
            bytes: Some(bytes),
            entries: Some(entries),
            version: snap.ty.version,
            expired_before: snap.expired_before,
        });
    }
    Ok((files, schemas))
}

/// Writes a state file frame by frame, front to back (the length and
/// checksum go in a trailer), so that it streams to any storage.
pub(crate) struct StateFileWriter {
    out: Box<dyn ObjectWriter>,
    hasher: xxhash_rust::xxh3::Xxh3,
    len: u64,
    /// Entries written (not counting removed keys).
    entries: u64,
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
        let mut writer = Self { out, hasher: xxhash_rust::xxh3::Xxh3::new(), len: 0, entries: 0, path };
        writer.frame(meta)?;
        Ok(writer)
    }

    /// Appends a frame holding a [`StateFile`] (the first frame; every
    /// frame in version 2).
    pub(crate) fn frame(&mut self, part: &StateFile) -> Result<()> {
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(part)
            .map_err(|e| bad_caused(&self.path, "cannot encode the state".into(), e))?;
        self.raw_frame(&bytes)
    }

    /// Appends a frame holding entries (versions 3 and 4).
    pub(crate) fn part(&mut self, part: &SnapshotFrame) -> Result<()> {
        self.entries += part.len() as u64;
        let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(part)
            .map_err(|e| bad_caused(&self.path, "cannot encode the state".into(), e))?;
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

    /// Writes the trailer and completes the object; returns its size and
    /// the entries it holds.
    pub(crate) fn finish(mut self) -> Result<(u64, u64)> {
        let mut trailer = Vec::with_capacity(TRAILER);
        trailer.extend_from_slice(&self.len.to_le_bytes());
        trailer.extend_from_slice(&self.hasher.digest().to_le_bytes());
        trailer.extend_from_slice(END_MAGIC);
        self.out.write_all(&trailer).map_err(io("cannot write checkpoint file", self.path.clone()))?;
        self.out.finish().map_err(io("cannot complete checkpoint file", self.path))?;
        Ok((HEAD as u64 + self.len + TRAILER as u64, self.entries))
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
    writer.finish().map(|_| ())
}

/// A state file's payload, read through a buffer.
pub(super) type Payload = std::io::BufReader<Box<dyn ObjectReader>>;

/// Opens a state file and checks its head, its length and the checksum of
/// its payload (read in pieces); returns its version, its payload's length
/// and the file, positioned at the payload.
pub(super) fn open_checked(storage: &dyn CheckpointStorage, name: &str) -> Result<(u32, u64, Payload)> {
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
    // The version, then a reserved word every build writes as zero: a
    // flipped bit there is damage too.
    let word = field(&head, 8);
    let (version, reserved) = (word as u32, (word >> 32) as u32);
    if (1..=STATE_FILE_VERSION).contains(&version) && reserved != 0 {
        return Err(bad(&path, format!("its header's reserved word is {reserved:#x}, not 0: the file is corrupt")));
    }
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
pub(super) fn read_aligned(
    path: &Path,
    input: &mut impl std::io::Read,
    len: u64,
    what: &str,
) -> Result<rkyv::util::AlignedVec<16>> {
    let len = usize::try_from(len).map_err(|_| bad(path, format!("{what} is {len} bytes long")))?;
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(len);
    aligned.resize(len, 0);
    input.read_exact(&mut aligned).map_err(|e| bad_caused(path, format!("{what} is cut short"), e))?;
    Ok(aligned)
}

/// Reads `len` bytes into an aligned buffer and validates them as a
/// [`StateFile`] archive (`what` names the part in errors).
pub(super) fn read_archive(path: &Path, input: &mut impl std::io::Read, len: u64, what: &str) -> Result<StateFile> {
    let aligned = read_aligned(path, input, len, what)?;
    rkyv::from_bytes::<StateFile, rkyv::rancor::Error>(&aligned)
        .map_err(|e| bad_caused(path, format!("{what} does not validate"), e))
}

/// A frame of a state file, as [`walk_state_file`] passes it on.
pub(crate) enum Frame<'a> {
    /// A frame holding a [`StateFile`]: the first (naming the state and
    /// codec) and, in versions 1 and 2, every frame.
    File(StateFile),
    /// A frame of entries (versions 3 and 4), validated and with its
    /// offsets checked, read in place from its aligned buffer.
    Part(&'a ArchivedSnapshotFrame),
}

impl<'a> Frame<'a> {
    /// The frame's entries and removed keys in key groups `groups`,
    /// borrowed (a part's offsets were checked when it was read).
    pub(crate) fn entries_in(
        &'a self,
        groups: &std::ops::Range<u16>,
    ) -> (Vec<crate::state::EntryRef<'a>>, Vec<crate::state::RemovedRef<'a>>) {
        match self {
            Frame::File(file) => (
                file.groups
                    .iter()
                    .filter(|g| groups.contains(&g.group))
                    .flat_map(|g| g.entries.iter().map(move |(k, v)| (g.group, k.as_slice(), v.as_slice())))
                    .collect(),
                file.removed
                    .iter()
                    .filter(|r| groups.contains(&r.group))
                    .flat_map(|r| r.keys.iter().map(move |k| (r.group, k.as_slice())))
                    .collect(),
            ),
            Frame::Part(part) => {
                let keys = slices(&part.keys, part.key_ends.iter().map(|e| e.to_native()));
                let values = slices(&part.values, part.value_ends.iter().map(|e| e.to_native()));
                let entries = part
                    .groups
                    .iter()
                    .map(|g| g.to_native())
                    .zip(keys.zip(values))
                    .filter(|(g, _)| groups.contains(g))
                    .filter_map(|(g, (k, v))| Some((g, k?, v?)))
                    .collect();
                let removed = part
                    .removed_groups
                    .iter()
                    .map(|g| g.to_native())
                    .zip(slices(&part.removed, part.removed_ends.iter().map(|e| e.to_native())))
                    .filter(|(g, _)| groups.contains(g))
                    .filter_map(|(g, k)| Some((g, k?)))
                    .collect();
                (entries, removed)
            }
        }
    }
}

/// Checks state file `name` (header, length, checksum), then passes its
/// parts to `f` one at a time: first the part naming the state and codec,
/// then the parts holding entries (a version-1 file is one part holding
/// both; the entries of version 3's and 4's frames come grouped by key
/// group, in their order). Copies every entry out: restores read
/// [`Frame`]s in place through [`walk_state_file`].
pub(crate) fn read_state_file_parts(
    storage: &dyn CheckpointStorage,
    name: &str,
    f: &mut dyn FnMut(StateFile) -> Result<()>,
) -> Result<()> {
    let path = storage.locate(name);
    walk_state_file(storage, name, &mut |frame| match frame {
        Frame::File(file) => f(file),
        Frame::Part(part) => f(archived_part_as_file(part)
            .ok_or_else(|| bad(&path, "a frame does not validate: its entries' offsets are inconsistent".into()))?),
    })
}

/// Checks state file `name` as [`walk_state_file`] reads it (header,
/// length, checksum, every frame's archive and offsets), without copying
/// its entries out: what a restore does to every file before it reads any.
pub(crate) fn check_state_file(storage: &dyn CheckpointStorage, name: &str) -> Result<()> {
    walk_state_file(storage, name, &mut |_| Ok(()))
}

/// Whether a part's offsets are consistent, as [`archived_part_as_file`]
/// requires, without copying its entries.
fn archived_part_is_consistent(part: &ArchivedSnapshotFrame) -> bool {
    let n = part.groups.len();
    if part.key_ends.len() != n || part.value_ends.len() != n || part.removed_ends.len() != part.removed_groups.len() {
        return false;
    }
    let fits = |bytes: &[u8], ends: &rkyv::vec::ArchivedVec<rkyv::rend::u32_le>| {
        ends.last().map_or(0, |e| e.to_native() as usize) == bytes.len()
            && slices(bytes, ends.iter().map(|e| e.to_native())).all(|s| s.is_some())
    };
    fits(&part.keys, &part.key_ends) && fits(&part.values, &part.value_ends) && fits(&part.removed, &part.removed_ends)
}

/// Reads state file `name` frame by frame, each into one aligned buffer,
/// validated once and then passed to `f` in place: the file is checked
/// (head, length, checksum) before its first frame is passed on.
pub(crate) fn walk_state_file(
    storage: &dyn CheckpointStorage,
    name: &str,
    f: &mut dyn FnMut(Frame<'_>) -> Result<()>,
) -> Result<()> {
    use std::io::Read;
    let path = storage.locate(name);
    let (version, mut left, mut input) = open_checked(storage, name)?;
    if version == 1 {
        let mut payload = Vec::new();
        input.read_to_end(&mut payload).map_err(io("cannot read checkpoint file", path.clone()))?;
        let file = read_archive(&path, &mut payload.as_slice(), payload.len() as u64, "the state")?;
        return f(Frame::File(file));
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
        input.read_exact(&mut len).map_err(|e| bad_caused(&path, format!("frame {index} is cut short"), e))?;
        let len = u64::from_le_bytes(len);
        left -= 8;
        if len > left {
            return Err(bad(&path, format!("frame {index} claims {len} bytes, the file has {left} left")));
        }
        left -= len;
        let what = format!("frame {index}");
        if version >= 3 && index > 0 {
            let aligned = read_aligned(&path, &mut input, len, &what)?;
            let part = rkyv::access::<ArchivedSnapshotFrame, rkyv::rancor::Error>(&aligned)
                .map_err(|e| bad_caused(&path, format!("{what} does not validate"), e))?;
            if !archived_part_is_consistent(part) {
                return Err(bad(&path, format!("{what} does not validate: its entries' offsets are inconsistent")));
            }
            f(Frame::Part(part))?;
        } else {
            f(Frame::File(read_archive(&path, &mut input, len, &what)?))?;
        }
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
