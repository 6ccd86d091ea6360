//! Matching a checkpoint to the job that restores it, by operator id.
//!
//! A checkpoint files keyed state under (operator id, state name), source
//! positions under (source id, partition) and pending commits under the
//! exactly-once sink's id, where an id is the node's uid or else its name
//! (`Node::id`). A restore gives each node what is filed under its id, so
//! a changed pipeline restores: stateless operators come and go freely,
//! and a stateful operator the checkpoint does not know starts empty.
//! What cannot be matched is refused before anything runs:
//!
//! - state filed under an id the job has no such node for ("unrestored":
//!   refused unless the job allows dropping it, then logged);
//! - an id that now belongs to a node of another kind, or a keyed
//!   operator whose key type changed ("incompatible": always refused,
//!   before any state is read).
//!
//! After the job is built, a state of a matched operator that no instance
//! read (the operator no longer keeps it) is unrestored too
//! ([`check_all_read`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::{OperatorEntry, Restore};
use crate::codec::recorded_type_name;
use crate::error::{Error, Result};
use crate::graph::{EdgeKind, Graph, Node, Op};

/// The keyed operators of `graph` that keep state, as a manifest records
/// them.
pub(crate) fn operator_entries(graph: &Graph) -> Vec<OperatorEntry> {
    graph
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Keyed { .. }) && n.stateful)
        .map(|n| OperatorEntry {
            id: n.id().to_string(),
            kind: n.kind.to_string(),
            key_type: key_type(n),
            key_schema: key_schema(n),
            state_version: n.state_version,
        })
        .collect()
}

/// The layout of a keyed node's keys.
fn key_schema(node: &Node) -> Option<crate::codec::schema::Shape> {
    node.inputs.iter().find_map(|i| match &i.kind {
        EdgeKind::Hash { key_schema, .. } => Some(key_schema()),
        EdgeKind::Forward => None,
    })
}

/// The type a keyed node's records are keyed by, as checkpoints record
/// type names.
fn key_type(node: &Node) -> String {
    node.inputs
        .iter()
        .find_map(|i| match &i.kind {
            EdgeKind::Hash { key_type, .. } => Some(recorded_type_name(key_type).into_owned()),
            EdgeKind::Forward => None,
        })
        .unwrap_or_default()
}

/// Checks, before any state is read, that everything `restore` holds has
/// a node of the same kind in `graph` to go to (with the same key type,
/// for keyed state); logs what starts afresh. What has no node is dropped
/// (logged) when `allow_unrestored` is set, and refused otherwise.
///
/// # Errors
/// [`Error::Checkpoint`] naming every operator that cannot take its state.
pub(crate) fn check(graph: &Graph, restore: &Restore, allow_unrestored: bool) -> Result<()> {
    let nodes: BTreeMap<&str, &Node> = graph.nodes.iter().map(|n| (n.id(), n)).collect();
    let mut incompatible = Vec::new();
    let mut unrestored = Vec::new();
    for (id, files) in &restore.states {
        let states: BTreeSet<&str> = files.iter().map(|f| f.state.as_str()).collect();
        let states = states.into_iter().collect::<Vec<_>>().join(", ");
        let Some(node) = nodes.get(id.as_str()) else {
            unrestored.push(format!("the state ({states}) of operator `{id}`, which the job does not have"));
            continue;
        };
        if !matches!(node.op, Op::Keyed { .. }) {
            incompatible.push(format!(
                "`{id}` kept keyed state ({states}) in the checkpoint, but is a {} in the job",
                node.kind
            ));
            continue;
        }
        // Checkpoints of earlier builds record no operators: their state
        // files' codecs are still checked as they are read.
        let Some(was) = restore.operators.iter().find(|o| o.id == *id) else { continue };
        let key = key_type(node);
        // A bootstrapped operator's kind is not known (empty): any.
        if !was.kind.is_empty() && was.kind != node.kind {
            incompatible.push(format!(
                "operator `{id}` was a {} and is a {} now: one cannot take the other's state (give the new operator \
                 another id, and allow the old one's state to be dropped)",
                was.kind, node.kind
            ));
        } else if was.state_version > node.state_version {
            incompatible.push(format!(
                "the state of operator `{id}` is of version {} in the checkpoint, the job reads version {}: a \
                 savepoint of a later version does not restore into an earlier one",
                was.state_version, node.state_version
            ));
        } else if let Some(difference) = key_difference(was, node) {
            incompatible.push(format!(
                "operator `{id}` was keyed by `{}` and is keyed by `{key}` now (the key's encoding differs: \
                 {difference}): its state cannot restore under another key type (keys are stored and grouped by \
                 their encoding)",
                was.key_type
            ));
        }
    }
    for m in &restore.migrations {
        if let Some(id) = m.operator.as_deref().filter(|id| !nodes.contains_key(id)) {
            tracing::warn!(job = %graph.name, operator = id, "a state migration names an operator the job does not have: it applies to none");
        }
    }
    for node in graph.nodes.iter().filter(|n| matches!(n.op, Op::Keyed { .. }) && n.stateful) {
        if !restore.states.contains_key(node.id()) {
            tracing::info!(job = %graph.name, operator = node.id(), "not in the checkpoint: starts with empty state");
        }
    }
    let mut positions: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for (source, partition) in restore.positions.keys() {
        positions.entry(source.as_str()).or_default().insert(*partition);
    }
    for (id, partitions) in &positions {
        match nodes.get(id) {
            Some(node) if matches!(node.op, Op::Source { .. }) => {
                let count = u32::try_from(node.parallelism()).unwrap_or(u32::MAX);
                let dropped: Vec<u32> = partitions.iter().copied().filter(|p| *p >= count).collect();
                let added: Vec<u32> = (0..count).filter(|p| !partitions.contains(p)).collect();
                if !dropped.is_empty() {
                    tracing::warn!(job = %graph.name, source = id, partitions = ?dropped,
                        "the source has fewer partitions than the checkpoint: these partitions' positions are dropped");
                }
                if !added.is_empty() {
                    tracing::info!(job = %graph.name, source = id, partitions = ?added,
                        "partitions the checkpoint does not know start from the source's configured start");
                }
            }
            Some(node) => {
                incompatible.push(format!("`{id}` was a source in the checkpoint, but is a {} in the job", node.kind))
            }
            None => unrestored.push(format!("the positions of source `{id}`, which the job does not have")),
        }
    }
    for node in graph.nodes.iter().filter(|n| matches!(n.op, Op::Source { .. })) {
        if !positions.contains_key(node.id()) {
            tracing::info!(job = %graph.name, source = node.id(), "not in the checkpoint: starts from its configured start");
        }
    }
    let sinks: BTreeSet<&str> = restore.commits.iter().map(|c| c.sink.as_str()).collect();
    for id in sinks {
        match nodes.get(id) {
            Some(node) if node.stateful && node.kind == "sink" => {}
            Some(node) => incompatible.push(format!(
                "`{id}` was an exactly-once sink with commits pending in the checkpoint, but is a {} in the job",
                node.kind
            )),
            None => unrestored.push(format!(
                "the pending commits of exactly-once sink `{id}`, which the job does not have (dropped, they are never \
                 committed)"
            )),
        }
    }
    if !incompatible.is_empty() {
        return Err(refused(restore, "it cannot restore into this job", &incompatible, ""));
    }
    unrestored_state(graph, restore, &unrestored, allow_unrestored)
}

/// How `node`'s key type differs from the one `was` recorded: by the
/// layout of their encodings when both are known (so a key type moved or
/// renamed is the same), else by name.
fn key_difference(was: &OperatorEntry, node: &Node) -> Option<String> {
    use crate::codec::schema::{Schema, Shape};
    let now = key_schema(node);
    match (&was.key_schema, now) {
        (Some(a), Some(b)) if !matches!(a, Shape::Opaque(_)) && !matches!(b, Shape::Opaque(_)) => {
            Schema { shape: a.clone() }.first_difference(&Schema { shape: b })
        }
        _ => (was.key_type != key_type(node)).then(|| "another type".to_string()),
    }
}

/// After the job is built (each operator has read its state): a state of
/// a matched operator that none of its instances read is unrestored.
///
/// # Errors
/// As [`check`].
pub(crate) fn check_all_read(graph: &Graph, restore: &Restore, allow_unrestored: bool) -> Result<()> {
    let ids: BTreeSet<&str> = graph.nodes.iter().map(Node::id).collect();
    let read = restore.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut unrestored = Vec::new();
    for (id, files) in restore.states.iter().filter(|(id, _)| ids.contains(id.as_str())) {
        let states: BTreeSet<&str> = files.iter().map(|f| f.state.as_str()).collect();
        for state in states {
            if !read.contains(&(id.clone(), state.to_string())) {
                unrestored.push(format!("state `{state}` of operator `{id}`, which it no longer keeps"));
            }
        }
    }
    drop(read);
    unrestored_state(graph, restore, &unrestored, allow_unrestored)
}

fn unrestored_state(graph: &Graph, restore: &Restore, unrestored: &[String], allow: bool) -> Result<()> {
    if unrestored.is_empty() {
        return Ok(());
    }
    if allow {
        for what in unrestored {
            tracing::warn!(job = %graph.name, checkpoint = %restore.location().display(), "dropping {what}");
        }
        return Ok(());
    }
    Err(refused(
        restore,
        "it holds state this job would not restore",
        unrestored,
        ". To drop it, restore with `Job::allow_unrestored_state()`; to keep it, give the operator that should \
         take it the id it was saved under (`.uid(..)`)",
    ))
}

fn refused(restore: &Restore, what: &str, problems: &[String], hint: &str) -> Error {
    Error::Checkpoint {
        path: restore.location(),
        message: format!("{what}: {}{hint}", problems.join("; ")),
        source: None,
    }
}
