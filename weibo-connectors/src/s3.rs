//! Checkpoints in S3 (or any service that speaks its API), on the
//! `object_store` crate.
//!
//! [`S3Storage`] is a [`CheckpointStorage`]: state files stream up as
//! multipart uploads (8 MiB parts, four in flight), reads fetch 8 MiB
//! ranges as they go, listing and deleting are S3's own, and savepoints
//! copy state files server-side. A manifest, the object that completes a
//! checkpoint, is written with a conditional put that succeeds only if no
//! object of that name exists (`If-None-Match: *`): of two processes that
//! both believe they own a job (one of them stalled past its session
//! timeout and does not know yet that another took over), only one can
//! publish checkpoint `n`, and the other's checkpoint `n` fails. (Which
//! one wins each number is a race: the fence keeps two processes from
//! overwriting each other's checkpoints, and the stale one is fenced on
//! Kafka too, and stops its tasks as soon as it hears that it lost them.)
//!
//! A run owns the storage through a **lease**: the object `LOCK` under the
//! prefix, holding the holder's description, a generation (the fencing
//! token, one more than the previous holder's) and when the lease expires.
//! It is taken and renewed with conditional puts only (`If-None-Match: *`
//! when there is none, `If-Match: <etag>` of the version read otherwise),
//! so of two runs that race for it exactly one wins, and a renewal by a
//! run whose lease was taken over fails. The holder renews it every third
//! of its time to live ([`S3StorageBuilder::with_lease_ttl`], 30 s by default)
//! and once more before every manifest and every commit
//! ([`StorageLease::check`]): a run that cannot is fenced and stops. A
//! lease whose expiry has passed (by the clock of the run that looks) is
//! taken over; a run that ends releases its lease, so that the next one
//! starts at once. After a crash, the next run waits for the lease to
//! expire (`Job::with_storage_wait` with at least the time to live). The
//! fence holds as long as a run does not stall, between its last renewal
//! and the write it guards, for longer than the lease's time to live.

use std::fmt;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use weibo::checkpoint::{
    CheckpointStorage, LeaseError, LockAttempt, ObjectReader, ObjectWriter, StorageHolder, StorageLease,
};
use weibo::{Error, Result};

use crate::runtime::{Pending, SinkRuntime};

/// The size of an upload's parts and of a read's ranges.
const PART: usize = 8 << 20;
/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// Checkpoints in an S3 bucket, under a prefix; see the [module
/// notes](self).
///
/// ```no_run
/// # fn main() -> weibo::Result<()> {
/// use std::time::Duration;
/// use weibo_connectors::s3::S3Storage;
///
/// let storage = S3Storage::builder("my-bucket", "jobs/orders")
///     .with_region("eu-west-1")
///     .from_env() // AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, …
///     .build()?;
/// let job = weibo::Job::new("orders").with_checkpoint_storage(storage, Duration::from_secs(10));
/// # let _ = job;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct S3Storage {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    bucket: String,
    /// Without a trailing `/` (empty: the bucket's root).
    prefix: String,
    rt: Arc<SinkRuntime>,
    /// How long a run's lease lasts without a renewal.
    lease_ttl: Duration,
}

impl fmt::Debug for S3Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Storage").field("bucket", &self.inner.bucket).field("prefix", &self.inner.prefix).finish()
    }
}

/// Configures an [`S3Storage`].
pub struct S3StorageBuilder {
    bucket: String,
    prefix: String,
    env: bool,
    endpoint: Option<String>,
    region: Option<String>,
    credentials: Option<(String, String)>,
    allow_http: bool,
    path_style: bool,
    lease_ttl: Duration,
}

impl fmt::Debug for S3StorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the credentials.
        f.debug_struct("S3StorageBuilder")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl S3Storage {
    /// Checkpoints in `bucket` under `prefix` (`""` for the bucket's root).
    pub fn builder(bucket: impl Into<String>, prefix: impl Into<String>) -> S3StorageBuilder {
        S3StorageBuilder {
            bucket: bucket.into(),
            prefix: prefix.into().trim_matches('/').to_string(),
            env: false,
            endpoint: None,
            region: None,
            credentials: None,
            allow_http: false,
            path_style: false,
            lease_ttl: DEFAULT_LEASE_TTL,
        }
    }

    /// The same bucket under another prefix (below this one): a storage
    /// per job, or per task of a group, sharing one client. Characters
    /// S3 keys should not hold (`~`, `%`, `#`, `?`, spaces, …) are replaced
    /// with `_`.
    pub fn under(&self, prefix: &str) -> S3Storage {
        let prefix: String =
            prefix.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.!'()/".contains(c) { c } else { '_' }).collect();
        let prefix = prefix.split('/').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("/");
        let sub = prefix.trim_matches('/');
        let prefix = match (self.inner.prefix.is_empty(), sub.is_empty()) {
            (true, _) => sub.to_string(),
            (false, true) => self.inner.prefix.clone(),
            (false, false) => format!("{}/{sub}", self.inner.prefix),
        };
        S3Storage {
            inner: Arc::new(Inner {
                store: Arc::clone(&self.inner.store),
                bucket: self.inner.bucket.clone(),
                prefix,
                rt: Arc::clone(&self.inner.rt),
                lease_ttl: self.inner.lease_ttl,
            }),
        }
    }

    fn path(&self, name: &str) -> ObjectPath {
        ObjectPath::from(self.key(name))
    }

    fn key(&self, name: &str) -> String {
        if self.inner.prefix.is_empty() { name.to_string() } else { format!("{}/{name}", self.inner.prefix) }
    }

    /// Runs `f` on the storage's runtime, as an I/O result.
    fn run<R: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = object_store::Result<R>> + Send + 'static,
    ) -> io::Result<R> {
        self.inner.rt.run(f).map_err(io::Error::other)?.map_err(to_io)
    }
}

impl S3StorageBuilder {
    /// The service's URL, for S3-compatible stores (MinIO, Ceph, a local
    /// server); `http://` needs [`S3StorageBuilder::allow_http`].
    #[must_use]
    pub fn with_endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// The bucket's region (default `us-east-1`).
    #[must_use]
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Credentials.
    #[must_use]
    pub fn with_credentials(mut self, access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        self.credentials = Some((access_key_id.into(), secret_access_key.into()));
        self
    }

    /// Starts from the usual `AWS_*` variables (credentials, region,
    /// endpoint, …); what the builder sets, before or after this call, wins.
    #[must_use]
    pub fn from_env(mut self) -> Self {
        self.env = true;
        self
    }

    /// Allows plain `http://` endpoints (a local server).
    #[must_use]
    pub fn allow_http(mut self) -> Self {
        self.allow_http = true;
        self
    }

    /// Path-style URLs (`<endpoint>/<bucket>/<key>`), which local and most
    /// S3-compatible servers want.
    #[must_use]
    pub fn path_style(mut self) -> Self {
        self.path_style = true;
        self
    }

    /// How long a run's lease on the storage lasts without a renewal
    /// (default 30 s, at least 1 s; see the [module notes](self)): how
    /// long the next run waits for a run that crashed, and the longest a
    /// run may stall without being fenced.
    #[must_use]
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`Error::Connector`] when the configuration is incomplete or wrong.
    pub fn build(self) -> Result<S3Storage> {
        let name = format!("s3 {}", self.bucket);
        // Names are kept as given: a prefix object_store would escape (or
        // with empty segments) would not list back as written.
        if ObjectPath::from(self.prefix.as_str()).as_ref() != self.prefix {
            return Err(Error::connector(
                &name,
                format!("prefix `{}`: use letters, digits and `-_.!'()/` only, without empty segments", self.prefix),
            ));
        }
        let mut b = if self.env {
            object_store::aws::AmazonS3Builder::from_env()
        } else {
            object_store::aws::AmazonS3Builder::new()
        };
        b = b.with_bucket_name(&self.bucket);
        if let Some(e) = self.endpoint {
            b = b.with_endpoint(e);
        }
        if let Some(r) = self.region {
            b = b.with_region(r);
        }
        if let Some((k, s)) = self.credentials {
            b = b.with_access_key_id(k).with_secret_access_key(s);
        }
        if self.allow_http {
            b = b.with_allow_http(true);
        }
        if self.path_style {
            b = b.with_virtual_hosted_style_request(false);
        }
        let store = b
            .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch)
            .build()
            .map_err(|e| Error::connector_caused(&name, "cannot configure the S3 client".to_string(), e))?;
        let rt = Arc::new(SinkRuntime::new(&name, "weibo-s3")?);
        Ok(S3Storage {
            inner: Arc::new(Inner {
                store: Arc::new(store),
                bucket: self.bucket,
                prefix: self.prefix,
                rt,
                lease_ttl: self.lease_ttl,
            }),
        })
    }
}

/// An `object_store` error as an I/O error of the right kind.
fn to_io(e: object_store::Error) -> io::Error {
    let kind = match &e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
            io::ErrorKind::AlreadyExists
        }
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            io::ErrorKind::PermissionDenied
        }
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

impl CheckpointStorage for S3Storage {
    fn locate(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("s3://{}/{}", self.inner.bucket, self.key(name)))
    }

    fn create(&self, name: &str) -> io::Result<Box<dyn ObjectWriter>> {
        Ok(Box::new(S3Writer {
            storage: self.clone(),
            path: self.path(name),
            buf: Vec::new(),
            upload: None,
            parts: Vec::new(),
        }))
    }

    fn put(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let (store, path) = (Arc::clone(&self.inner.store), self.path(name));
        // A manifest completes a checkpoint: it is created, never replaced
        // (the fence against a process that lost its job).
        let mode = if name == "MANIFEST" || name.ends_with("/MANIFEST") { PutMode::Create } else { PutMode::Overwrite };
        let payload = PutPayload::from(bytes.to_vec());
        match self.run(async move { store.put_opts(&path, payload, PutOptions::from(mode)).await.map(|_| ()) }) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // The client retries a request whose answer it lost: the
                // object there may be this very one.
                let (store, path) = (Arc::clone(&self.inner.store), self.path(name));
                let there = self.run(async move { store.get(&path).await?.bytes().await })?;
                if there.as_ref() == bytes { Ok(()) } else { Err(e) }
            }
            other => other,
        }
    }

    fn open(&self, name: &str) -> io::Result<Box<dyn ObjectReader>> {
        let (store, path) = (Arc::clone(&self.inner.store), self.path(name));
        let size = self.run(async move { store.head(&path).await.map(|m| m.size) })?;
        Ok(Box::new(S3Reader {
            storage: self.clone(),
            path: self.path(name),
            size,
            pos: 0,
            buf: Vec::new(),
            buf_at: 0,
        }))
    }

    fn exists(&self, name: &str) -> io::Result<bool> {
        let (store, path) = (Arc::clone(&self.inner.store), self.path(name));
        match self.run(async move { store.head(&path).await }) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        // S3 lists by key prefix; object_store by whole path segments: list
        // what is under the prefix's directory and keep what matches.
        let dir = prefix.rsplit_once('/').map_or("", |(d, _)| d);
        let dir_key = self.key(dir);
        let store = Arc::clone(&self.inner.store);
        let under = if dir_key.is_empty() { None } else { Some(ObjectPath::from(dir_key)) };
        let keys = self.run(async move {
            let mut out = Vec::new();
            let mut listing = store.list(under.as_ref());
            while let Some(meta) = listing.next().await {
                out.push(meta?.location.to_string());
            }
            Ok(out)
        })?;
        let root = if self.inner.prefix.is_empty() { String::new() } else { format!("{}/", self.inner.prefix) };
        Ok(keys
            .into_iter()
            .filter_map(|k| k.strip_prefix(&root).map(str::to_string))
            .filter(|n| n.starts_with(prefix))
            .collect())
    }

    fn delete(&self, name: &str) -> io::Result<()> {
        let (store, path) = (Arc::clone(&self.inner.store), self.path(name));
        match self.run(async move { store.delete(&path).await }) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn copy(&self, from: &str, to: &str) -> io::Result<()> {
        let (store, from, to) = (Arc::clone(&self.inner.store), self.path(from), self.path(to));
        self.run(async move { store.copy(&from, &to).await })
    }

    /// The lease object `LOCK` (see the [module notes](self)).
    fn try_lock(&self, holder: &StorageHolder) -> io::Result<LockAttempt> {
        S3Lease::try_take(self, holder)
    }
}

/// How long a lease lasts without a renewal, unless the builder says.
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// What the lease object holds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct LeaseBody {
    holder: StorageHolder,
    /// When it expires, in milliseconds since the Unix epoch (0: released).
    expires_unix_ms: u64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A run's lease on an [`S3Storage`]: renewed on the storage's runtime
/// every third of its time to live, and by every check.
struct S3Lease {
    shared: Arc<LeaseShared>,
    renewer: std::sync::Mutex<Pending<()>>,
}

impl fmt::Debug for S3Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Lease").field("at", &self.shared.storage.locate(weibo::checkpoint::lease::LOCK)).finish()
    }
}

struct LeaseShared {
    storage: S3Storage,
    holder: StorageHolder,
    state: std::sync::Mutex<LeaseState>,
}

struct LeaseState {
    /// The version of the lease object this run wrote last.
    version: object_store::UpdateVersion,
    /// When the lease, as last renewed, expires (by this run's clock).
    expires_unix_ms: u64,
    /// Why the lease is lost, once it is.
    lost: Option<String>,
}

impl S3Lease {
    fn try_take(storage: &S3Storage, holder: &StorageHolder) -> io::Result<LockAttempt> {
        let (mode, generation) = match storage.read_lease()? {
            None => (PutMode::Create, 1),
            Some((body, version)) => match body {
                Some(b) if b.expires_unix_ms > now_ms() && b.holder.run != holder.run => {
                    return Ok(LockAttempt::HeldBy(Some(b.holder)));
                }
                // Expired or released (or not a lease Weibo wrote): taken
                // over, unless another run takes it first.
                Some(b) => (PutMode::Update(version), b.holder.generation.saturating_add(1)),
                None => (PutMode::Update(version), 1),
            },
        };
        let mut mine = holder.clone();
        mine.generation = generation;
        let body = LeaseBody { holder: mine, expires_unix_ms: now_ms().saturating_add(storage.ttl_ms()) };
        let Ok(version) = storage.put_lease(&body, mode)? else {
            // Another run took it first.
            let holder = storage.read_lease()?.and_then(|(b, _)| b).map(|b| b.holder);
            return Ok(LockAttempt::HeldBy(holder));
        };
        let shared = Arc::new(LeaseShared {
            storage: storage.clone(),
            holder: body.holder,
            state: std::sync::Mutex::new(LeaseState { version, expires_unix_ms: body.expires_unix_ms, lost: None }),
        });
        let renewing = Arc::clone(&shared);
        let every = storage.inner.lease_ttl / 3;
        let renewer = storage.inner.rt.start(async move {
            loop {
                tokio::time::sleep(every).await;
                let lease = Arc::clone(&renewing);
                // A renewal waits for the storage's runtime: off its worker.
                let renewed = tokio::task::spawn_blocking(move || lease.renew()).await;
                if matches!(renewed, Ok(Err(LeaseError::Lost(_)))) {
                    return;
                }
            }
        });
        Ok(LockAttempt::Acquired(Box::new(S3Lease { shared, renewer: std::sync::Mutex::new(renewer) })))
    }
}

impl LeaseShared {
    /// Writes the lease again, expiring one time to live from now, if the
    /// object is still the version this run wrote last.
    fn renew(&self) -> Result<(), LeaseError> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(why) = &state.lost {
            return Err(LeaseError::Lost(why.clone()));
        }
        let body =
            LeaseBody { holder: self.holder.clone(), expires_unix_ms: now_ms().saturating_add(self.storage.ttl_ms()) };
        let at = self.storage.locate(weibo::checkpoint::lease::LOCK);
        let why = match self.storage.put_lease(&body, PutMode::Update(state.version.clone())) {
            Ok(Ok(version)) => {
                state.version = version;
                state.expires_unix_ms = body.expires_unix_ms;
                return Ok(());
            }
            Ok(Err(())) => format!(
                "the lease {} of this run (generation {}) was taken over by another run",
                at.display(),
                self.holder.generation
            ),
            // Not renewed: still held until it expires.
            Err(e) if now_ms() < state.expires_unix_ms => return Err(LeaseError::Unavailable(e)),
            Err(e) => format!("the lease {} of this run expired: it could not be renewed ({e})", at.display()),
        };
        state.lost = Some(why.clone());
        Err(LeaseError::Lost(why))
    }
}

impl StorageLease for S3Lease {
    fn generation(&self) -> u64 {
        self.shared.holder.generation
    }

    fn check(&self) -> Result<(), LeaseError> {
        weibo::blocking(|| self.shared.renew())
    }
}

impl Drop for S3Lease {
    fn drop(&mut self) {
        self.renewer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).abort();
        // Released, so that the next run starts at once (if the lease is
        // still this run's: a conditional put).
        let state = self.shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.lost.is_none() {
            let released = LeaseBody { holder: self.shared.holder.clone(), expires_unix_ms: 0 };
            let storage = &self.shared.storage;
            let _ = weibo::blocking(|| storage.put_lease(&released, PutMode::Update(state.version.clone())));
        }
    }
}

impl S3Storage {
    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.inner.lease_ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// The lease object, if there is one: what it holds (`None` if it is
    /// not a lease), and its version.
    fn read_lease(&self) -> io::Result<Option<(Option<LeaseBody>, object_store::UpdateVersion)>> {
        let (store, path) = (Arc::clone(&self.inner.store), self.path(weibo::checkpoint::lease::LOCK));
        let got = self.run(async move {
            let got = store.get(&path).await?;
            let version =
                object_store::UpdateVersion { e_tag: got.meta.e_tag.clone(), version: got.meta.version.clone() };
            Ok((got.bytes().await?, version))
        });
        match got {
            Ok((bytes, version)) => Ok(Some((serde_json::from_slice(&bytes).ok(), version))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the lease object with `mode`: its new version, or `Err(())`
    /// when the condition did not hold (another run wrote it meanwhile).
    fn put_lease(
        &self,
        body: &LeaseBody,
        mode: PutMode,
    ) -> io::Result<std::result::Result<object_store::UpdateVersion, ()>> {
        let bytes = serde_json::to_vec(body).map_err(io::Error::other)?;
        let (store, path) = (Arc::clone(&self.inner.store), self.path(weibo::checkpoint::lease::LOCK));
        let put = self.run(async move {
            let put = store.put_opts(&path, PutPayload::from(bytes), PutOptions::from(mode)).await?;
            Ok(object_store::UpdateVersion { e_tag: put.e_tag, version: put.version })
        });
        match put {
            Ok(version) => Ok(Ok(version)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(Err(())),
            Err(e) => Err(e),
        }
    }
}

/// A state file going up: small ones in one put, larger ones as a
/// multipart upload of 8 MiB parts.
struct S3Writer {
    storage: S3Storage,
    path: ObjectPath,
    buf: Vec<u8>,
    upload: Option<Box<dyn MultipartUpload>>,
    parts: Vec<Pending<object_store::Result<()>>>,
}

impl S3Writer {
    /// Sends the buffer as the next part (starting the upload first).
    fn send_part(&mut self) -> io::Result<()> {
        if self.upload.is_none() {
            let (store, path) = (Arc::clone(&self.storage.inner.store), self.path.clone());
            self.upload = Some(self.storage.run(async move { store.put_multipart(&path).await })?);
        }
        while self.parts.len() >= PARTS_IN_FLIGHT {
            let oldest = self.parts.remove(0);
            oldest.wait().map_err(io::Error::other)?.map_err(to_io)?;
        }
        let payload = PutPayload::from(std::mem::take(&mut self.buf));
        if let Some(upload) = self.upload.as_mut() {
            let part = upload.put_part(payload);
            self.parts.push(self.storage.inner.rt.start(part));
        }
        Ok(())
    }
}

impl Write for S3Writer {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= PART {
            self.send_part()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ObjectWriter for S3Writer {
    fn finish(mut self: Box<Self>) -> io::Result<()> {
        if self.upload.is_none() {
            let (store, path) = (Arc::clone(&self.storage.inner.store), self.path.clone());
            let payload = PutPayload::from(std::mem::take(&mut self.buf));
            return self.storage.run(async move { store.put(&path, payload).await.map(|_| ()) });
        }
        if !self.buf.is_empty() {
            self.send_part()?;
        }
        for p in std::mem::take(&mut self.parts) {
            p.wait().map_err(io::Error::other)?.map_err(to_io)?;
        }
        let Some(mut upload) = self.upload.take() else { return Ok(()) };
        self.storage.run(async move { upload.complete().await.map(|_| ()) })
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        // An upload never finished (the checkpoint failed): abort it, so
        // that the bucket does not keep its parts.
        if let Some(mut upload) = self.upload.take() {
            let _ = self.storage.inner.rt.start(async move { upload.abort().await });
        }
    }
}

/// A state file coming down, 8 MiB at a time.
struct S3Reader {
    storage: S3Storage,
    path: ObjectPath,
    size: u64,
    pos: u64,
    buf: Vec<u8>,
    /// Where `buf` starts in the object.
    buf_at: u64,
}

impl Read for S3Reader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.size || out.is_empty() {
            return Ok(0);
        }
        let in_buf = self.pos >= self.buf_at && self.pos < self.buf_at + self.buf.len() as u64;
        if !in_buf {
            let end = (self.pos + PART as u64).min(self.size);
            let (store, path, start) = (Arc::clone(&self.storage.inner.store), self.path.clone(), self.pos);
            let bytes = self.storage.run(async move { store.get_range(&path, start..end).await })?;
            self.buf = bytes.to_vec();
            self.buf_at = self.pos;
        }
        let from = usize::try_from(self.pos - self.buf_at).map_err(io::Error::other)?;
        let available = self.buf.get(from..).unwrap_or_default();
        let n = available.len().min(out.len());
        if let (Some(dst), Some(src)) = (out.get_mut(..n), available.get(..n)) {
            dst.copy_from_slice(src);
        }
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for S3Reader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => i128::from(n),
            SeekFrom::End(d) => i128::from(self.size) + i128::from(d),
            SeekFrom::Current(d) => i128::from(self.pos) + i128::from(d),
        };
        self.pos = u64::try_from(target)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start of the object"))?;
        Ok(self.pos)
    }
}
