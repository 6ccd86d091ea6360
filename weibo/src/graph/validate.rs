//! Checks of a graph's wiring before anything runs: every problem at once,
//! each with how to fix it.

use crate::error::{Error, Result};

use super::{EdgeKind, Graph, Op};

impl Graph {
    fn graph_error(&self, message: String) -> Error {
        Error::Graph { job: self.name.clone(), message }
    }

    /// Checks the wiring before anything runs: every problem the builder
    /// recorded and every one the graph has, reported together.
    pub(crate) fn validate(&self) -> Result<()> {
        let mut problems = self.wiring_errors.clone();
        problems.extend(self.problems());
        match problems.len() {
            0 => Ok(()),
            1 => Err(self.graph_error(problems.swap_remove(0))),
            n => {
                let list: Vec<String> = problems.iter().enumerate().map(|(i, p)| format!("({}) {p}", i + 1)).collect();
                Err(self.graph_error(format!("{n} wiring problems: {}", list.join("; "))))
            }
        }
    }

    /// What is wrong with the graph's wiring, each a message that says how
    /// to fix it.
    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.nodes.iter().any(|n| matches!(n.op, Op::Source { .. })) {
            out.push("the job has no source: add one with `job.source(...)`".into());
        }
        // Without any sink, every output is unconsumed: that one problem
        // says it all.
        let has_sink = self.nodes.iter().any(|n| n.kind == "sink");
        if !has_sink {
            out.push("the job has no sink: end a stream with `.sink(...)`".into());
        }
        let max = self.max_key_groups;
        for (id, node) in self.nodes.iter().enumerate() {
            for (p, port) in node.outputs.iter().enumerate() {
                if has_sink && port.must_consume && self.consumers(id, p).next().is_none() {
                    let what = if port.label == "output" {
                        format!("the output of `{}` is not consumed, so its records would be lost", node.name)
                    } else {
                        format!("the {} of `{}` are not consumed, so they would be lost", port.label, node.name)
                    };
                    out.push(format!(
                        "{what}: end the stream with a sink (for example `.sink(weibo::sinks::Blackhole::new())` to discard on purpose)"
                    ));
                }
            }
            if let Op::Source { partitions: 0, .. } = node.op {
                out.push(format!("source `{}` has no partitions", node.name));
            }
            if let Op::Keyed { parallelism, .. } = node.op
                && (parallelism == 0 || parallelism > usize::from(max))
            {
                out.push(format!(
                    "`{}` runs with {parallelism} partitions, but partitions must be between 1 and the job's {max} key groups \
                     (raise it with `Job::with_max_key_groups`)",
                    node.name
                ));
            }
            for input in &node.inputs {
                if let EdgeKind::Hash { codec, .. } = &input.kind {
                    let Some(from) = self.nodes.get(input.from) else {
                        out.push(format!(
                            "`{}` has an input from operator #{}, which does not exist",
                            node.name, input.from
                        ));
                        continue;
                    };
                    let sent = from.outputs.get(input.port).map(|p| p.type_name).unwrap_or_default();
                    if sent != codec.type_name {
                        out.push(format!(
                            "the edge from `{}` to `{}` carries `{sent}` but the receiver decodes {codec}",
                            from.name, node.name
                        ));
                    }
                }
            }
        }
        // Ids name state in checkpoints: two nodes with one id would mix
        // their state (a uid may not take another node's name either, as
        // a node without a uid goes by its name).
        let mut ids: std::collections::BTreeMap<&str, Vec<&str>> = std::collections::BTreeMap::new();
        for node in &self.nodes {
            ids.entry(node.id()).or_default().push(&node.name);
        }
        for (id, names) in ids.into_iter().filter(|(_, names)| names.len() > 1) {
            let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            out.push(format!(
                "operators {} share the id `{id}`: operator ids must be unique in a job (set another with `.uid(..)`)",
                names.join(" and ")
            ));
        }
        out
    }
}
