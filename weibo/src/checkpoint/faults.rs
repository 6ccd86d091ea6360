//! Fault injection for crash tests: named points on the commit path where
//! a test can make the process die (or stall) on purpose.
//!
//! Two environment variables, read once per process:
//!
//! - `WEIBO_CRASH_AT=<point>[#<k>]`: abort the process (as a SIGKILL
//!   would: no unwinding, nothing flushed) the `k`-th time (default: the
//!   first) the process reaches `<point>`;
//! - `WEIBO_SLOW_AT=<point>[#<k>]=<ms>`: sleep `<ms>` milliseconds there
//!   instead, on the calling thread (to make a checkpoint time out, or two
//!   epochs wait at once).
//!
//! The points, in the order a checkpoint reaches them:
//!
//! | point | where |
//! | --- | --- |
//! | `pre-commit-before` | an exactly-once sink instance got a barrier, before it pre-commits |
//! | `pre-commit-after` | right after that pre-commit |
//! | `final-barrier` | the coordinator triggered the final checkpoint (every source at its end) |
//! | `after-manifest` | a checkpoint's manifest is published, before any sink commits |
//! | `after-final-manifest` | the same, for the final checkpoint |
//! | `between-commits` | between two commits of one checkpoint (sink instances, or epochs carried from an abandoned checkpoint) |
//! | `between-final-commits` | the same, for the final checkpoint: the commits at the end of the input |
//! | `after-commits` | every commit of a checkpoint is done |
//!
//! Counts are per process, over all jobs and sink instances in it.
//! Nothing happens unless a variable names the point, and a point costs a
//! lock only on the commit path, never per record.
//!
//! Only with the cargo feature `fault-injection` (the project's tests turn
//! it on): without it, [`point`] does nothing and the variables are never
//! read, so no environment variable can crash a production job.
#![cfg_attr(not(feature = "fault-injection"), allow(dead_code, unused_imports))]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// What a test asked for at one point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Crash,
    Sleep(Duration),
}

#[derive(Debug)]
struct Plan {
    point: String,
    nth: u64,
    action: Action,
}

/// Parses `<point>[#<k>]` (crash) or `<point>[#<k>]=<ms>` (sleep).
fn parse(spec: &str, sleep: bool) -> Option<Plan> {
    let (target, ms) = match spec.split_once('=') {
        Some((t, ms)) if sleep => (t, Some(ms.trim().parse::<u64>().ok()?)),
        Some(_) => return None,
        None if sleep => return None,
        None => (spec, None),
    };
    let (point, nth) = match target.split_once('#') {
        Some((p, k)) => (p, k.trim().parse::<u64>().ok()?.max(1)),
        None => (target, 1),
    };
    let action = ms.map_or(Action::Crash, |ms| Action::Sleep(Duration::from_millis(ms)));
    Some(Plan { point: point.trim().to_string(), nth, action })
}

fn plans() -> &'static [Plan] {
    static PLANS: OnceLock<Vec<Plan>> = OnceLock::new();
    PLANS.get_or_init(|| {
        let mut out = Vec::new();
        for (var, sleep) in [("WEIBO_CRASH_AT", false), ("WEIBO_SLOW_AT", true)] {
            if let Ok(spec) = std::env::var(var) {
                match parse(&spec, sleep) {
                    Some(plan) => out.push(plan),
                    None => tracing::warn!(variable = var, value = %spec, "cannot read this fault-injection setting; ignored"),
                }
            }
        }
        out
    })
}

/// Marks fault-injection point `point` (see the module's table): aborts
/// or sleeps there when a test asked for it, and does nothing otherwise.
#[doc(hidden)]
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn point(point: &str) {
    let _ = point;
}

/// Marks fault-injection point `point` (see the module's table): aborts
/// or sleeps there when a test asked for it, and does nothing otherwise.
#[doc(hidden)]
#[cfg(feature = "fault-injection")]
pub fn point(point: &str) {
    let plans = plans();
    if plans.is_empty() {
        return;
    }
    static SEEN: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    let count = {
        let mut seen = SEEN.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
        let c = seen.entry(point.to_string()).or_insert(0);
        *c += 1;
        *c
    };
    for plan in plans.iter().filter(|p| p.point == point && p.nth == count) {
        match plan.action {
            Action::Crash => {
                tracing::warn!(point, count, "WEIBO_CRASH_AT: aborting the process here");
                std::process::abort();
            }
            Action::Sleep(d) => {
                tracing::warn!(point, count, ?d, "WEIBO_SLOW_AT: sleeping here");
                std::thread::sleep(d);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_garbage_is_refused() {
        let p = parse("between-commits#3", false).unwrap();
        assert_eq!((p.point.as_str(), p.nth, p.action), ("between-commits", 3, Action::Crash));
        let p = parse("after-manifest", false).unwrap();
        assert_eq!((p.nth, p.action), (1, Action::Crash));
        let p = parse("pre-commit-before#2=700", true).unwrap();
        assert_eq!(
            (p.point.as_str(), p.nth, p.action),
            ("pre-commit-before", 2, Action::Sleep(Duration::from_millis(700)))
        );
        assert!(parse("x#y", false).is_none());
        assert!(parse("x=5", false).is_none(), "a crash takes no duration");
        assert!(parse("x", true).is_none(), "a sleep needs one");
    }
}

/// Without the feature, the variables are never read: a process that has
/// them set goes through every point. (Run with `cargo test -p weibo --lib`,
/// which builds `weibo` without it; the workspace's tests turn it on.)
#[cfg(all(test, not(feature = "fault-injection")))]
#[allow(clippy::unwrap_used)]
mod off {
    /// In the child: reaches a point its environment names.
    #[test]
    fn child_reaches_a_named_point() {
        if std::env::var("WEIBO_FAULTS_CHILD").is_err() {
            return;
        }
        super::point("after-manifest");
        super::point("after-manifest");
    }

    #[test]
    fn the_variables_do_nothing_without_the_feature() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "checkpoint::faults::off::child_reaches_a_named_point", "--test-threads=1"])
            .env("WEIBO_FAULTS_CHILD", "1")
            .env("WEIBO_CRASH_AT", "after-manifest")
            .env("WEIBO_SLOW_AT", "after-manifest#2=60000")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "a point named in WEIBO_CRASH_AT aborted a build without fault injection: {status}");
    }
}
