//! Helpers shared by the integration tests.

use serde::{Deserialize, Serialize};
use weibo::Key;

/// A small key type used across tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Key, Serialize, Deserialize)]
pub struct Account(pub u16);

/// A test event: an account and an amount.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Event {
    /// Whose event.
    pub account: Account,
    /// How much.
    pub amount: i64,
    /// Its index in the input.
    pub seq: u32,
}

/// Runs `job` for `after`, takes savepoint `v1` of it and stops it: the
/// first version of an upgrade, stopped in the middle of its input.
///
/// # Panics
/// When the job does not start or the savepoint fails (a test's failure).
#[allow(clippy::unwrap_used)]
pub fn savepoint_midway(job: weibo::Job, after: std::time::Duration) -> std::path::PathBuf {
    weibo::testing::block_on(async {
        let handle = job.spawn().unwrap();
        tokio::time::sleep(after).await;
        let savepoint = handle.savepoint("v1").await.unwrap();
        handle.abort();
        savepoint
    })
}
