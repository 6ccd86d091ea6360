//! State on disk: the fjall backend.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::state::{StateBackend, StateScope, StateTable};

/// Keyed state in fjall, an LSM tree on local disk: state larger than memory,
/// paid for with an encode, a decode and a tree lookup per access.
///
/// Every (job, operator, state) gets its own fjall keyspace; inside it a
/// key is the key group (two bytes, big-endian) followed by the encoded key,
/// so one key group is one contiguous range of the keyspace.
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
}

impl fmt::Debug for FjallBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FjallBackend").field("path", &self.path).finish_non_exhaustive()
    }
}

fn state_error(operator: &str, what: &str, e: &fjall::Error) -> Error {
    Error::State { operator: operator.to_string(), message: format!("fjall {what}: {e}") }
}

impl FjallBackend {
    /// Opens (or creates) the database in directory `dir`.
    ///
    /// # Errors
    /// [`Error::State`] naming the directory when fjall cannot open it.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let path = dir.as_ref().to_path_buf();
        let db = fjall::Database::builder(&path).manual_journal_persist(true).open().map_err(|e| Error::State {
            operator: String::new(),
            message: format!("cannot open the fjall database in `{}`: {e}", path.display()),
        })?;
        Ok(Self { db, path })
    }

    /// The database's directory.
    pub fn path(&self) -> &Path {
        &self.path
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
                    .map_err(|e| state_error(job, &format!("cannot open keyspace `{name}`"), &e))?;
                self.db
                    .delete_keyspace(keyspace)
                    .map_err(|e| state_error(job, &format!("cannot drop old keyspace `{name}`"), &e))?;
            }
        }
        Ok(())
    }

    fn open_table(&self, scope: &StateScope) -> Result<Box<dyn StateTable>> {
        let name = Self::keyspace_name(scope);
        let keyspace = self
            .db
            .keyspace(&name, fjall::KeyspaceCreateOptions::default)
            .map_err(|e| state_error(&scope.operator, &format!("cannot open keyspace `{name}`"), &e))?;
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
    fn get(&mut self, group: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let k = self.key(group, key).to_vec();
        match self.keyspace.get(&k) {
            Ok(v) => Ok(v.map(|v| v.to_vec())),
            Err(e) => Err(state_error(&self.operator, "read", &e)),
        }
    }

    fn put(&mut self, group: u16, key: &[u8], value: &[u8]) -> Result<()> {
        let k = self.key(group, key).to_vec();
        self.keyspace.insert(k, value).map_err(|e| state_error(&self.operator, "write", &e))
    }

    /// Writes in batches of 16,384 (one journal write each).
    fn put_all(&mut self, entries: &[(u16, Vec<u8>, Vec<u8>)]) -> Result<()> {
        for chunk in entries.chunks(16_384) {
            let mut batch = self.db.batch();
            for (group, key, value) in chunk {
                let mut k = Vec::with_capacity(2 + key.len());
                k.extend_from_slice(&group.to_be_bytes());
                k.extend_from_slice(key);
                batch.insert(&self.keyspace, k, value.as_slice());
            }
            batch.commit().map_err(|e| state_error(&self.operator, "batch write", &e))?;
        }
        Ok(())
    }

    fn delete(&mut self, group: u16, key: &[u8]) -> Result<()> {
        let k = self.key(group, key).to_vec();
        self.keyspace.remove(k).map_err(|e| state_error(&self.operator, "delete", &e))
    }

    /// Takes an fjall snapshot now (cheap: MVCC) and reads it later.
    fn export_deferred(&mut self, groups: std::ops::Range<u16>) -> Result<crate::state::Export> {
        let snapshot = self.db.snapshot();
        let keyspace = self.keyspace.clone();
        let operator = self.operator.clone();
        Ok(Box::new(move || {
            use fjall::Readable;
            let mut out = Vec::new();
            for group in groups {
                for guard in snapshot.prefix(&keyspace, group.to_be_bytes()) {
                    let (k, v) = guard.into_inner().map_err(|e| state_error(&operator, "snapshot read", &e))?;
                    out.push((group, k.get(2..).unwrap_or_default().to_vec(), v.to_vec()));
                }
            }
            Ok(crate::state::Exported::full(out))
        }))
    }

    fn scan_group(&mut self, group: u16, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        for guard in self.keyspace.prefix(group.to_be_bytes()) {
            let (k, v) = guard.into_inner().map_err(|e| state_error(&self.operator, "scan", &e))?;
            f(k.get(2..).unwrap_or_default(), &v);
        }
        Ok(())
    }
}
