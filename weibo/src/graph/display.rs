//! The graph as text: one line per node (what `Job`'s `Display` shows).

use std::fmt;

use super::{EdgeKind, Graph, Op, short_type_name};

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "job `{}` ({} key groups, state: {})", self.name, self.max_key_groups, self.state)?;
        for (id, node) in self.nodes.iter().enumerate() {
            write!(f, "  #{id} {} `{}`", node.kind, node.name)?;
            match (&node.uid, node.state_version) {
                (Some(uid), 1) => write!(f, " [id {uid}]")?,
                (Some(uid), v) => write!(f, " [id {uid}, state version {v}]")?,
                (None, 1) => {}
                (None, v) => write!(f, " [state version {v}]")?,
            }
            if let Op::Keyed { parallelism, .. } = node.op {
                write!(f, " x{parallelism}")?;
            }
            if !node.detail.is_empty() {
                write!(f, " ({})", node.detail)?;
            }
            for (k, input) in node.inputs.iter().enumerate() {
                f.write_str(if k == 0 { " <- " } else { ", " })?;
                write!(f, "#{}", input.from)?;
                if input.port > 0 {
                    write!(f, ".{}", input.port)?;
                }
                if let EdgeKind::Hash { key_type, codec, .. } = &input.kind {
                    write!(f, " hash({}) [{}]", short_type_name(key_type), codec.format)?;
                }
            }
            let outs: Vec<String> = node
                .outputs
                .iter()
                // A process under `Drop` or `Fail` has a dead-letter port
                // that never carries anything: not shown.
                .filter(|p| p.label != "dead letters" || p.must_consume)
                .map(|p| match p.label.as_ref() {
                    "output" => short_type_name(p.type_name),
                    label => format!("{label}: {}", short_type_name(p.type_name)),
                })
                .collect();
            if !outs.is_empty() {
                write!(f, " : {}", outs.join(", "))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

impl Graph {
    /// The graph as JSON, for the admin API: every node with its id, kind,
    /// name, parallelism (`null` for an operator fused into the task of
    /// what feeds it), whether it keeps state, and its inputs (the edge's
    /// kind, and for a hash edge the key type and the records' codec).
    ///
    /// An operator of two inputs also lists them (`two_inputs`: each
    /// input's label, the node that feeds it, and the node that tags its
    /// records with their side); those tagging nodes and their union say
    /// which operator they are `part_of`, so that a drawing can show the
    /// operator with its two input edges.
    #[cfg(feature = "admin")]
    pub(crate) fn describe(&self) -> serde_json::Value {
        let mut two_inputs: std::collections::HashMap<usize, serde_json::Value> = std::collections::HashMap::new();
        let mut part_of: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        for (id, two) in self.two_input_operators() {
            let sides: Vec<serde_json::Value> = two
                .tags
                .iter()
                .zip(two.labels)
                .map(|(&tag, label)| {
                    let from = self.nodes.get(tag).and_then(|n| n.inputs.first()).map(|i| i.from);
                    serde_json::json!({ "input": label, "from": from, "tag": tag })
                })
                .collect();
            two_inputs.insert(id, serde_json::Value::Array(sides));
            for part in [two.union, two.tags[0], two.tags[1]] {
                part_of.entry(part).or_insert(id);
            }
        }
        let nodes: Vec<serde_json::Value> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let parallelism = match node.op {
                    Op::Source { partitions, .. } => Some(partitions),
                    Op::Keyed { parallelism, .. } => Some(parallelism),
                    Op::Chain(_) | Op::Union => None,
                };
                let inputs: Vec<serde_json::Value> = node
                    .inputs
                    .iter()
                    .map(|i| match &i.kind {
                        EdgeKind::Forward => serde_json::json!({ "from": i.from, "port": i.port, "edge": "forward" }),
                        EdgeKind::Hash { key_type, codec, .. } => serde_json::json!({
                            "from": i.from,
                            "port": i.port,
                            "edge": "hash",
                            "key_type": short_type_name(key_type),
                            "codec": codec.format,
                        }),
                    })
                    .collect();
                let outputs: Vec<serde_json::Value> = node
                    .outputs
                    .iter()
                    .map(|p| serde_json::json!({ "label": p.label, "type": short_type_name(p.type_name) }))
                    .collect();
                serde_json::json!({
                    "index": index,
                    "id": node.id(),
                    "name": node.name,
                    "kind": node.kind,
                    "detail": node.detail,
                    "parallelism": parallelism,
                    "stateful": node.stateful,
                    "state_version": node.state_version,
                    "inputs": inputs,
                    "outputs": outputs,
                    "two_inputs": two_inputs.get(&index),
                    "part_of": part_of.get(&index),
                })
            })
            .collect();
        serde_json::json!({
            "job": self.name,
            "max_key_groups": self.max_key_groups,
            "state_backend": self.state,
            "nodes": nodes,
        })
    }
}
