//! Looking inside a checkpoint or savepoint without the job's code: its
//! operators, their states (codec, schema, key groups, live entries and
//! their size), source positions and pending commits; and one key's state,
//! decoded by the schema the checkpoint recorded. What
//! `weibo savepoint inspect` prints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::manifest::{read_manifest, read_manifest_in};
use super::restore::{CodecCheck, Restore};
use super::storage::{CheckpointStorage, LocalDir};
use super::{CommitEntry, SourcePositionEntry, StateFileEntry, bad, io};
use crate::codec::schema::{Schema, Shape, decode_postcard, hex};
use crate::error::Result;

/// What a checkpoint holds.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    /// Where it is.
    pub path: PathBuf,
    /// The job that took it.
    pub job: String,
    /// Its number.
    pub checkpoint: u64,
    /// The job's number of key groups.
    pub max_key_groups: u16,
    /// Per operator with state, by id.
    pub operators: Vec<OperatorInspection>,
    /// Every source partition's position.
    pub sources: Vec<SourcePositionEntry>,
    /// Exactly-once sink transactions it commits.
    pub commits: Vec<CommitEntry>,
}

/// An operator's part of a checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorInspection {
    /// Its id.
    pub id: String,
    /// What it is, when the checkpoint says (earlier builds do not).
    pub kind: Option<String>,
    /// Its key type, when the checkpoint says.
    pub key_type: Option<String>,
    /// The version of its state the user declared (1 unless set).
    pub state_version: u32,
    /// Its states.
    pub states: Vec<StateInspection>,
}

/// One state of an operator.
#[derive(Debug, Clone, Serialize)]
pub struct StateInspection {
    /// Its name in the operator.
    pub name: String,
    /// The codec of its values.
    pub codec: Option<String>,
    /// The schema of its values, when recorded.
    pub schema: Option<Schema>,
    /// The key-group ranges of its files (one per instance that wrote it).
    pub key_groups: Vec<(u16, u16)>,
    /// Its files (bases and deltas).
    pub files: usize,
    /// Live entries, after every delta is applied.
    pub entries: u64,
    /// Bytes of their keys and values.
    pub bytes: u64,
}

/// One key's entry in a state.
#[derive(Debug, Clone, Serialize)]
pub struct KeyState {
    /// The operator's id.
    pub operator: String,
    /// The state.
    pub state: String,
    /// The key group the key belongs to.
    pub key_group: u16,
    /// The encoded key, in hex.
    pub key: String,
    /// The value, decoded by its recorded schema (or in hex, if that
    /// cannot be).
    pub value: serde_json::Value,
}

impl Inspection {
    /// Reads the checkpoint or savepoint in directory `path` (one with a
    /// `MANIFEST`), every file of it checked.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] or [`Error::Io`] naming the file that cannot
    /// be read, is damaged or is not a checkpoint's.
    pub fn open(path: &Path) -> Result<(Self, Opened)> {
        // Read first: a missing or damaged manifest is named by its path.
        read_manifest(path)?;
        let canonical = std::fs::canonicalize(path).map_err(io("cannot read checkpoint directory", path.into()))?;
        let (parent, name) = match (canonical.parent(), canonical.file_name()) {
            (Some(p), Some(n)) => (p.to_path_buf(), n.to_string_lossy().into_owned()),
            _ => return Err(bad(path, "is not a checkpoint's directory".into())),
        };
        let storage: Arc<dyn CheckpointStorage> = Arc::new(LocalDir::new(parent));
        let (mut inspection, opened) = Self::open_in(&storage, &name)?;
        inspection.path = canonical;
        Ok((inspection, opened))
    }

    /// As [`Inspection::open`], for the checkpoint or savepoint in directory
    /// `dir` of `storage` (`chk-<n>`, `savepoints/<name>`): one in S3, or
    /// any other [`CheckpointStorage`]. Its `path` is `dir`.
    ///
    /// # Errors
    /// As [`Inspection::open`].
    pub fn open_in(storage: &Arc<dyn CheckpointStorage>, dir: &str) -> Result<(Self, Opened)> {
        let manifest = read_manifest_in(&**storage, dir)?;
        let restore = Restore::load(storage, dir, manifest.max_key_groups)?;
        let mut operators: BTreeMap<String, OperatorInspection> = BTreeMap::new();
        for o in &manifest.operators {
            operators.insert(
                o.id.clone(),
                OperatorInspection {
                    id: o.id.clone(),
                    kind: (!o.kind.is_empty()).then(|| o.kind.clone()),
                    key_type: Some(o.key_type.clone()),
                    state_version: o.state_version,
                    states: Vec::new(),
                },
            );
        }
        let all = 0..manifest.max_key_groups;
        for (id, files) in &restore.states {
            let mut names: Vec<&str> = files.iter().map(|f| f.state.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            let op = operators.entry(id.clone()).or_insert_with(|| OperatorInspection {
                id: id.clone(),
                kind: None,
                key_type: None,
                state_version: 1,
                states: Vec::new(),
            });
            for state in names {
                let of: Vec<&StateFileEntry> = files.iter().filter(|f| f.state == state).collect();
                let mut key_groups: Vec<(u16, u16)> = of.iter().map(|f| f.key_groups).collect();
                key_groups.sort_unstable();
                key_groups.dedup();
                let (entries, bytes) = live_size(&restore, id, state, &of, &all)?;
                op.states.push(StateInspection {
                    name: state.to_string(),
                    codec: of.iter().find_map(|f| f.codec.clone()),
                    schema: of.iter().find_map(|f| f.schema.as_ref()).and_then(|s| manifest.schemas.get(s)).cloned(),
                    key_groups,
                    files: of.len(),
                    entries,
                    bytes,
                });
            }
        }
        let inspection = Self {
            path: PathBuf::from(dir),
            job: manifest.job.clone(),
            checkpoint: manifest.checkpoint.get(),
            max_key_groups: manifest.max_key_groups,
            operators: operators.into_values().collect(),
            sources: manifest.sources.clone(),
            commits: manifest.commits.clone(),
        };
        Ok((inspection, Opened { restore }))
    }
}

/// The live entries of `operator`'s `state` (files `of`) and the bytes of
/// their keys and values, read in place a frame at a time: summed as they
/// come when every file is a base of its own key groups; otherwise, with
/// deltas to apply, counted by a 128-bit hash of each key (and its
/// entry's size), so that no key or value is held.
fn live_size(
    restore: &Restore,
    operator: &str,
    state: &str,
    of: &[&StateFileEntry],
    all: &std::ops::Range<u16>,
) -> Result<(u64, u64)> {
    let mut ranges: Vec<(u16, u16)> = of.iter().map(|f| f.key_groups).collect();
    ranges.sort_unstable();
    ranges.dedup();
    let (mut entries, mut bytes) = (0u64, 0u64);
    if of.iter().all(|f| f.base) && ranges.len() == of.len() {
        restore.load_entries_of(operator, state, CodecCheck::any(), all, &mut |part, _, _| {
            entries += part.len() as u64;
            bytes += part.iter().map(|(_, k, v)| (k.len() + v.len()) as u64).sum::<u64>();
            Ok(())
        })?;
        return Ok((entries, bytes));
    }
    let id = |group: u16, key: &[u8]| {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&group.to_le_bytes());
        h.update(key);
        h.digest128()
    };
    let mut live: std::collections::HashMap<u128, u64> = std::collections::HashMap::new();
    restore.load_entries_of(operator, state, CodecCheck::any(), all, &mut |part, removed, _| {
        for (g, k) in removed {
            live.remove(&id(*g, k));
        }
        for (g, k, v) in part.iter() {
            live.insert(id(*g, k), (k.len() + v.len()) as u64);
        }
        Ok(())
    })?;
    Ok((live.len() as u64, live.values().sum()))
}

/// An opened checkpoint, to look keys up in.
pub struct Opened {
    restore: Restore,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Opened({})", self.restore.location().display())
    }
}

impl Opened {
    /// The checkpoint, loaded.
    pub(crate) fn restore(&self) -> &Restore {
        &self.restore
    }

    /// The encoded value of encoded key `key` (of key group `group`) in
    /// `operator`'s `state`, if any.
    /// Reads the files of the key's group in place, a frame at a time,
    /// and copies out only its value.
    pub(crate) fn value(&self, operator: &str, state: &str, group: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut found = None;
        self.restore.load_entries_of(
            operator,
            state,
            CodecCheck::any(),
            &(group..group + 1),
            &mut |entries, removed, _| {
                // A part's removals come before its entries.
                if removed.iter().any(|(_, k)| *k == key) {
                    found = None;
                }
                if let Some((_, _, v)) = entries.iter().find(|(_, k, _)| *k == key) {
                    found = Some(v.to_vec());
                }
                Ok(())
            },
        )?;
        Ok(found)
    }

    /// The entry of encoded key `key` in `operator`'s `state`, if any,
    /// decoded by the state's recorded schema.
    ///
    /// # Errors
    /// As [`Inspection::open`].
    pub fn key_state(
        &self,
        inspection: &Inspection,
        operator: &str,
        state: &str,
        key: &[u8],
    ) -> Result<Option<KeyState>> {
        let group = crate::codec::key::key_group(key, inspection.max_key_groups);
        let Some(value) = self.value(operator, state, group, key)? else { return Ok(None) };
        let shape = inspection
            .operators
            .iter()
            .find(|o| o.id == operator)
            .and_then(|o| o.states.iter().find(|s| s.name == state))
            .and_then(|s| s.schema.as_ref())
            .map(|s| &s.shape);
        let value = match shape.map(|s| decode_postcard(s, &value)) {
            Some(Ok(v)) => v,
            _ => serde_json::Value::String(hex(&value)),
        };
        Ok(Some(KeyState { operator: operator.into(), state: state.into(), key_group: group, key: hex(key), value }))
    }
}

/// Parses `text` as a key of type `key_type` (as checkpoints name types)
/// and encodes it as keys are stored: for the integer types, `bool`,
/// `char` and `String`. Other key types take the encoded key in hex.
///
/// # Errors
/// A message naming the text and the type.
pub fn encode_key_text(key_type: &str, text: &str) -> std::result::Result<Vec<u8>, String> {
    use crate::codec::key::encode;
    let bad = |e: &dyn std::fmt::Display| format!("`{text}` is not a key of type `{key_type}`: {e}");
    Ok(match key_type {
        "u8" => encode(&text.parse::<u8>().map_err(|e| bad(&e))?),
        "u16" => encode(&text.parse::<u16>().map_err(|e| bad(&e))?),
        "u32" => encode(&text.parse::<u32>().map_err(|e| bad(&e))?),
        "u64" => encode(&text.parse::<u64>().map_err(|e| bad(&e))?),
        "u128" => encode(&text.parse::<u128>().map_err(|e| bad(&e))?),
        "i8" => encode(&text.parse::<i8>().map_err(|e| bad(&e))?),
        "i16" => encode(&text.parse::<i16>().map_err(|e| bad(&e))?),
        "i32" => encode(&text.parse::<i32>().map_err(|e| bad(&e))?),
        "i64" => encode(&text.parse::<i64>().map_err(|e| bad(&e))?),
        "i128" => encode(&text.parse::<i128>().map_err(|e| bad(&e))?),
        "bool" => encode(&text.parse::<bool>().map_err(|e| bad(&e))?),
        "char" => encode(&text.parse::<char>().map_err(|e| bad(&e))?),
        "alloc::string::String" => encode(&text.to_string()),
        _ => {
            let hex = text.strip_prefix("0x").unwrap_or(text);
            if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "keys of type `{key_type}` are given as their encoding in hex (`0x...`), and `{text}` is not hex"
                ));
            }
            (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0))
                .collect()
        }
    })
}

impl std::fmt::Display for Inspection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "checkpoint {} of job `{}` ({} key groups)", self.checkpoint, self.job, self.max_key_groups)?;
        writeln!(f, "  at {}", self.path.display())?;
        for o in &self.operators {
            write!(f, "operator `{}`", o.id)?;
            if let Some(kind) = &o.kind {
                write!(f, ": {kind}")?;
            }
            if let Some(key) = &o.key_type {
                write!(f, ", keyed by {key}")?;
            }
            if o.state_version != 1 {
                write!(f, ", state version {}", o.state_version)?;
            }
            writeln!(f)?;
            for s in &o.states {
                writeln!(
                    f,
                    "  state `{}`: {} entries, {} bytes, {} files, key groups {}",
                    s.name,
                    s.entries,
                    s.bytes,
                    s.files,
                    s.key_groups.iter().map(|(a, b)| format!("{a}..{b}")).collect::<Vec<_>>().join(" ")
                )?;
                if let Some(codec) = &s.codec {
                    writeln!(f, "    codec  {codec}")?;
                }
                if let Some(schema) = &s.schema {
                    writeln!(f, "    schema {}", describe(&schema.shape))?;
                }
            }
        }
        for s in &self.sources {
            write!(f, "source `{}` partition {}: position {}", s.source, s.partition, s.position)?;
            if let Some(name) = &s.partition_name {
                write!(f, " ({name})")?;
            }
            writeln!(f)?;
        }
        for c in &self.commits {
            writeln!(f, "pending commit of sink `{}`: {}", c.sink, c.handle)?;
        }
        Ok(())
    }
}

/// A shape spelled out one level deep: a struct with its fields, an enum
/// with its variants.
fn describe(shape: &Shape) -> String {
    let fields = |fields: &[(String, Shape)]| -> String {
        fields
            .iter()
            .map(|(n, s)| if n.is_empty() { s.to_string() } else { format!("{n}: {s}") })
            .collect::<Vec<_>>()
            .join(", ")
    };
    match shape {
        Shape::Struct { name, fields: f } => format!("{name} {{ {} }}", fields(f)),
        Shape::Enum { name, variants } => format!(
            "enum {name} {{ {} }}",
            variants
                .iter()
                .map(|(n, f)| if f.is_empty() { n.clone() } else { format!("{n}({})", fields(f)) })
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}
