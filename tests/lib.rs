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
