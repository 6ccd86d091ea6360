//! The plan: how the graph fuses into tasks and expands into instances.
//! Pure functions of the graph, shared by the plan's text and the runtime.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::error::Result;

use super::{EdgeKind, Graph, Node, NodeId, Op, short_type_name};

impl Graph {
    /// The fused plan as text: one line per chain (a head and the
    /// operators fused into it).
    pub(crate) fn plan_text(&self) -> Result<String> {
        self.validate()?;
        let heads: Vec<NodeId> =
            (0..self.nodes.len()).filter(|&i| self.nodes.get(i).is_some_and(Node::is_head)).collect();
        let tasks: usize = heads.iter().filter_map(|&h| self.nodes.get(h)).map(Node::parallelism).sum();
        let plural = |n: usize, word: &str| if n == 1 { format!("1 {word}") } else { format!("{n} {word}s") };
        let mut out =
            format!("plan of job `{}`: {}, {}\n", self.name, plural(heads.len(), "chain"), plural(tasks, "task"));
        for h in heads {
            let node = self.node(h)?;
            let _ = write!(out, "  chain `{}` x{}: {}", node.name, node.parallelism(), node.name);
            self.chain_text(h, &mut out)?;
            out.push('\n');
        }
        for w in self.warnings() {
            let _ = writeln!(out, "  warning: {w}");
        }
        Ok(out)
    }

    pub(crate) fn chain_text(&self, node: NodeId, out: &mut String) -> Result<()> {
        let n = self.node(node)?;
        let mut next = Vec::new();
        for p in 0..n.outputs.len() {
            for (dst, input) in self.consumers(node, p) {
                next.push((p, dst, input));
            }
        }
        let many = next.len() > 1;
        if many {
            out.push_str(" -> {");
        }
        for (k, (p, dst, input)) in next.into_iter().enumerate() {
            if many && k > 0 {
                out.push_str(", ");
            }
            match (&input.kind, many) {
                (EdgeKind::Hash { key_type, .. }, false) => {
                    let _ = write!(out, " => hash({}) ", short_type_name(key_type));
                }
                (EdgeKind::Hash { key_type, .. }, true) => {
                    let _ = write!(out, "hash({}) ", short_type_name(key_type));
                }
                (EdgeKind::Forward, false) => out.push_str(" -> "),
                (EdgeKind::Forward, true) => {}
            }
            if let Some(label) = n.outputs.get(p).map(|port| port.label.as_ref()).filter(|l| *l != "output") {
                let _ = write!(out, "[{label}] ");
            }
            let dst_node = self.node(dst)?;
            out.push_str(&dst_node.name);
            if !matches!(dst_node.op, Op::Keyed { .. }) {
                self.chain_text(dst, out)?;
            }
        }
        if many {
            out.push('}');
        }
        Ok(())
    }

    /// The names of the operators fused behind `node` (not unions, not
    /// the keyed operators its shuffle edges lead to), in graph order.
    pub(crate) fn chain_names(&self, node: NodeId, out: &mut Vec<String>) -> Result<()> {
        let n = self.node(node)?;
        for p in 0..n.outputs.len() {
            for (dst, _) in self.consumers(node, p) {
                let dst_node = self.node(dst)?;
                match dst_node.op {
                    Op::Keyed { .. } => {}
                    Op::Union => self.chain_names(dst, out)?,
                    _ => {
                        if !out.contains(&dst_node.name) {
                            out.push(dst_node.name.clone());
                        }
                        self.chain_names(dst, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Every fused operator's number of instances: it runs once per
    /// instance of each head that reaches it without crossing a shuffle
    /// edge (after a `union`, from several heads).
    pub(crate) fn chain_instances(&self) -> HashMap<NodeId, usize> {
        self.instances_reached().0
    }

    /// Every keyed operator's number of senders: how many routers (one
    /// per instance of each head that reaches it) feed each of its
    /// instances, each over a channel of its own.
    pub(crate) fn keyed_senders(&self) -> HashMap<NodeId, usize> {
        self.instances_reached().1
    }

    /// [`chain_instances`](Self::chain_instances) and
    /// [`keyed_senders`](Self::keyed_senders).
    fn instances_reached(&self) -> (HashMap<NodeId, usize>, HashMap<NodeId, usize>) {
        let mut counts = (HashMap::new(), HashMap::new());
        for (id, node) in self.nodes.iter().enumerate() {
            if node.is_head() {
                for p in 0..node.outputs.len() {
                    self.count_chain_instances(id, p, node.parallelism(), &mut counts);
                }
            }
        }
        counts
    }

    /// The sources' names, in graph order (a record's source is an index
    /// into them).
    pub(crate) fn source_names(&self) -> Vec<String> {
        self.nodes.iter().filter(|n| matches!(n.op, Op::Source { .. })).map(|n| n.name.clone()).collect()
    }

    /// Adds `copies` to the instance count of every fused operator reachable
    /// from `node`'s `port` without crossing a shuffle edge (`counts.0`),
    /// and to the senders of every keyed operator at the end of such a
    /// path (`counts.1`).
    #[allow(clippy::type_complexity)]
    fn count_chain_instances(
        &self,
        node: NodeId,
        port: usize,
        copies: usize,
        counts: &mut (HashMap<NodeId, usize>, HashMap<NodeId, usize>),
    ) {
        let targets: Vec<NodeId> = self.consumers(node, port).map(|(id, _)| id).collect();
        for dst in targets {
            let Some(n) = self.nodes.get(dst) else { continue };
            match n.op {
                Op::Chain(_) => {
                    *counts.0.entry(dst).or_insert(0) += copies;
                    for p in 0..n.outputs.len() {
                        self.count_chain_instances(dst, p, copies, counts);
                    }
                }
                Op::Union => self.count_chain_instances(dst, 0, copies, counts),
                Op::Keyed { .. } => *counts.1.entry(dst).or_insert(0) += copies,
                Op::Source { .. } => {}
            }
        }
    }

    /// How many head tasks the job runs, and how many of them read sources.
    pub(crate) fn head_counts(&self) -> (usize, usize) {
        let heads = self.nodes.iter().filter(|n| n.is_head()).map(Node::parallelism).sum();
        let sources = self.nodes.iter().filter(|n| matches!(n.op, Op::Source { .. })).map(Node::parallelism).sum();
        (heads, sources)
    }
}
