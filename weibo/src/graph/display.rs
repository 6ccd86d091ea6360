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
                .map(|p| match p.label {
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
