//! Manifests: a checkpoint is complete once its manifest is written, and
//! what is in a storage is found by its manifests.

use std::path::{Path, PathBuf};

use super::naming::{checkpoint_number, written_by};
use super::storage::{CheckpointStorage, LocalDir};
use super::{FORMAT_VERSION, MANIFEST, Manifest, SHARED, bad, bad_caused, io, storage};
use crate::error::Result;
use crate::record::CheckpointId;

/// Writes the manifest of checkpoint (or savepoint) `dir` atomically: only
/// a checkpoint with a manifest is complete.
pub(crate) fn write_manifest(storage: &dyn CheckpointStorage, dir: &str, manifest: &Manifest) -> Result<()> {
    let name = storage::join(dir, MANIFEST);
    let path = storage.locate(&name);
    let json = serde_json::to_vec_pretty(manifest).map_err(|e| bad_caused(&path, "cannot encode".into(), e))?;
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
        serde_json::from_slice(&bytes).map_err(|e| bad_caused(&path, "not a valid manifest".into(), e))?;
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
pub(crate) fn highest_checkpoint(storage: &dyn CheckpointStorage) -> Result<CheckpointId> {
    let list = |prefix: &str| storage.list(prefix).map_err(io("cannot list checkpoints", storage.locate(prefix)));
    let checkpoints = list("chk-")?.into_iter().filter_map(|n| checkpoint_number(n.split('/').next()?));
    let files = list(&format!("{SHARED}/"))?.into_iter().filter_map(|n| written_by(&n));
    Ok(checkpoints.chain(files).max().unwrap_or(CheckpointId::NONE))
}

/// The complete checkpoints in `storage` under `dir` (`""` for the top),
/// newest first: their numbers and directories' names.
///
/// # Errors
/// When the storage cannot be listed.
pub fn complete_checkpoints_in(storage: &dyn CheckpointStorage, dir: &str) -> Result<Vec<(CheckpointId, String)>> {
    let prefix = storage::join(dir, "chk-");
    let names = storage.list(&prefix).map_err(io("cannot list checkpoints", storage.locate(&prefix)))?;
    let mut found: Vec<(CheckpointId, String)> = names
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
pub fn complete_checkpoints(root: &Path) -> Vec<(CheckpointId, PathBuf)> {
    complete_checkpoints_in(&LocalDir::new(root), "")
        .unwrap_or_default()
        .into_iter()
        .map(|(n, dir)| (n, root.join(dir)))
        .collect()
}

/// The names of the complete savepoints in `storage` (those with a
/// manifest), sorted: restore one from `savepoints/<name>`.
///
/// # Errors
/// When the storage cannot be listed.
pub fn savepoints_in(storage: &dyn CheckpointStorage) -> Result<Vec<String>> {
    let prefix = "savepoints/";
    let names = storage.list(prefix).map_err(io("cannot list savepoints", storage.locate(prefix)))?;
    let mut found: Vec<String> = names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix)?.strip_suffix(MANIFEST)?.strip_suffix('/'))
        .filter(|n| !n.contains('/'))
        .map(str::to_string)
        .collect();
    found.sort();
    Ok(found)
}
