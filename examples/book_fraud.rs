//! The book's "Fraud detection" chapter: Flink's "Fraud Detection with the
//! DataStream API" walkthrough, ported. The same detector (a flag in value
//! state, a processing-time timer that clears it after a minute, an alert
//! for a small transaction followed by a large one) on the walkthrough's
//! transactions, giving the alerts the walkthrough documents; then, in a
//! test harness that drives processing time, the timer at work.
//!
//! Run it with `cargo run -p weibo-examples --example book_fraud`.

// ANCHOR: imports
use std::convert::Infallible;
use std::fmt;

use serde::{Deserialize, Serialize};
use weibo::prelude::*;
use weibo::process::{KeyedProcessFunction, ProcessContext, States, Timer, ValueState};
use weibo::testing::Harness;
// ANCHOR_END: imports

fn main() -> weibo::Result<()> {
    let alerts = walkthrough()?;
    for alert in &alerts {
        println!("{alert}");
    }
    timer()?;
    Ok(())
}

// ANCHOR: types
/// A card transaction, as the walkthrough's source produces them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transaction {
    /// The account (the key).
    pub account_id: u64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// In dollars.
    pub amount: f64,
}

/// An alert for an account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    /// The account.
    pub id: u64,
}

impl fmt::Display for Alert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Alert{{id={}}}", self.id)
    }
}
// ANCHOR_END: types

// ANCHOR: source
/// The walkthrough's transactions (account, amount): fifty, over five
/// accounts, repeated for as long as the source runs.
#[rustfmt::skip]
const DATA: [(u64, f64); 50] = [
    (1, 188.23), (2, 374.79), (3, 112.15), (4, 478.75), (5, 208.85),
    (1, 379.64), (2, 351.44), (3, 320.75), (4, 259.42), (5, 273.44),
    (1, 267.25), (2, 397.15), (3, 0.219), (4, 231.94), (5, 384.73),
    (1, 419.62), (2, 412.91), (3, 0.77), (4, 22.10), (5, 377.54),
    (1, 375.44), (2, 230.18), (3, 0.80), (4, 350.89), (5, 127.55),
    (1, 483.91), (2, 228.22), (3, 871.15), (4, 64.19), (5, 79.43),
    (1, 56.12), (2, 256.48), (3, 148.16), (4, 199.95), (5, 252.37),
    (1, 274.73), (2, 473.54), (3, 119.92), (4, 323.59), (5, 353.16),
    (1, 211.90), (2, 280.93), (3, 347.89), (4, 459.86), (5, 82.31),
    (1, 373.26), (2, 479.83), (3, 454.25), (4, 83.64), (5, 292.44),
];

/// 2019-01-01 00:00:00 UTC, the first transaction's time.
const INITIAL_TIMESTAMP: i64 = 1_546_300_800_000;
const SIX_MINUTES: i64 = 6 * 60 * 1_000;

/// Transaction `i`: the data in a loop, six minutes apart.
pub fn transaction(i: u64) -> Transaction {
    let (account_id, amount) = DATA.get((i % 50) as usize).copied().unwrap_or_default();
    Transaction { account_id, timestamp: INITIAL_TIMESTAMP + i as i64 * SIX_MINUTES, amount }
}
// ANCHOR_END: source

// ANCHOR: detector
const SMALL_AMOUNT: f64 = 1.00;
const LARGE_AMOUNT: f64 = 500.00;
const ONE_MINUTE: i64 = 60 * 1_000;

/// Alerts on a small transaction followed, within a minute, by a large one
/// on the same account.
pub struct FraudDetector {
    /// Whether the account's last transaction was small.
    flag: ValueState<bool>,
    /// When the flag's timer fires (to delete it if the flag goes first).
    timer: ValueState<i64>,
}

impl FraudDetector {
    /// Declares the detector's states, by name, when the job is wired.
    pub fn new(states: &mut States<u64>) -> Self {
        FraudDetector { flag: states.value("flag"), timer: states.value("timer") }
    }

    fn clean_up(&self, ctx: &mut ProcessContext<'_, u64, Alert>) {
        // Delete the timer, then clear both states.
        if let Some(timer) = ctx.value(&self.timer).get() {
            ctx.delete_processing_timer(timer);
        }
        ctx.value(&self.timer).clear();
        ctx.value(&self.flag).clear();
    }
}

impl KeyedProcessFunction<u64, Transaction> for FraudDetector {
    type Out = Alert;
    type Error = Infallible;

    fn process_element(&self, ctx: &mut ProcessContext<'_, u64, Alert>, t: &Transaction) -> Result<(), Infallible> {
        // The flag of the current key (the account).
        if ctx.value(&self.flag).get().is_some() {
            if t.amount > LARGE_AMOUNT {
                ctx.emit(Alert { id: t.account_id });
            }
            self.clean_up(ctx);
        }
        if t.amount < SMALL_AMOUNT {
            ctx.value(&self.flag).set(true);
            // The flag lasts a minute: a timer clears it.
            let timer = ctx.processing_time() + ONE_MINUTE;
            ctx.register_processing_timer(timer);
            ctx.value(&self.timer).set(timer);
        }
        Ok(())
    }

    fn on_timer(&self, ctx: &mut ProcessContext<'_, u64, Alert>, _timer: Timer) -> Result<(), Infallible> {
        // A minute has passed since the small transaction.
        ctx.value(&self.timer).clear();
        ctx.value(&self.flag).clear();
        Ok(())
    }
}
// ANCHOR_END: detector

// ANCHOR: job
/// The walkthrough's job, over three rounds of its transactions.
fn walkthrough() -> weibo::Result<Vec<Alert>> {
    let alerts = CollectSink::new();
    let job = Job::new("fraud-detection");
    job.source(Generator::new(3 * 50, transaction).with_rate(500.0))
        .name("transactions")
        .key_by(|t: &Transaction| t.account_id)
        .process_function(on_error::Fail, FraudDetector::new)
        .name("fraud-detector")
        .sink(alerts.clone())
        .name("send-alerts");
    job.run_blocking()?;
    let alerts = alerts.values();
    // Account 3's 0.80 is followed by 871.15 once per round: one alert each.
    assert_eq!(alerts, [Alert { id: 3 }, Alert { id: 3 }, Alert { id: 3 }]);
    Ok(alerts)
}
// ANCHOR_END: job

// ANCHOR: timer
/// The same detector in a test harness that drives processing time:
/// 100 ms per transaction (the walkthrough's pace), except that in the
/// second round two minutes pass between account 3's small and large
/// transactions, so the timer clears the flag first and no alert comes.
fn timer() -> weibo::Result<()> {
    let mut h = Harness::<Transaction>::new("fraud-timer");
    let alerts = h.input().key_by(|t: &Transaction| t.account_id).process_function(on_error::Fail, FraudDetector::new);
    let probe = h.output(&alerts);
    let mut run = h.start()?;
    let mut now = 0;
    let mut per_round = Vec::new();
    for round in 0..3u64 {
        for i in round * 50..(round + 1) * 50 {
            let t = transaction(i);
            let (account, amount, at) = (t.account_id, t.amount, t.timestamp);
            run.push(t, at)?;
            run.watermark(at)?;
            now += if round == 1 && account == 3 && amount == 0.80 { 2 * ONE_MINUTE } else { 100 };
            run.set_processing_time(now)?;
        }
        per_round.push(probe.take());
    }
    run.finish()?;
    assert_eq!(per_round, [vec![Alert { id: 3 }], vec![], vec![Alert { id: 3 }]]);
    Ok(())
}
// ANCHOR_END: timer
