//! The state processor: savepoints read and rewritten offline, with the
//! job's own types (Flink's State Processor API is the model).
//!
//! [`SavepointReader`] opens a savepoint or checkpoint and reads an
//! operator's value state typed, every entry or one key, and a key's map or
//! list in a process function's named map or list state, after checking
//! that the type's schema is the one the savepoint recorded.
//! [`SavepointWriter`] starts from one and writes a new savepoint in which
//! some operators' value, map or list states are replaced (transformed, or
//! bootstrapped for an operator the savepoint did not have) or dropped;
//! everything else is copied as it was. A job restores the new savepoint
//! like any other.
//!
//! Value states are those whose values are the type itself: `reduce`
//! (state `value`), `fold` and `aggregate` (`accumulator`), keyed `process`
//! (`value`; its timers are a state of their own, `timers`), and a process
//! function's value, reducing and aggregating states, by the names it
//! declared them with. Its map and list states are read and written a
//! key's map or list at a time ([`SavepointReader::map`],
//! [`SavepointWriter::set_map_state`]): their entries are filed under the
//! key's key group, which the value-state calls would get wrong.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::{StateFile, StateFileWriter};
use super::inspect::{Inspection, Opened};
use super::manifest::{read_manifest, read_manifest_in, write_manifest};
use super::restore::CodecCheck;
use super::storage::{CheckpointStorage, LocalDir, join};
use super::{MANIFEST, Manifest, StateFileEntry, bad, io, naming};
use crate::codec::Data;
use crate::codec::key::Key;
use crate::codec::schema::Schema;
use crate::error::{Error, Result};

/// A savepoint (or checkpoint) opened for reading.
pub struct SavepointReader {
    /// Where it is, for messages: its directory, or `dir` in the storage.
    dir: PathBuf,
    /// Its storage and its directory there.
    source: (Arc<dyn CheckpointStorage>, String),
    manifest: Manifest,
    inspection: Inspection,
    opened: Opened,
}

impl SavepointReader {
    /// Opens the savepoint or checkpoint in `dir` (the directory with its
    /// `MANIFEST`); every state file is checked.
    ///
    /// # Errors
    /// As [`Inspection::open`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let manifest = read_manifest(&dir)?;
        let (inspection, opened) = Inspection::open(&dir)?;
        let (parent, name) = match (inspection.path.parent(), inspection.path.file_name()) {
            (Some(p), Some(n)) => (p.to_path_buf(), n.to_string_lossy().into_owned()),
            _ => return Err(bad(&dir, "is not a checkpoint's directory".into())),
        };
        let storage: Arc<dyn CheckpointStorage> = Arc::new(LocalDir::new(parent));
        Ok(Self { dir, source: (storage, name), manifest, inspection, opened })
    }

    /// As [`SavepointReader::open`], for the savepoint or checkpoint in
    /// directory `dir` of `storage` (`savepoints/<name>`, `chk-<n>`): one
    /// in S3, or any other [`CheckpointStorage`].
    ///
    /// # Errors
    /// As [`Inspection::open`].
    pub fn open_in(storage: Arc<dyn CheckpointStorage>, dir: &str) -> Result<Self> {
        let manifest = read_manifest_in(&*storage, dir)?;
        let (inspection, opened) = Inspection::open_in(&storage, dir)?;
        Ok(Self { dir: PathBuf::from(dir), source: (storage, dir.to_string()), manifest, inspection, opened })
    }

    /// What it holds.
    pub fn inspection(&self) -> &Inspection {
        &self.inspection
    }

    /// Its manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Checks that `V` is what `operator`'s `state` holds: its schema is the
    /// recorded one (by layout), or, for a savepoint without schemas, its
    /// codec identity is.
    fn check<V: Data>(&self, operator: &str, state: &str) -> Result<()> {
        let files: Vec<&StateFileEntry> =
            self.manifest.states.iter().filter(|s| s.operator == operator && s.state == state).collect();
        if files.is_empty() {
            return Err(bad(&self.dir, format!("it holds no state `{state}` of operator `{operator}`")));
        }
        let schema = V::schema();
        for f in &files {
            match f.schema.as_ref().and_then(|id| self.manifest.schemas.get(id)) {
                Some(was) => {
                    if let Some(d) = was.first_difference(&schema) {
                        return Err(bad(
                            &self.dir,
                            format!(
                                "the state `{state}` of operator `{operator}` is not a {}: {d}",
                                std::any::type_name::<V>()
                            ),
                        ));
                    }
                }
                None => {
                    let codec = V::codec_id().to_string();
                    if f.codec.as_ref().is_some_and(|c| *c != codec) {
                        return Err(bad(
                            &self.dir,
                            format!(
                                "the state `{state}` of operator `{operator}` was written with codec {:?}, not {codec}",
                                f.codec
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Every entry of `operator`'s value state `state`, as `(K, V)`s, by
    /// key group (within one, in no particular order).
    ///
    /// # Errors
    /// [`Error::Checkpoint`] when the state is not there or its recorded
    /// schema is not `V`'s; [`Error::Codec`] or [`Error::State`] when an
    /// entry does not decode.
    pub fn entries<K: Key, V: Data>(&self, operator: &str, state: &str) -> Result<Vec<(K, V)>> {
        self.check::<V>(operator, state)?;
        let all = 0..self.manifest.max_key_groups;
        let live = self.opened.restore().entries(operator, state, CodecCheck::any(), &all)?;
        live.into_iter()
            .map(|(_, key, value)| {
                let k = crate::codec::key::decode::<K>(&key).map_err(|e| Error::State {
                    operator: operator.to_string(),
                    message: "a key in the savepoint does not decode".into(),
                    source: Some(e.into()),
                })?;
                let v = V::decode(&value).map_err(|source| Error::Codec { operator: operator.to_string(), source })?;
                Ok((k, v))
            })
            .collect()
    }

    /// The value of `key` in `operator`'s value state `state`, if any.
    ///
    /// # Errors
    /// As [`SavepointReader::entries`].
    pub fn get<K: Key, V: Data>(&self, operator: &str, state: &str, key: &K) -> Result<Option<V>> {
        self.check::<V>(operator, state)?;
        let encoded = crate::codec::key::encode(key);
        let group = crate::codec::key::key_group(&encoded, self.manifest.max_key_groups);
        let found = self.opened.value(operator, state, group, &encoded)?;
        found
            .map(|v| V::decode(&v).map_err(|source| Error::Codec { operator: operator.to_string(), source }))
            .transpose()
    }
}

/// A state to write: its entries, encoded, by key group.
impl SavepointReader {
    /// `key`'s map in `operator`'s map state `state`: its entries in the
    /// order of the user keys' encoding (for integers and strings, their
    /// natural order). A map state with a time-to-live holds
    /// [`Expiring<UV>`](crate::state::Expiring)s.
    ///
    /// # Errors
    /// As [`SavepointReader::entries`].
    pub fn map<K: Key, UK: Key, UV: Data>(&self, operator: &str, state: &str, key: &K) -> Result<Vec<(UK, UV)>> {
        self.check::<UV>(operator, state)?;
        let prefix = crate::codec::key::encode(key);
        // A map's entries are filed under the key's group, not the
        // composite key's.
        let group = crate::codec::key::key_group(&prefix, self.manifest.max_key_groups);
        let live = self.opened.restore().entries(operator, state, CodecCheck::any(), &(group..group + 1))?;
        let mut found: Vec<(Vec<u8>, Vec<u8>)> =
            live.into_iter().filter(|(_, k, _)| k.starts_with(&prefix)).map(|(_, k, v)| (k, v)).collect();
        found.sort();
        found
            .into_iter()
            .map(|(composite, value)| {
                let (_, user_key) = crate::codec::key::decode::<(K, UK)>(&composite).map_err(|e| Error::State {
                    operator: operator.to_string(),
                    message: format!("an entry of map state `{state}` in the savepoint does not decode"),
                    source: Some(e.into()),
                })?;
                let v = UV::decode(&value).map_err(|source| Error::Codec { operator: operator.to_string(), source })?;
                Ok((user_key, v))
            })
            .collect()
    }

    /// `key`'s list in `operator`'s list state `state`, in the order the
    /// elements were added. A list state with a time-to-live holds
    /// [`Expiring<T>`](crate::state::Expiring)s.
    ///
    /// # Errors
    /// As [`SavepointReader::entries`].
    pub fn list<K: Key, T: Data>(&self, operator: &str, state: &str, key: &K) -> Result<Vec<T>> {
        // A list is a map from a sequence number to the element.
        Ok(self.map::<K, u64, T>(operator, state, key)?.into_iter().map(|(_, v)| v).collect())
    }
}

/// `value` encoded, for `operator`'s state.
fn encode_value<V: Data>(operator: &str, value: &V) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    value.encode(&mut out).map_err(|source| Error::Codec { operator: operator.to_string(), source })?;
    Ok(out)
}

struct NewState {
    codec: String,
    schema: Schema,
    key_type: String,
    key_schema: crate::codec::schema::Shape,
    entries: Vec<(u16, Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for SavepointReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavepointReader")
            .field("dir", &self.dir)
            .field("checkpoint", &self.manifest.checkpoint)
            .finish()
    }
}

/// A new savepoint, made from another one with some value states replaced
/// or dropped.
pub struct SavepointWriter {
    /// Where the savepoint it starts from is, for messages.
    from: PathBuf,
    /// Its storage and directory there.
    source: (Arc<dyn CheckpointStorage>, String),
    manifest: Manifest,
    states: BTreeMap<(String, String), NewState>,
    dropped: Vec<String>,
    versions: BTreeMap<String, u32>,
    /// Versions of single states (`States::version`), by (operator, state).
    named_versions: BTreeMap<(String, String), u32>,
}

impl std::fmt::Debug for SavepointWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavepointWriter").field("from", &self.from).field("dropped", &self.dropped).finish()
    }
}

impl SavepointWriter {
    /// Starts from `reader`'s savepoint: written as is, unless states are
    /// replaced or dropped.
    pub fn from(reader: &SavepointReader) -> Self {
        Self {
            from: reader.dir.clone(),
            source: reader.source.clone(),
            manifest: reader.manifest.clone(),
            states: BTreeMap::new(),
            dropped: Vec::new(),
            versions: BTreeMap::new(),
            named_versions: BTreeMap::new(),
        }
    }

    /// Replaces `operator`'s value state `state` with `entries` (for an
    /// operator the savepoint does not have, bootstraps it): a job that
    /// restores the new savepoint starts with them.
    ///
    /// # Errors
    /// [`Error::Codec`] when a value does not encode.
    pub fn set_state<K: Key, V: Data>(
        &mut self,
        operator: &str,
        state: &str,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Result<&mut Self> {
        let max = self.manifest.max_key_groups;
        let mut encoded = Vec::new();
        for (k, v) in entries {
            let key = crate::codec::key::encode(&k);
            encoded.push((crate::codec::key::key_group(&key, max), key, encode_value(operator, &v)?));
        }
        self.insert_state::<K, V>(operator, state, encoded);
        Ok(self)
    }

    /// Replaces `operator`'s map state `state` with `entries` (key, user
    /// key, value), or bootstraps it: each key's map holds its entries (a
    /// user key given twice for a key keeps the first). A map state with a
    /// time-to-live takes [`Expiring<UV>`](crate::state::Expiring)s.
    ///
    /// # Errors
    /// [`Error::Codec`] when a value does not encode.
    pub fn set_map_state<K: Key, UK: Key, UV: Data>(
        &mut self,
        operator: &str,
        state: &str,
        entries: impl IntoIterator<Item = (K, UK, UV)>,
    ) -> Result<&mut Self> {
        let max = self.manifest.max_key_groups;
        let mut encoded = Vec::new();
        for (k, uk, v) in entries {
            // Filed under the key's group: the composite key's encoding
            // starts with the key's.
            let mut key = crate::codec::key::encode(&k);
            let group = crate::codec::key::key_group(&key, max);
            uk.encode_key(&mut key);
            encoded.push((group, key, encode_value(operator, &v)?));
        }
        self.insert_state::<K, UV>(operator, state, encoded);
        Ok(self)
    }

    /// Replaces `operator`'s list state `state` with `lists` (each key's
    /// list, in order), or bootstraps it. A list state with a time-to-live
    /// takes [`Expiring<T>`](crate::state::Expiring)s.
    ///
    /// # Errors
    /// [`Error::Codec`] when an element does not encode.
    pub fn set_list_state<K: Key, T: Data>(
        &mut self,
        operator: &str,
        state: &str,
        lists: impl IntoIterator<Item = (K, Vec<T>)>,
    ) -> Result<&mut Self> {
        // A list is a map from a sequence number to the element; a job that
        // restores it numbers the elements it adds above these.
        let entries = lists.into_iter().flat_map(|(k, list)| {
            list.into_iter().zip(0u64..).map(move |(v, seq)| (k.clone(), seq, v)).collect::<Vec<_>>()
        });
        self.set_map_state::<K, u64, T>(operator, state, entries)
    }

    /// Files the encoded `entries` (key group, key, value) as `operator`'s
    /// state `state`, of values `V` under keys `K`, in place of what the
    /// savepoint holds.
    fn insert_state<K: Key, V: Data>(
        &mut self,
        operator: &str,
        state: &str,
        mut encoded: Vec<(u16, Vec<u8>, Vec<u8>)>,
    ) {
        // Stable, so that of a key given twice the first stays (and is kept).
        encoded.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        encoded.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        self.states.insert(
            (operator.to_string(), state.to_string()),
            NewState {
                codec: V::codec_id().to_string(),
                schema: (*V::schema()).clone(),
                key_type: crate::codec::recorded_type_name(std::any::type_name::<K>()).into_owned(),
                key_schema: K::key_schema(),
                entries: encoded,
            },
        );
    }

    /// Records version `version` of `operator`'s state (see
    /// `Stream::state_version`): for state transformed (or bootstrapped)
    /// into the meaning of a job whose operator declares that version, so
    /// that its restore does not migrate it again.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] for version 0, or an operator that neither
    /// the savepoint nor a `set_state` names.
    pub fn set_state_version(&mut self, operator: &str, version: u32) -> Result<&mut Self> {
        let known =
            self.manifest.operators.iter().any(|o| o.id == operator) || self.states.keys().any(|(o, _)| o == operator);
        if version == 0 || !known {
            let why = if version == 0 { "versions start at 1" } else { "it has no state in the savepoint" };
            return Err(bad(&self.from, format!("cannot set the state version of `{operator}` to {version}: {why}")));
        }
        self.versions.insert(operator.to_string(), version);
        Ok(self)
    }

    /// Records version `version` of `operator`'s state `state` alone (a
    /// state a process function declared with its own version,
    /// `States::version`): for a state transformed into the meaning of a
    /// job that declares that version.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] for version 0, or a state that neither the
    /// savepoint nor a `set_*state` call names.
    pub fn set_named_state_version(&mut self, operator: &str, state: &str, version: u32) -> Result<&mut Self> {
        let key = (operator.to_string(), state.to_string());
        let known = self.manifest.states.iter().any(|s| s.operator == operator && s.state == state)
            || self.states.contains_key(&key);
        if version == 0 || !known {
            let why = if version == 0 { "versions start at 1" } else { "the savepoint has no such state" };
            return Err(bad(
                &self.from,
                format!("cannot set the version of state `{state}` of `{operator}` to {version}: {why}"),
            ));
        }
        self.named_versions.insert(key, version);
        Ok(self)
    }

    /// Drops all of `operator`'s state: a job without it restores the new
    /// savepoint without `allow_unrestored_state`.
    pub fn drop_operator(&mut self, operator: &str) -> &mut Self {
        self.dropped.push(operator.to_string());
        self
    }

    /// Writes the new savepoint into `dir`, which must not exist: the state
    /// files it keeps are copied, the new ones written, the manifest last.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Checkpoint`] naming what cannot be read or
    /// written.
    pub fn write(self, dir: impl AsRef<Path>) -> Result<PathBuf> {
        let dir = dir.as_ref().to_path_buf();
        if dir.exists() {
            return Err(bad(&dir, "exists already: a savepoint is written into a new directory".into()));
        }
        std::fs::create_dir_all(&dir).map_err(io("cannot create savepoint directory", dir.clone()))?;
        self.write_in(&LocalDir::new(&dir), "")?;
        Ok(dir)
    }

    /// As [`SavepointWriter::write`], into directory `dir` of `storage`
    /// (`savepoints/<name>` for a job to restore with
    /// `Job::restore_from_storage`): S3, or any other
    /// [`CheckpointStorage`]. State files it keeps are copied from the
    /// savepoint it started from (server-side within one storage that
    /// copies so).
    ///
    /// # Errors
    /// As [`SavepointWriter::write`]; [`Error::Checkpoint`] when `dir`
    /// already holds a manifest.
    pub fn write_in(self, storage: &dyn CheckpointStorage, dir: &str) -> Result<()> {
        let located = PathBuf::from(dir);
        let manifest_name = join(dir, MANIFEST);
        if storage.exists(&manifest_name).map_err(io("cannot read savepoint directory", located.clone()))? {
            return Err(bad(&located, "holds a savepoint already: a savepoint is written into a new directory".into()));
        }
        let (from_storage, from_dir) = &self.source;
        let same = std::ptr::addr_eq(std::ptr::from_ref(&**from_storage), std::ptr::from_ref(storage));
        let mut manifest = self.manifest;
        let replaced = |s: &StateFileEntry| self.states.contains_key(&(s.operator.clone(), s.state.clone()));
        manifest.states.retain(|s| !self.dropped.contains(&s.operator) && !replaced(s));
        manifest.operators.retain(|o| !self.dropped.contains(&o.id));
        manifest.commits.retain(|c| !self.dropped.contains(&c.sink));
        manifest.sources.retain(|p| !self.dropped.contains(&p.source));
        for s in &mut manifest.states {
            let source = join(from_dir, &s.file);
            let file = s.file.rsplit('/').next().unwrap_or_default().to_string();
            let target = join(dir, &file);
            let failed = io("cannot copy into savepoint", self.from.join(&s.file));
            if same {
                storage.copy(&source, &target).map_err(failed)?;
            } else {
                let copied = (|| {
                    let mut input = from_storage.open(&source)?;
                    let mut output = storage.create(&target)?;
                    std::io::copy(&mut input, &mut output)?;
                    output.finish()
                })();
                copied.map_err(failed)?;
            }
            s.file = file;
        }
        let n = manifest.checkpoint;
        let max = manifest.max_key_groups;
        for ((operator, state), new) in self.states {
            let (name, _) = naming::state_file(&operator, 0, &state, n, "rewritten");
            let file = name.rsplit('/').next().unwrap_or_default().to_string();
            let meta = StateFile {
                operator: operator.clone(),
                state: state.clone(),
                codec: new.codec.clone(),
                groups: Vec::new(),
                removed: Vec::new(),
            };
            let mut writer = StateFileWriter::create(storage, &join(dir, &file), &meta)?;
            let mut frame = crate::state::SnapshotFrame::default();
            for (group, key, value) in &new.entries {
                frame.keys.extend_from_slice(key);
                frame.values.extend_from_slice(value);
                frame.end_entry(*group)?;
                if frame.bytes() >= crate::state::SNAPSHOT_PART_BYTES || frame.len() >= crate::state::SNAPSHOT_PART {
                    writer.part(&frame)?;
                    frame = crate::state::SnapshotFrame::default();
                }
            }
            if !frame.is_empty() {
                writer.part(&frame)?;
            }
            let (bytes, entries) = writer.finish()?;
            let schema_id = new.schema.id();
            manifest.schemas.insert(schema_id.clone(), new.schema);
            match manifest.operators.iter_mut().find(|o| o.id == operator) {
                Some(o) => {
                    o.key_type = new.key_type;
                    o.key_schema = Some(new.key_schema);
                }
                // Bootstrapped: of any kind, keyed by `K`.
                None => manifest.operators.push(crate::checkpoint::OperatorEntry {
                    id: operator.clone(),
                    kind: String::new(),
                    key_type: new.key_type,
                    key_schema: Some(new.key_schema),
                    state_version: 1,
                }),
            }
            manifest.states.push(StateFileEntry {
                operator,
                state,
                codec: Some(new.codec),
                schema: Some(schema_id),
                file,
                key_groups: (0, max),
                checkpoint: n,
                base: true,
                bytes: Some(bytes),
                entries: Some(entries),
                version: None,
                expired_before: None,
            });
        }
        for (operator, version) in &self.versions {
            if let Some(o) = manifest.operators.iter_mut().find(|o| o.id == *operator) {
                o.state_version = *version;
            }
        }
        for s in &mut manifest.states {
            if let Some(version) = self.named_versions.get(&(s.operator.clone(), s.state.clone())) {
                s.version = Some(*version);
            }
        }
        // Only the schemas its files still name.
        let named: std::collections::BTreeSet<String> =
            manifest.states.iter().filter_map(|s| s.schema.clone()).collect();
        manifest.schemas.retain(|id, _| named.contains(id));
        manifest
            .states
            .sort_by(|a, b| (&a.operator, &a.state, a.key_groups).cmp(&(&b.operator, &b.state, b.key_groups)));
        write_manifest(storage, dir, &manifest)?;
        Ok(())
    }
}
