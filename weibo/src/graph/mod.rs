//! The logical graph: node descriptors joined by edges, with types erased.
//!
//! A [`Node`] is a descriptor (kind, name, detail, input edges, output
//! ports with their types, parallelism) plus the factory that makes its
//! instances ([`Op`]). The graph knows nothing of how it runs: the typed
//! DSL (`crate::stream`) builds it, or anything else that has factories,
//! and the runtime turns its plan into tasks and channels. Here are the
//! checks of its wiring ([`validate`]), its text forms ([`display`],
//! [`plan`]), its warnings and its fingerprint.

mod display;
pub(crate) mod plan;
mod validate;

use std::fmt::Write as _;
use std::sync::Arc;

use crate::codec::{CodecId, recorded_type_name};
use crate::error::Result;
use crate::operator::factory::{ChainFactory, KeyedFactory, RouterFactory, SourceFactory};
pub(crate) use crate::operator::stateless::{PortType, TypedPort};

pub(crate) type NodeId = usize;

/// How records travel from one node's port to another node.
#[derive(Clone, Debug)]
pub(crate) enum EdgeKind {
    /// Same task, same instance: the operators are fused.
    Forward,
    /// Encoded, routed by key group to the instance that owns it.
    Hash {
        key_type: &'static str,
        /// The layout of the key's encoding (`Key::key_schema`).
        key_schema: fn() -> crate::codec::schema::Shape,
        codec: CodecId,
    },
}

#[derive(Clone, Debug)]
pub(crate) struct Input {
    pub(crate) from: NodeId,
    pub(crate) port: usize,
    pub(crate) kind: EdgeKind,
}

pub(crate) struct Port {
    pub(crate) type_name: &'static str,
    pub(crate) ty: Arc<dyn PortType>,
    /// Whether leaving the port unconsumed would lose records silently.
    pub(crate) must_consume: bool,
    pub(crate) label: std::borrow::Cow<'static, str>,
    /// For a process function's side output: its tag's id (what
    /// `Stream::side_output` looks for).
    pub(crate) tag: Option<u32>,
}

/// What a node does, with the factory that makes its instances.
pub(crate) enum Op {
    /// Reads a source: one instance per partition.
    Source { partitions: usize, factory: Arc<dyn SourceFactory> },
    /// A stateless operator or a sink, fused into the task of whatever
    /// feeds it: one instance per upstream instance.
    Chain(Arc<dyn ChainFactory>),
    /// Merges its inputs; makes nothing.
    Union,
    /// A keyed operator, fed by channels through a hash edge: `router`
    /// makes the sending end in each upstream instance, `factory` the
    /// operator's `parallelism` instances.
    Keyed { parallelism: usize, router: Arc<dyn RouterFactory>, factory: Arc<dyn KeyedFactory> },
}

/// One node of the graph: its descriptor and its factory.
pub(crate) struct Node {
    pub(crate) kind: &'static str,
    pub(crate) name: String,
    /// The stable id set with `.uid(..)`: what checkpoints file the node's
    /// state, positions and commits under (see [`Node::id`]).
    pub(crate) uid: Option<String>,
    /// The version of the layout and meaning of the node's state, as the
    /// user declares it (`.state_version(..)`, 1 unless set): a restore
    /// into another version migrates every user-defined state of the node
    /// (or is refused), even when the layout did not change.
    pub(crate) state_version: u32,
    /// Whether the name was given (`.name(..)`), not generated from the
    /// node's kind: a generated name changes when a node of the same kind
    /// is added before it.
    pub(crate) named: bool,
    /// Whether a checkpoint records state under the node's id: a keyed
    /// operator's (not a plain repartition's), or an exactly-once sink's
    /// pending commits. Sources' positions are filed by id too, but their
    /// default names come from what they read.
    pub(crate) stateful: bool,
    pub(crate) detail: String,
    pub(crate) inputs: Vec<Input>,
    pub(crate) outputs: Vec<Port>,
    pub(crate) op: Op,
}

impl Node {
    /// The node's stable id: its uid if it has one, else its name. A
    /// checkpoint records state, source positions and sink commits by
    /// id, and a restore matches them to the job's nodes by id.
    pub(crate) fn id(&self) -> &str {
        self.uid.as_deref().unwrap_or(&self.name)
    }

    /// Whether the node runs in tasks of its own (a source partition, a
    /// keyed instance), rather than fused into another's.
    pub(crate) fn is_head(&self) -> bool {
        matches!(self.op, Op::Source { .. } | Op::Keyed { .. })
    }

    /// How many instances the node has, when it is a head.
    pub(crate) fn parallelism(&self) -> usize {
        match self.op {
            Op::Source { partitions, .. } => partitions,
            Op::Keyed { parallelism, .. } => parallelism,
            _ => 1,
        }
    }
}

/// The logical graph of a job.
pub(crate) struct Graph {
    /// The job's name.
    pub(crate) name: String,
    /// The job's key groups: the most partitions a keyed node may have.
    pub(crate) max_key_groups: u16,
    /// The state backend's name, for the graph's text.
    pub(crate) state: String,
    /// Wiring mistakes found while building (reported with the graph's own).
    pub(crate) wiring_errors: Vec<String>,
    pub(crate) nodes: Vec<Node>,
    /// The operators of two inputs, by the union of their tagged inputs.
    pub(crate) two_inputs: Vec<TwoInputNodes>,
}

/// The nodes an operator of two inputs is built from: each input tagged
/// with its side (`tags`), the union of both, and what its metrics say of
/// each input (labels, the states their waiting records are in, the
/// counters its functions add to).
pub(crate) struct TwoInputNodes {
    pub(crate) union: NodeId,
    pub(crate) tags: [NodeId; 2],
    pub(crate) labels: [&'static str; 2],
    pub(crate) states: [Option<&'static str>; 2],
    pub(crate) counters: Arc<crate::metrics::TwoInputCounters>,
}

/// Strips module paths from a type name: `alloc::string::String` → `String`.
pub(crate) fn short_type_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut segment = String::new();
    let flush = |segment: &mut String, out: &mut String| {
        let last = segment.rsplit("::").next().unwrap_or_default();
        out.push_str(last);
        segment.clear();
    };
    for c in name.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            segment.push(c);
        } else {
            flush(&mut segment, &mut out);
            out.push(c);
        }
    }
    flush(&mut segment, &mut out);
    out
}

impl Graph {
    pub(crate) fn new(name: String, max_key_groups: u16, state: String) -> Self {
        Self { name, max_key_groups, state, wiring_errors: Vec::new(), nodes: Vec::new(), two_inputs: Vec::new() }
    }

    pub(crate) fn add(&mut self, mut node: Node) -> NodeId {
        node.name = self.unique_name(&node.name);
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn unique_name(&self, wanted: &str) -> String {
        if !self.nodes.iter().any(|n| n.name == wanted) {
            return wanted.to_string();
        }
        (2..).map(|i| format!("{wanted}-{i}")).find(|c| !self.nodes.iter().any(|n| &n.name == c)).unwrap_or_default()
    }

    /// Gives a node the name the library picks for it (`wanted`, or
    /// `wanted-2`, ... if another node has it): not a name the user chose,
    /// so a later `name(..)` or `uid(..)` may still replace it.
    pub(crate) fn default_name(&mut self, node: NodeId, wanted: &str) {
        let taken = |c: &str| self.nodes.iter().enumerate().any(|(i, n)| i != node && n.name == c);
        let name = if taken(wanted) {
            (2..).map(|i| format!("{wanted}-{i}")).find(|c| !taken(c)).unwrap_or_default()
        } else {
            wanted.to_string()
        };
        if let Some(n) = self.nodes.get_mut(node) {
            n.name = name;
        }
    }

    /// Renames a node; names are unique in a job.
    pub(crate) fn rename(&mut self, node: NodeId, name: &str) -> std::result::Result<(), String> {
        if self.nodes.iter().enumerate().any(|(i, n)| i != node && n.name == name) {
            return Err(format!("two operators are named `{name}`: operator names must be unique in a job"));
        }
        match self.nodes.get_mut(node) {
            Some(n) => {
                n.name = name.to_string();
                n.named = true;
                Ok(())
            }
            None => Err(format!("no operator #{node}")),
        }
    }

    /// Gives a node a stable id (see [`Node::id`]); ids are unique in a
    /// job, and a non-empty line of text.
    pub(crate) fn set_uid(&mut self, node: NodeId, uid: &str) -> std::result::Result<(), String> {
        if uid.trim().is_empty() || uid.chars().any(char::is_control) {
            return Err(format!("`{uid}` is not an operator id: an id is a non-empty line of text"));
        }
        match self.nodes.get_mut(node) {
            Some(n) => {
                n.uid = Some(uid.to_string());
                Ok(())
            }
            None => Err(format!("no operator #{node}")),
        }
    }

    /// Declares the version of a node's state (see [`Node::state_version`]).
    pub(crate) fn set_state_version(&mut self, node: NodeId, version: u32) -> std::result::Result<(), String> {
        if version == 0 {
            return Err("state version 0: versions start at 1 (the version of state that never declared one)".into());
        }
        match self.nodes.get_mut(node) {
            Some(n) if n.stateful => {
                n.state_version = version;
                Ok(())
            }
            Some(n) => Err(format!("{} `{}` keeps no state: it has no state version to set", n.kind, n.id())),
            None => Err(format!("no operator #{node}")),
        }
    }

    /// The nodes whose state a checkpoint would file under an id that
    /// was generated, not given: a warning, since adding a node of the
    /// same kind before one renames it, and a restore would then match
    /// its state to another node (or refuse it).
    pub(crate) fn warnings(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.stateful && n.uid.is_none() && !n.named)
            .map(|n| {
                format!(
                    "{} `{}` keeps state under a generated id: give it a stable one with `.uid(\"...\")` (or a name with \
                     `.name(..)`), so that a savepoint still restores after operators are added before it",
                    n.kind, n.name
                )
            })
            .collect()
    }

    pub(crate) fn consumers(&self, node: NodeId, port: usize) -> impl Iterator<Item = (NodeId, &Input)> + '_ {
        self.nodes.iter().enumerate().flat_map(move |(id, n)| {
            n.inputs.iter().filter(move |i| i.from == node && i.port == port).map(move |i| (id, i))
        })
    }

    /// The operators of two inputs: each with the nodes it is built from.
    pub(crate) fn two_input_operators(&self) -> impl Iterator<Item = (NodeId, &TwoInputNodes)> + '_ {
        self.two_inputs.iter().flat_map(move |t| self.consumers(t.union, 0).map(move |(id, _)| (id, t)))
    }

    /// The operator that feeds `node`'s first input, and its name.
    pub(crate) fn feeder(&self, node: NodeId) -> Option<&Node> {
        let input = self.nodes.get(node)?.inputs.first()?;
        self.nodes.get(input.from)
    }

    pub(crate) fn node(&self, id: NodeId) -> Result<&Node> {
        self.nodes.get(id).ok_or_else(|| crate::error::internal_error!("no node #{id}"))
    }

    /// A hash of the operators, their names, types and edges, leaving out
    /// parallelism, recorded in manifests for information (a restore
    /// matches state by operator id: `runtime::matching`). Types are named as
    /// checkpoints record them (`codec::recorded_type_name`), so a build
    /// that moved Weibo's own types inside the crate restores the
    /// checkpoints of the builds before it.
    pub(crate) fn fingerprint(&self) -> String {
        let mut text = String::new();
        for (id, n) in self.nodes.iter().enumerate() {
            let _ = write!(text, "{id}:{}:{}:", n.kind, n.name);
            for p in &n.outputs {
                let _ = write!(text, "{},", recorded_type_name(p.type_name));
            }
            for i in &n.inputs {
                let kind = match &i.kind {
                    EdgeKind::Forward => "forward".to_string(),
                    EdgeKind::Hash { key_type, codec, .. } => format!("hash({},{codec})", recorded_type_name(key_type)),
                };
                let _ = write!(text, "<{}.{}:{kind}", i.from, i.port);
            }
            text.push('\n');
        }
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::short_type_name;

    #[test]
    fn type_names_lose_their_paths() {
        assert_eq!(short_type_name("alloc::string::String"), "String");
        assert_eq!(short_type_name("(u64, alloc::vec::Vec<my_crate::orders::Order>)"), "(u64, Vec<Order>)");
    }
}
