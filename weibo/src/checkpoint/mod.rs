//! Checkpoints: consistent snapshots of source positions and keyed state,
//! taken with barriers that flow through the job in-band.
//!
//! Every `interval`, the coordinator asks each source partition for
//! checkpoint `n`. A source records its position and sends `Barrier(n)`
//! after the records before it. A keyed operator instance that receives
//! `Barrier(n)` on an input stops reading that input until the barrier has
//! come on all of them (alignment), then snapshots its state, forwards the
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
//! chk-00000000000000000007/MANIFEST   JSON: operators, positions, state files, commits
//! shared/<operator>-<instance>-<state>-<checkpoint>-<run>.state
//! savepoints/<name>/                 a manifest and copies of its state files
//! LOCK                               the run that owns the storage (see `lease`)
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
//! codec, the others each a [`SnapshotFrame`](crate::state::SnapshotFrame) carrying entries a chunk at a time
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
mod coordinator;
pub mod faults;
mod format;
pub(crate) mod history;
pub mod inspect;
pub mod lease;
mod manifest;
pub(crate) mod naming;
pub mod processor;
mod restore;
pub mod storage;

#[cfg(feature = "admin")]
pub(crate) use self::coordinator::SAVEPOINT_EXISTS;
pub(crate) use self::coordinator::{ALL_SOURCES_ENDED, Ack, Coordinator, SavepointRequest, TaskEvent};
pub(crate) use self::format::write_task_state;
pub use self::format::{GroupEntries, GroupKeys, Pairs, StateFile};
pub use self::history::CheckpointRecord;
pub(crate) use self::manifest::highest_checkpoint;
pub use self::manifest::{
    complete_checkpoints, complete_checkpoints_in, read_manifest, read_manifest_in, savepoints_in,
};
pub(crate) use self::restore::{Migration, Restore};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use self::naming::run_token;
pub use self::storage::{
    CheckpointStorage, LeaseError, LocalDir, LockAttempt, MemoryStorage, ObjectReader, ObjectWriter, StorageHolder,
    StorageLease,
};
use crate::error::Error;
pub use crate::record::CheckpointId;

/// The version of the manifest and state-file formats this build writes
/// and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The name of a checkpoint's manifest, in its directory.
const MANIFEST: &str = "MANIFEST";

/// The directory, beside the checkpoints, that holds their state files.
pub const SHARED: &str = "shared";

/// The directory, beside the checkpoints, that holds savepoints.
pub const SAVEPOINTS: &str = "savepoints";

/// A source partition's position in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePositionEntry {
    /// The source's id (its uid, or else its name).
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
    /// The operator's id (its uid, or else its name).
    pub operator: String,
    /// The state's name.
    pub state: String,
    /// The codec identity of its values (also in the file's first frame;
    /// here so that a restore can compare it before reading any file).
    /// Checkpoints of earlier builds have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codec: Option<String>,
    /// The id of its values' schema in the manifest's `schemas`
    /// (checkpoints of earlier builds have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// The file, relative to the checkpoint's directory.
    pub file: String,
    /// The key groups it holds, `[start, end)`.
    pub key_groups: (u16, u16),
    /// The checkpoint that wrote it.
    pub checkpoint: CheckpointId,
    /// Whether it holds all of its key groups' entries (a base), or the
    /// changes since the previous file of its chain (a delta). Restore
    /// applies a chain in checkpoint order: the newest base, then deltas.
    pub base: bool,
    /// The file's size in bytes (checkpoints of earlier builds have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The entries it holds, not counting a delta's removed keys
    /// (checkpoints of earlier builds have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// The state's own version, when it was declared with one
    /// (`States::version`); otherwise its operator's `state_version` is
    /// the state's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// For a state whose entries expire in event time: the time at or
    /// before which they had expired when the file was written (the
    /// highest watermark its state had seen). A restore drops the entries
    /// of the file's chain that had expired by its newest file's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_before: Option<i64>,
}

/// What a complete checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] of the build that wrote it.
    pub format_version: u32,
    /// The job's name.
    pub job: String,
    /// The checkpoint's number.
    pub checkpoint: CheckpointId,
    /// A hash of the job's operators and types (not their parallelism),
    /// for information: a restore matches state to operators by id, not
    /// by this hash, so a changed pipeline restores (see
    /// [`OperatorEntry`]).
    pub graph_fingerprint: String,
    /// The job's number of key groups.
    pub max_key_groups: u16,
    /// The keyed operators that keep state, by id, with their key types
    /// (checkpoints of earlier builds have none: their operators are
    /// known only by the state files' names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<OperatorEntry>,
    /// Every source partition's position.
    pub sources: Vec<SourcePositionEntry>,
    /// Every state file.
    pub states: Vec<StateFileEntry>,
    /// The schemas of the states' values, by id (see
    /// [`StateFileEntry::schema`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schemas: BTreeMap<String, crate::codec::schema::Schema>,
    /// Exactly-once sink transactions this checkpoint commits (committed
    /// again on restore, which is harmless: commits are idempotent).
    #[serde(default)]
    pub commits: Vec<CommitEntry>,
}

/// A keyed operator with state, in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorEntry {
    /// Its id: what its state files are filed under.
    pub id: String,
    /// What it is (`reduce`, `window`, `process`, ...); empty for state
    /// the state processor bootstrapped (any kind restores it).
    pub kind: String,
    /// The type of its keys, as checkpoints record type names.
    pub key_type: String,
    /// The layout of its keys' encoding (checkpoints of earlier builds
    /// have none: their key types are compared by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_schema: Option<crate::codec::schema::Shape>,
    /// The version of its state the user declared (`.state_version(..)`;
    /// 1 when the manifest records none).
    #[serde(default = "first_state_version", skip_serializing_if = "is_first_state_version")]
    pub state_version: u32,
}

fn first_state_version() -> u32 {
    1
}

fn is_first_state_version(v: &u32) -> bool {
    *v == 1
}

/// A sink transaction to commit with a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitEntry {
    /// The sink's id (its uid, or else its name).
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

/// A checkpoint error at `path`, caused by `source`.
fn bad_caused(path: &Path, what: String, source: impl Into<crate::error::BoxError>) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), message: what, source: Some(source.into()) }
}

/// The error of a run that lost its checkpoint storage to another run
/// (see [`lease`]): it writes no manifest and commits nothing more.
pub(crate) fn fenced(storage: &dyn CheckpointStorage, why: impl Into<crate::error::BoxError>) -> Error {
    Error::Checkpoint {
        path: storage.locate(""),
        message: "this run no longer holds its checkpoint storage (another run took it, or its lock is gone): it \
                  completes no checkpoint and commits no output from now on, and stops"
            .into(),
        source: Some(why.into()),
    }
}

fn bad(path: &Path, what: String) -> Error {
    Error::Checkpoint { path: path.to_path_buf(), message: what, source: None }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::format::{
        HEAD, MAGIC, StateFileWriter, TRAILER, check_state_file, read_state_file, read_state_file_parts,
        write_state_file,
    };
    use super::manifest::write_manifest;
    use super::naming::{checkpoint_name, written_by};
    use super::*;
    use crate::state::SnapshotFrame;

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
    fn every_flipped_bit_of_a_state_file_is_found() {
        let storage = MemoryStorage::new();
        let name = "shared/sum-0-value.state";
        write_state_file(&storage, name, &sample()).unwrap();
        let good = storage.get(name).unwrap().to_vec();
        for at in 0..good.len() {
            for bit in 0..8 {
                let mut flipped = good.clone();
                flipped[at] ^= 1 << bit;
                storage.set(name, flipped);
                assert!(
                    check_state_file(&storage, name).is_err(),
                    "byte {at} bit {bit} of {} went unnoticed",
                    good.len()
                );
            }
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

    #[test]
    fn a_frame_whose_offsets_run_past_its_bytes_is_refused_by_the_check_and_the_reader() {
        let storage = MemoryStorage::new();
        let name = "shared/bad-0-value.state";
        let meta = StateFile { groups: Vec::new(), removed: Vec::new(), ..sample() };
        for (keys, key_ends) in
            [(b"abc".to_vec(), vec![2u32]), (b"ab".to_vec(), vec![3u32]), (b"ab".to_vec(), vec![2, 1])]
        {
            let frame = SnapshotFrame {
                groups: vec![1; key_ends.len()],
                value_ends: vec![0; key_ends.len()],
                key_ends,
                keys,
                ..SnapshotFrame::default()
            };
            let mut writer = StateFileWriter::create(&storage, name, &meta).unwrap();
            writer.part(&frame).unwrap();
            writer.finish().unwrap();
            let checked = check_state_file(&storage, name).unwrap_err().to_string();
            assert!(checked.contains("offsets are inconsistent"), "{checked}");
            let read = read_state_file(&storage, name).unwrap_err().to_string();
            assert!(read.contains("offsets are inconsistent"), "{read}");
            storage.delete(name).unwrap();
        }
        let mut writer = StateFileWriter::create(&storage, name, &meta).unwrap();
        let mut frame = SnapshotFrame::default();
        frame.keys.extend_from_slice(b"k");
        frame.values.extend_from_slice(b"v");
        frame.end_entry(3).unwrap();
        writer.part(&frame).unwrap();
        writer.finish().unwrap();
        check_state_file(&storage, name).unwrap();
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
        assert_eq!(written_by("sums-0-value-00000000000000000012-3f9c2a6b1d4e8f07.state"), Some(CheckpointId::new(12)));
        assert_eq!(
            written_by("sums-0-value-00000000000000000012.state"),
            Some(CheckpointId::new(12)),
            "as earlier builds named them"
        );
        assert_eq!(
            written_by("a-b-fire-timers-00000000000000000003-0123456789abcdef.state"),
            Some(CheckpointId::new(3))
        );
        assert_eq!(written_by("MANIFEST"), None);
        assert_ne!(run_token(), run_token());
        assert_eq!(run_token().len(), 32);
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
        // One frame per key group, as a snapshot passes them.
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
                let dir = checkpoint_name(CheckpointId::new(n));
                // An incomplete checkpoint: state files, no manifest.
                write_state_file(&*storage, &format!("{SHARED}/op-0-value-{n:020}.state"), &sample()).unwrap();
                if n != 3 {
                    let m = Manifest {
                        format_version: FORMAT_VERSION,
                        job: "j".into(),
                        checkpoint: CheckpointId::new(n),
                        graph_fingerprint: "f".into(),
                        operators: Vec::new(),
                        max_key_groups: 8,
                        sources: vec![],
                        states: vec![],
                        schemas: BTreeMap::new(),
                        commits: vec![],
                    };
                    write_manifest(&*storage, &dir, &m).unwrap();
                }
            }
            let found: Vec<u64> =
                complete_checkpoints_in(&*storage, "").unwrap().into_iter().map(|(n, _)| n.get()).collect();
            assert_eq!(found, vec![2, 1]);
            assert_eq!(highest_checkpoint(&*storage).unwrap().get(), 3, "counting the one in flight");
            let two = checkpoint_name(CheckpointId::new(2));
            assert!(Restore::load(&storage, &two, 16).unwrap_err().to_string().contains("key groups"));
            assert_eq!(Restore::latest(&storage, "", 8).unwrap().unwrap().checkpoint.get(), 2);
        }
        let listed: Vec<u64> = complete_checkpoints(root.path()).into_iter().map(|(n, _)| n.get()).collect();
        assert_eq!(listed, vec![2, 1]);

        // A manifest naming a file outside the storage is refused.
        let storage: Arc<dyn CheckpointStorage> = Arc::new(MemoryStorage::new());
        let m = Manifest {
            format_version: FORMAT_VERSION,
            job: "j".into(),
            checkpoint: CheckpointId::new(4),
            graph_fingerprint: "f".into(),
            operators: Vec::new(),
            max_key_groups: 8,
            sources: vec![],
            states: vec![StateFileEntry {
                operator: "op".into(),
                state: "value".into(),
                codec: None,
                schema: None,
                file: "../../etc/x.state".into(),
                key_groups: (0, 8),
                checkpoint: CheckpointId::new(4),
                base: true,
                bytes: None,
                entries: None,
                version: None,
                expired_before: None,
            }],
            schemas: BTreeMap::new(),
            commits: vec![],
        };
        write_manifest(&*storage, &checkpoint_name(CheckpointId::new(4)), &m).unwrap();
        let err = Restore::load(&storage, &checkpoint_name(CheckpointId::new(4)), 8).unwrap_err().to_string();
        assert!(err.contains("outside the checkpoint storage") && err.contains("chk-"), "{err}");
        assert_eq!(
            read_manifest(&root.path().join(checkpoint_name(CheckpointId::new(2)))).unwrap().checkpoint.get(),
            2
        );
    }
}
