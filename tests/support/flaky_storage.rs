//! A checkpoint storage that fails on request, for the tests of outages.

use weibo::checkpoint::MemoryStorage;

/// A storage whose writes fail while `failing` is set, as an object store
/// does during an outage, and whose manifests alone fail while
/// `failing_puts` is; whose manifests take `slow_puts_ms` each.
#[derive(Debug, Clone, Default)]
pub struct Flaky {
    pub inner: MemoryStorage,
    pub failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub failing_puts: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub refused: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub slow_puts_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// While set, every other check of a run's lease cannot tell (the
    /// storage cannot be asked): the second check of each checkpoint, the
    /// one after its manifest.
    pub uncertain_lease: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// A lease whose checks fail as [`Flaky::uncertain_lease`] says.
#[derive(Debug)]
struct FlakyLease {
    inner: Box<dyn weibo::checkpoint::StorageLease>,
    uncertain: std::sync::Arc<std::sync::atomic::AtomicBool>,
    checks: std::sync::atomic::AtomicU64,
}

impl weibo::checkpoint::StorageLease for FlakyLease {
    fn generation(&self) -> u64 {
        self.inner.generation()
    }
    fn check(&self) -> Result<(), weibo::checkpoint::LeaseError> {
        let n = self.checks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.uncertain.load(std::sync::atomic::Ordering::SeqCst) && n % 2 == 1 {
            return Err(weibo::checkpoint::LeaseError::Unavailable(std::io::Error::other("injected: cannot tell")));
        }
        self.inner.check()
    }
}

impl Flaky {
    fn check_put(&self) -> std::io::Result<()> {
        let slow = self.slow_puts_ms.load(std::sync::atomic::Ordering::SeqCst);
        if slow > 0 {
            std::thread::sleep(std::time::Duration::from_millis(slow));
        }
        if self.failing_puts.load(std::sync::atomic::Ordering::SeqCst) {
            self.refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(std::io::Error::other("injected outage of manifests"));
        }
        self.check()
    }

    fn check(&self) -> std::io::Result<()> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            self.refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(std::io::Error::other("injected outage"));
        }
        Ok(())
    }
}

impl weibo::checkpoint::CheckpointStorage for Flaky {
    fn locate(&self, name: &str) -> std::path::PathBuf {
        self.inner.locate(name)
    }
    fn create(&self, name: &str) -> std::io::Result<Box<dyn weibo::checkpoint::ObjectWriter>> {
        self.check()?;
        self.inner.create(name)
    }
    fn put(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        self.check_put()?;
        self.inner.put(name, bytes)
    }
    fn open(&self, name: &str) -> std::io::Result<Box<dyn weibo::checkpoint::ObjectReader>> {
        self.inner.open(name)
    }
    fn exists(&self, name: &str) -> std::io::Result<bool> {
        self.inner.exists(name)
    }
    fn list(&self, prefix: &str) -> std::io::Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn delete(&self, name: &str) -> std::io::Result<()> {
        self.check()?;
        self.inner.delete(name)
    }
    fn try_lock(&self, holder: &weibo::checkpoint::StorageHolder) -> std::io::Result<weibo::checkpoint::LockAttempt> {
        Ok(match self.inner.try_lock(holder)? {
            weibo::checkpoint::LockAttempt::Acquired(inner) => {
                weibo::checkpoint::LockAttempt::Acquired(Box::new(FlakyLease {
                    inner,
                    uncertain: self.uncertain_lease.clone(),
                    checks: std::sync::atomic::AtomicU64::new(0),
                }))
            }
            held => held,
        })
    }
}
