//! Where checkpoints are kept.
//!
//! A [`CheckpointStorage`] is a flat namespace of objects named by
//! `/`-separated paths (`chk-00000000000000000007/MANIFEST`,
//! `shared/sum-0-value-00000000000000000007-3f9c2a6b1d4e8f07.state`), the model of an
//! object store. Weibo needs only what every object store offers:
//!
//! - objects are written once, whole, and never changed afterwards (state
//!   files stream through [`CheckpointStorage::create`]; nothing is
//!   appended to or rewritten later);
//! - the manifest that completes a checkpoint is written with
//!   [`CheckpointStorage::put`], which must be atomic: a reader sees all of
//!   it or none of it;
//! - reads may seek (a state file's trailer is read before its frames);
//! - listing by name prefix, and deleting.
//!
//! There is no rename and no append: a state file carries its length and
//! checksum in a trailer, so it is written front to back in one pass.
//!
//! One object is not written once: the lock (`LOCK`) through which a run
//! owns the storage ([`CheckpointStorage::try_lock`], see
//! [`lease`](super::lease)). Each storage writes it its own way (a file
//! locked by the operating system, an object written with conditional
//! puts), never through `create` or `put`.
//!
//! Two storages come with Weibo: [`LocalDir`], a directory (what
//! [`Job::with_checkpoints`](crate::Job::with_checkpoints) uses), and
//! [`MemoryStorage`], in memory, for tests and for jobs whose sink keeps
//! the source positions (nothing in their checkpoints has to outlive the
//! process); it refuses to overwrite an
//! object, so a test on it also checks that a pipeline's checkpoints keep
//! to the rules above. An object store (S3, GCS, Azure) is a third
//! implementation of the trait.
//!
//! Methods block. On a multi-threaded tokio runtime Weibo calls them where
//! blocking is allowed (tokio's blocking pool, or under `block_in_place`),
//! so an implementation over an async client may wait on it with
//! `tokio::runtime::Handle::current().block_on(..)`; such a storage needs
//! a multi-threaded runtime (on a current-thread runtime the calls run on
//! the runtime's thread, where `block_on` panics).

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

pub use super::lease::{LOCK, LeaseError, LockAttempt, StorageHolder, StorageLease};
use super::lease::{LocalLease, MemoryLease, MemorySlot};

/// Storage for checkpoints and savepoints: objects named by `/`-separated
/// paths. See the [module docs](self) for what Weibo relies on.
pub trait CheckpointStorage: Send + Sync + fmt::Debug + 'static {
    /// Where object `name` is, for logs and error messages: a path, or a
    /// URL such as `s3://bucket/prefix/name`.
    fn locate(&self, name: &str) -> PathBuf;

    /// Starts writing object `name`; it is complete once
    /// [`ObjectWriter::finish`] returns. Weibo reads no object before that,
    /// so the object may be visible while written (a local file) or only
    /// at the end (an object store's upload).
    ///
    /// # Errors
    /// When the object cannot be created.
    fn create(&self, name: &str) -> io::Result<Box<dyn ObjectWriter>>;

    /// Writes object `name` whole, atomically: a reader sees all of it or
    /// none of it. Checkpoints are completed this way (their manifest).
    ///
    /// # Errors
    /// When the object cannot be written; then it must not exist, or be as
    /// before.
    fn put(&self, name: &str, bytes: &[u8]) -> io::Result<()>;

    /// Opens object `name` to read it.
    ///
    /// # Errors
    /// [`io::ErrorKind::NotFound`] when there is no such object.
    fn open(&self, name: &str) -> io::Result<Box<dyn ObjectReader>>;

    /// Whether object `name` exists.
    ///
    /// # Errors
    /// When the storage cannot tell.
    fn exists(&self, name: &str) -> io::Result<bool>;

    /// The names of all objects whose names start with `prefix` (a plain
    /// string prefix: `chk-` matches `chk-7/MANIFEST`), in any order.
    ///
    /// # Errors
    /// When the storage cannot be listed. A prefix nothing matches is an
    /// empty list, not an error.
    fn list(&self, prefix: &str) -> io::Result<Vec<String>>;

    /// Deletes object `name`. Deleting one that does not exist is not an
    /// error.
    ///
    /// # Errors
    /// When the object exists and cannot be deleted.
    fn delete(&self, name: &str) -> io::Result<()>;

    /// Copies object `from` to a new object `to` (savepoints copy their
    /// state files). The default reads and writes it through this storage;
    /// object stores have server-side copies.
    ///
    /// # Errors
    /// As [`CheckpointStorage::open`] and [`CheckpointStorage::create`].
    fn copy(&self, from: &str, to: &str) -> io::Result<()> {
        let mut input = self.open(from)?;
        let mut output = self.create(to)?;
        io::copy(&mut input, &mut output)?;
        output.finish()
    }

    /// Takes the storage for one run of a job, `holder` (see
    /// [`lease`](super::lease)): afterwards no other run can take it until
    /// the returned lease is dropped, or, for a storage whose hold
    /// expires, until the run stops renewing it. A run takes its storage
    /// before it reads anything from it, and keeps it until it ends.
    ///
    /// The default refuses: a storage that cannot keep two runs apart
    /// would let both of them commit.
    ///
    /// # Errors
    /// When the storage cannot be locked.
    fn try_lock(&self, holder: &StorageHolder) -> io::Result<LockAttempt> {
        let _ = holder;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this checkpoint storage cannot be locked (its `CheckpointStorage` implementation has no `try_lock`): \
             without a lock, two runs of the job on it could both commit",
        ))
    }
}

/// An object being written; see [`CheckpointStorage::create`].
pub trait ObjectWriter: Write + Send {
    /// Completes the object: flushes it and makes it durable.
    ///
    /// # Errors
    /// When the object cannot be completed; it must then not be read.
    fn finish(self: Box<Self>) -> io::Result<()>;
}

/// An object being read; see [`CheckpointStorage::open`].
pub trait ObjectReader: Read + Seek + Send {}

impl<T: Read + Seek + Send> ObjectReader for T {}

/// Joins `name` to object-name prefix `dir`, resolving `.` and `..` (a
/// manifest names its state files relative to itself, as
/// `../shared/<file>`). `..` past the top stays, so that the error names
/// what was asked for.
pub(crate) fn join(dir: &str, name: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in dir.split('/').chain(name.split('/')) {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// Checkpoints in a local directory: object `a/b` is file `<root>/a/b`.
///
/// State files are written in place and synced, with their directory;
/// `put` writes a temporary file, syncs it and renames it over the name.
/// Deleting a directory's last object removes the directory.
#[derive(Debug, Clone)]
pub struct LocalDir {
    root: PathBuf,
}

impl LocalDir {
    /// Storage in directory `root` (created when first written to).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> PathBuf {
        if name.is_empty() { self.root.clone() } else { self.root.join(name) }
    }

    /// Creates `path`'s directory, then runs `make` on `path`. A `delete`
    /// of the directory's last file may remove the directory in between:
    /// then it is created again.
    fn in_parent<T>(path: &Path, make: impl Fn(&Path) -> io::Result<T>) -> io::Result<T> {
        let mut attempts = 0;
        loop {
            Self::create_parent(path)?;
            match make(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 3 => attempts += 1,
                result => return result,
            }
        }
    }

    fn create_parent(path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => fs::create_dir_all(parent),
            _ => Ok(()),
        }
    }

    /// Syncs `path`'s directory, so that a new or renamed entry survives a
    /// crash of the machine (best effort: not every platform can).
    fn sync_parent(path: &Path) {
        if let Some(parent) = path.parent()
            && let Ok(d) = fs::File::open(if parent.as_os_str().is_empty() { Path::new(".") } else { parent })
        {
            let _ = d.sync_all();
        }
    }

    /// Files under `dir` (a directory), as object names starting with `name`.
    fn walk(dir: &Path, name: &str, out: &mut Vec<String>) -> io::Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            // Removed with its last object meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let file = entry.file_name().to_string_lossy().into_owned();
            let child = if name.is_empty() { file } else { format!("{name}/{file}") };
            if entry.file_type()?.is_dir() {
                Self::walk(&entry.path(), &child, out)?;
            } else {
                out.push(child);
            }
        }
        Ok(())
    }
}

struct LocalWriter {
    out: io::BufWriter<fs::File>,
    path: PathBuf,
}

impl Write for LocalWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.out.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl ObjectWriter for LocalWriter {
    fn finish(self: Box<Self>) -> io::Result<()> {
        let Self { out, path } = *self;
        let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        LocalDir::sync_parent(&path);
        Ok(())
    }
}

impl CheckpointStorage for LocalDir {
    fn locate(&self, name: &str) -> PathBuf {
        self.path(name)
    }

    fn create(&self, name: &str) -> io::Result<Box<dyn ObjectWriter>> {
        let path = self.path(name);
        // Objects are written once: never truncate one.
        let file = Self::in_parent(&path, |path| fs::OpenOptions::new().write(true).create_new(true).open(path))?;
        Ok(Box::new(LocalWriter { out: io::BufWriter::with_capacity(1 << 20, file), path }))
    }

    fn put(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let path = self.path(name);
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut f = Self::in_parent(&tmp, |tmp| fs::File::create(tmp))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        Self::sync_parent(&path);
        Ok(())
    }

    fn open(&self, name: &str) -> io::Result<Box<dyn ObjectReader>> {
        Ok(Box::new(fs::File::open(self.path(name))?))
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        match fs::metadata(self.path(name)) {
            Ok(m) => Ok(m.is_file()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        // The directory the prefix ends in, and the start of the names in it.
        let (dir, start) = match prefix.rsplit_once('/') {
            Some((dir, start)) => (dir, start),
            None => ("", prefix),
        };
        let entries = match fs::read_dir(self.path(dir)) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry?;
            let file = entry.file_name().to_string_lossy().into_owned();
            if !file.starts_with(start) {
                continue;
            }
            let name = if dir.is_empty() { file } else { format!("{dir}/{file}") };
            if entry.file_type()?.is_dir() {
                Self::walk(&entry.path(), &name, &mut out)?;
            } else {
                out.push(name);
            }
        }
        Ok(out)
    }

    fn delete(&self, name: &str) -> io::Result<()> {
        let path = self.path(name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        // A directory of objects goes with its last one (fails, harmlessly,
        // while others remain).
        if name.contains('/')
            && let Some(parent) = path.parent()
        {
            let _ = fs::remove_dir(parent);
        }
        Ok(())
    }

    fn copy(&self, from: &str, to: &str) -> io::Result<()> {
        let (source, target) = (self.path(from), self.path(to));
        Self::in_parent(&target, |target| fs::copy(&source, target))?;
        fs::File::open(&target)?.sync_all()?;
        Self::sync_parent(&target);
        Ok(())
    }

    /// An exclusive lock of the operating system on `<root>/LOCK`, held
    /// while the lease lives (a process that dies releases it).
    fn try_lock(&self, holder: &StorageHolder) -> io::Result<LockAttempt> {
        fs::create_dir_all(&self.root)?;
        LocalLease::try_take(&self.root.join(LOCK), holder)
    }
}

/// Checkpoints in memory, shared by clones: for tests, where a job is
/// stopped and started again in one process, and for jobs that need
/// checkpoints only to cut and commit epochs (their sink keeps the source
/// positions, as the Postgres sink's `store_source_positions` does). Objects are never
/// overwritten: writing a name that exists is an error
/// ([`io::ErrorKind::AlreadyExists`]), so a test on this storage also
/// checks that checkpoints keep to an object store's rules.
#[derive(Debug, Clone, Default)]
pub struct MemoryStorage {
    objects: Arc<Mutex<BTreeMap<String, Arc<[u8]>>>>,
    /// Who holds the storage (not an object: listing does not show it).
    lock: Arc<Mutex<MemorySlot>>,
}

impl MemoryStorage {
    /// An empty storage.
    pub fn new() -> Self {
        Self::default()
    }

    /// The names of the objects stored, in order.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Object `name`'s bytes, if it exists.
    pub fn get(&self, name: &str) -> Option<Arc<[u8]>> {
        self.lock().get(name).cloned()
    }

    /// Replaces object `name`'s bytes (or creates it): for tests that
    /// damage a checkpoint on purpose. Weibo itself never overwrites.
    pub fn set(&self, name: &str, bytes: impl Into<Arc<[u8]>>) {
        self.lock().insert(name.to_string(), bytes.into());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<[u8]>>> {
        self.objects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert_new(&self, name: &str, bytes: Arc<[u8]>) -> io::Result<()> {
        let mut objects = self.lock();
        if objects.contains_key(name) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("object `{name}` exists already")));
        }
        objects.insert(name.to_string(), bytes);
        Ok(())
    }
}

struct MemoryWriter {
    storage: MemoryStorage,
    name: String,
    bytes: Vec<u8>,
}

impl Write for MemoryWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ObjectWriter for MemoryWriter {
    fn finish(self: Box<Self>) -> io::Result<()> {
        let Self { storage, name, bytes } = *self;
        storage.insert_new(&name, bytes.into())
    }
}

impl CheckpointStorage for MemoryStorage {
    fn locate(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("memory:/{name}"))
    }

    fn create(&self, name: &str) -> io::Result<Box<dyn ObjectWriter>> {
        if self.lock().contains_key(name) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("object `{name}` exists already")));
        }
        Ok(Box::new(MemoryWriter { storage: self.clone(), name: name.to_string(), bytes: Vec::new() }))
    }

    fn put(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.insert_new(name, bytes.into())
    }

    fn open(&self, name: &str) -> io::Result<Box<dyn ObjectReader>> {
        let bytes =
            self.get(name).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no object `{name}`")))?;
        Ok(Box::new(io::Cursor::new(bytes)))
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        Ok(self.lock().contains_key(name))
    }

    fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        Ok(self
            .lock()
            .range(prefix.to_string()..)
            .take_while(|(name, _)| name.starts_with(prefix))
            .map(|(name, _)| name.clone())
            .collect())
    }

    fn delete(&self, name: &str) -> io::Result<()> {
        self.lock().remove(name);
        Ok(())
    }

    fn try_lock(&self, holder: &StorageHolder) -> io::Result<LockAttempt> {
        Ok(MemoryLease::try_take(&self.lock, holder))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_join_resolving_dots() {
        assert_eq!(join("chk-7", "../shared/a.state"), "shared/a.state");
        assert_eq!(join("savepoints/x", "a.state"), "savepoints/x/a.state");
        assert_eq!(join("", "MANIFEST"), "MANIFEST");
        assert_eq!(join("", "../a"), "../a");
        assert_eq!(join("a/./b/", "c"), "a/b/c");
    }

    /// Both storages behave alike on what Weibo uses.
    fn exercise(storage: &dyn CheckpointStorage) {
        let mut w = storage.create("shared/a.state").unwrap();
        w.write_all(b"hello ").unwrap();
        w.write_all(b"world").unwrap();
        w.finish().unwrap();
        storage.put("chk-1/MANIFEST", b"{}").unwrap();
        storage.put("chk-12/MANIFEST", b"{}").unwrap();
        storage.copy("shared/a.state", "savepoints/s/a.state").unwrap();
        let mut read = String::new();
        storage.open("savepoints/s/a.state").unwrap().read_to_string(&mut read).unwrap();
        assert_eq!(read, "hello world");
        let mut r = storage.open("shared/a.state").unwrap();
        r.seek(io::SeekFrom::End(-5)).unwrap();
        read.clear();
        r.read_to_string(&mut read).unwrap();
        assert_eq!(read, "world");
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        assert_eq!(sorted(storage.list("chk-").unwrap()), ["chk-1/MANIFEST", "chk-12/MANIFEST"]);
        assert_eq!(sorted(storage.list("chk-1/").unwrap()), ["chk-1/MANIFEST"]);
        assert_eq!(sorted(storage.list("shared/").unwrap()), ["shared/a.state"]);
        assert!(storage.list("nothing/").unwrap().is_empty());
        assert!(storage.exists("chk-1/MANIFEST").unwrap() && !storage.exists("chk-2/MANIFEST").unwrap());
        assert_eq!(storage.open("chk-2/MANIFEST").err().map(|e| e.kind()), Some(io::ErrorKind::NotFound));
        storage.delete("chk-1/MANIFEST").unwrap();
        storage.delete("chk-1/MANIFEST").unwrap();
        assert_eq!(sorted(storage.list("chk-").unwrap()), ["chk-12/MANIFEST"]);
    }

    #[test]
    fn a_local_directory_stores_objects_as_files() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalDir::new(dir.path());
        exercise(&storage);
        assert!(dir.path().join("shared/a.state").is_file());
        assert!(!dir.path().join("chk-1").exists(), "a directory goes with its last object");
        assert!(!dir.path().join("chk-12/MANIFEST.tmp").exists());
    }

    #[test]
    fn memory_storage_refuses_to_overwrite() {
        let storage = MemoryStorage::new();
        exercise(&storage);
        let err = storage.put("chk-12/MANIFEST", b"{}").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(storage.create("shared/a.state").is_err());
    }
}
