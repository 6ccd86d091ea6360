//! Shared types of the examples and the book's code, compiled and tested.

use serde::{Deserialize, Serialize};
use weibo::Key;

/// A customer's id: the key of the quickstart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Key, Serialize, Deserialize)]
pub struct CustomerId(pub u32);

/// An order, as the quickstart's generator makes them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Order {
    /// Who ordered.
    pub customer: CustomerId,
    /// How much, in cents (refunds are negative).
    pub amount_cents: i64,
}

/// Running totals per customer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Whose totals.
    pub customer: CustomerId,
    /// Orders counted.
    pub orders: u64,
    /// Sum of their amounts, in cents.
    pub cents: i64,
}

/// Order `i` of the quickstart's deterministic generator.
pub fn order(i: u64) -> Order {
    // A fixed pseudo-random spread over 5 customers and amounts, with every
    // 7th order a refund (negative), so the filter has work to do.
    let mixed = i.wrapping_mul(2_654_435_761);
    let amount = (mixed % 10_000) as i64;
    Order { customer: CustomerId((mixed % 5) as u32 + 1), amount_cents: if i % 7 == 6 { -amount } else { amount } }
}
