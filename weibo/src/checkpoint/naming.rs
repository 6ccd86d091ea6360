//! How checkpoints name what they write, in one place: checkpoint
//! directories (`chk-<n>`), state files (`shared/<operator>-<instance>-
//! <state>-<n>-<run>.state`) and the run token in them. Both the writing
//! (a task's state at a barrier) and the parsing (retention, the highest
//! checkpoint in a storage) go through here.

use super::SHARED;
use crate::record::CheckpointId;

/// Operator `name` as the start of its state files' names: ASCII letters,
/// digits and `-` as they are, anything else `_`, and then, if anything
/// was replaced, a hash of the name, so that `a.b` and `a_b` do not share
/// files.
pub(crate) fn file_stem(name: &str) -> String {
    let safe: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    if safe == name {
        return safe;
    }
    // FNV-1a: stable across builds and platforms.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{safe}_{:08x}", hash as u32)
}

/// The name of checkpoint `n`'s directory.
pub(crate) fn checkpoint_name(n: CheckpointId) -> String {
    format!("chk-{:020}", n.get())
}

/// The number of a checkpoint's directory (`chk-<n>`), if `name` is one.
pub(crate) fn checkpoint_number(name: &str) -> Option<CheckpointId> {
    name.strip_prefix("chk-")?.parse().ok().map(CheckpointId::new)
}

/// The checkpoint that wrote state file `name`:
/// `<operator>-<instance>-<state>-<n>-<run>.state`, or without the run's
/// token as builds before it named them.
pub(crate) fn written_by(name: &str) -> Option<CheckpointId> {
    let mut parts = name.strip_suffix(".state")?.rsplit('-');
    let last = parts.next()?;
    if last.len() == 20 && last.bytes().all(|b| b.is_ascii_digit()) {
        return last.parse().ok().map(CheckpointId::new);
    }
    parts.next()?.parse().ok().map(CheckpointId::new)
}

/// A fresh token naming one run of a writer: 32 hex digits, 128 bits from
/// two of the standard library's randomly keyed hashers over the clock and
/// the process id. What keeps one run's output apart from another's: in
/// the names of a job's state files (a job restarted in the same storage,
/// while writes of its previous run may still be finishing, never writes
/// an object of the same name), and in the pending output and commit
/// markers of exactly-once sinks (the built-in ones and the connectors'
/// use it; a sink of your own may too).
pub fn run_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let half = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", half(), half())
}

/// Where a task's state file for checkpoint `n` goes: its name in the
/// storage, and the name a manifest records (relative to the checkpoint's
/// directory). State files live in `shared/`: a delta's chain reaches back
/// into earlier checkpoints, so files outlive their checkpoint's directory.
pub(crate) fn state_file(operator: &str, instance: usize, state: &str, n: CheckpointId, run: &str) -> (String, String) {
    let file = format!("{}-{instance}-{state}-{:020}-{run}.state", file_stem(operator), n.get());
    (format!("{SHARED}/{file}"), format!("../{SHARED}/{file}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_names_that_differ_give_state_files_that_differ() {
        assert_eq!(file_stem("sums"), "sums");
        assert_eq!(file_stem("per-user"), "per-user");
        assert!(file_stem("a.b").starts_with("a_b_"));
        assert_ne!(file_stem("a.b"), file_stem("a_b"));
        assert_ne!(file_stem("a.b"), file_stem("a b"));
        assert_eq!(file_stem("a.b"), file_stem("a.b"), "stable");
    }
}
