//! A YAML document as a tree of nodes, each with the line and column it
//! starts at, read event by event (saphyr-parser) under limits: nesting
//! depth, number of nodes (aliases included, so that "billion laughs"
//! stops at the budget), size of the text. A file that breaks a limit,
//! is not UTF-8 or is not YAML gives one [`Diagnostic`] and never panics.

use std::collections::HashMap;
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle};

/// The deepest nesting of sequences and mappings a pipeline file may have.
pub const MAX_DEPTH: usize = 64;
/// The most nodes a pipeline file may have, counting every node an alias
/// repeats.
pub const MAX_NODES: usize = 100_000;
/// The largest pipeline file, in bytes.
pub const MAX_BYTES: usize = 4 << 20;

/// A position in a file: line and column, both from 1 (columns in
/// characters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    /// The line, from 1.
    pub line: u32,
    /// The column, from 1.
    pub column: u32,
}

impl Pos {
    /// The position `offset` characters to the right (within one line).
    pub(crate) fn right(self, offset: usize) -> Pos {
        Pos { line: self.line, column: self.column.saturating_add(u32::try_from(offset).unwrap_or(u32::MAX)) }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// What is wrong at a position of a pipeline file, and what to write
/// instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Where.
    pub pos: Pos,
    /// What is wrong.
    pub message: String,
    /// What to write instead, when there is something to say.
    pub help: Option<String>,
}

impl Diagnostic {
    /// An error at `pos`.
    pub fn new(pos: Pos, message: impl Into<String>) -> Self {
        Self { pos, message: message.into(), help: None }
    }

    /// The same error with what to write instead.
    #[must_use]
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

/// A node's content.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// A scalar: its text, and whether it was plain (unquoted, so `true`,
    /// `3` or `null` are not strings).
    Scalar {
        /// The text.
        text: String,
        /// Unquoted.
        plain: bool,
    },
    /// A sequence.
    Seq(Vec<Spanned>),
    /// A mapping, in the file's order.
    Map(Vec<(Spanned<String>, Spanned)>),
}

/// A node and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Spanned<T = Node> {
    /// Where the node starts.
    pub pos: Pos,
    /// The node.
    pub node: T,
}

impl Spanned {
    /// The text of a scalar that is not null.
    pub fn as_str(&self) -> Option<&str> {
        match &self.node {
            Node::Scalar { text, .. } if !self.is_null() => Some(text),
            _ => None,
        }
    }

    /// Whether the node is `null`, `~` or empty (plain).
    pub fn is_null(&self) -> bool {
        matches!(&self.node, Node::Scalar { text, plain: true } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// The mapping's entries.
    pub fn as_map(&self) -> Option<&[(Spanned<String>, Spanned)]> {
        match &self.node {
            Node::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// The sequence's items.
    pub fn as_seq(&self) -> Option<&[Spanned]> {
        match &self.node {
            Node::Seq(items) => Some(items),
            _ => None,
        }
    }

    /// What kind of node this is, for messages.
    pub fn kind(&self) -> &'static str {
        match &self.node {
            Node::Scalar { .. } if self.is_null() => "null",
            Node::Scalar { .. } => "a scalar",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a mapping",
        }
    }
}

/// Reads `bytes` as one YAML document.
///
/// # Errors
/// The first thing that stops the reading: text that is not UTF-8 (with
/// the line and column of the first bad byte), YAML that does not parse,
/// more than one document, a limit exceeded, an alias to no anchor.
pub fn parse(bytes: &[u8]) -> Result<Spanned, Diagnostic> {
    if bytes.len() > MAX_BYTES {
        return Err(Diagnostic::new(
            Pos { line: 1, column: 1 },
            format!("the file has {} bytes; at most {MAX_BYTES} are read", bytes.len()),
        )
        .help("split the pipeline into several files"));
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let good = bytes.get(..e.valid_up_to()).unwrap_or_default();
            let good = std::str::from_utf8(good).unwrap_or_default();
            let line = good.matches('\n').count() + 1;
            let column = good.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            let pos = Pos { line: to_u32(line), column: to_u32(column) };
            return Err(Diagnostic::new(pos, "the file is not UTF-8 text").help("save the file as UTF-8"));
        }
    };
    Loader::default().load(text)
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[derive(Default)]
struct Loader {
    /// Anchored nodes by anchor id, with their node counts.
    anchors: HashMap<usize, (Spanned, usize)>,
    nodes: usize,
}

/// A collection being read: a sequence, or a mapping with its pending key.
enum Open {
    Seq(Pos, Vec<Spanned>, usize),
    Map(Pos, Vec<(Spanned<String>, Spanned)>, Option<Spanned<String>>, usize),
}

impl Loader {
    fn load(mut self, text: &str) -> Result<Spanned, Diagnostic> {
        let mut parser = Parser::new_from_str(text);
        let mut stack: Vec<Open> = Vec::new();
        let mut root: Option<Spanned> = None;
        let mut documents = 0usize;
        while let Some(next) = parser.next_event() {
            let (event, span) = next.map_err(|e| {
                let m = e.marker();
                Diagnostic::new(
                    Pos { line: to_u32(m.line()), column: to_u32(m.col() + 1) },
                    format!("not YAML: {}", e.info()),
                )
            })?;
            let pos = Pos { line: to_u32(span.start.line()), column: to_u32(span.start.col() + 1) };
            let done = match event {
                Event::StreamStart | Event::Nothing | Event::DocumentEnd => None,
                Event::StreamEnd => break,
                Event::DocumentStart(_) => {
                    documents += 1;
                    if documents > 1 {
                        return Err(Diagnostic::new(pos, "a pipeline file holds one YAML document; this is a second")
                            .help("remove the `---` line, or put the second pipeline in its own file"));
                    }
                    None
                }
                Event::Scalar(text, style, anchor, _) => {
                    self.count(pos)?;
                    let node = Spanned {
                        pos,
                        node: Node::Scalar { text: text.into_owned(), plain: style == ScalarStyle::Plain },
                    };
                    if anchor > 0 {
                        self.anchors.insert(anchor, (node.clone(), 1));
                    }
                    Some((node, anchor, 1))
                }
                Event::Alias(id) => {
                    let Some((node, count)) = self.anchors.get(&id) else {
                        return Err(Diagnostic::new(pos, "an alias to no anchor"));
                    };
                    let (node, count) = (node.clone(), *count);
                    self.nodes += count;
                    if self.nodes > MAX_NODES {
                        return Err(too_many(pos));
                    }
                    Some((Spanned { pos, node: node.node }, 0, count))
                }
                Event::SequenceStart(anchor, _) => {
                    self.count(pos)?;
                    if stack.len() >= MAX_DEPTH {
                        return Err(too_deep(pos));
                    }
                    stack.push(Open::Seq(pos, Vec::new(), anchor));
                    None
                }
                Event::MappingStart(anchor, _) => {
                    self.count(pos)?;
                    if stack.len() >= MAX_DEPTH {
                        return Err(too_deep(pos));
                    }
                    stack.push(Open::Map(pos, Vec::new(), None, anchor));
                    None
                }
                Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                    Some(Open::Seq(at, items, anchor)) => {
                        let count = 1 + items.iter().map(size).sum::<usize>();
                        Some((Spanned { pos: at, node: Node::Seq(items) }, anchor, count))
                    }
                    Some(Open::Map(at, entries, _, anchor)) => {
                        let count = 1 + entries.iter().map(|(_, v)| 1 + size(v)).sum::<usize>();
                        Some((Spanned { pos: at, node: Node::Map(entries) }, anchor, count))
                    }
                    None => None,
                },
            };
            let Some((node, anchor, count)) = done else {
                continue;
            };
            if anchor > 0 && !matches!(node.node, Node::Scalar { .. }) {
                self.anchors.insert(anchor, (node.clone(), count));
            }
            match stack.last_mut() {
                None => root = Some(node),
                Some(Open::Seq(_, items, _)) => items.push(node),
                Some(Open::Map(_, entries, key, _)) => match key.take() {
                    Some(k) => entries.push((k, node)),
                    None => match node.node {
                        Node::Scalar { text, .. } => {
                            if let Some((first, _)) = entries.iter().find(|(k, _)| k.node == text) {
                                return Err(Diagnostic::new(
                                    node.pos,
                                    format!("`{text}` is set twice in this mapping (first at {})", first.pos),
                                )
                                .help("keep one of them"));
                            }
                            *key = Some(Spanned { pos: node.pos, node: text });
                        }
                        _ => {
                            return Err(Diagnostic::new(
                                node.pos,
                                format!("a mapping's key is {}; keys are plain words", node.kind()),
                            ));
                        }
                    },
                },
            }
        }
        Ok(root.unwrap_or(Spanned {
            pos: Pos { line: 1, column: 1 },
            node: Node::Scalar { text: String::new(), plain: true },
        }))
    }

    fn count(&mut self, pos: Pos) -> Result<(), Diagnostic> {
        self.nodes += 1;
        if self.nodes > MAX_NODES { Err(too_many(pos)) } else { Ok(()) }
    }
}

/// The number of nodes under and including `node`.
fn size(node: &Spanned) -> usize {
    match &node.node {
        Node::Scalar { .. } => 1,
        Node::Seq(items) => 1 + items.iter().map(size).sum::<usize>(),
        Node::Map(entries) => 1 + entries.iter().map(|(_, v)| 1 + size(v)).sum::<usize>(),
    }
}

fn too_many(pos: Pos) -> Diagnostic {
    Diagnostic::new(pos, format!("the file has more than {MAX_NODES} nodes (aliases counted as what they repeat)"))
        .help("a pipeline is far smaller: look for aliases that repeat each other")
}

fn too_deep(pos: Pos) -> Diagnostic {
    Diagnostic::new(pos, format!("the file nests deeper than {MAX_DEPTH} levels"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    fn scalar(node: &Spanned) -> &str {
        node.as_str().unwrap_or("<not a scalar>")
    }

    #[test]
    fn every_node_has_its_position() {
        let doc =
            parse(b"job: a\nsteps:\n  - from: x\n  - filter: \"event.a > 1\"\n").unwrap_or_else(|e| panic!("{e:?}"));
        let map = doc.as_map().unwrap_or_default();
        assert_eq!(map.len(), 2);
        assert_eq!((map[0].0.node.as_str(), map[0].0.pos), ("job", Pos { line: 1, column: 1 }));
        assert_eq!(map[0].1.pos, Pos { line: 1, column: 6 });
        let steps = map[1].1.as_seq().unwrap_or_default();
        assert_eq!(steps[1].pos, Pos { line: 4, column: 5 });
        let filter = &steps[1].as_map().unwrap_or_default()[0].1;
        assert_eq!((scalar(filter), filter.pos), ("event.a > 1", Pos { line: 4, column: 13 }));
        assert!(matches!(filter.node, Node::Scalar { plain: false, .. }));
    }

    #[test]
    fn billion_laughs_stops_at_the_budget() {
        let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = i - 1;
            text.push_str(&format!(
                "l{i}: &l{i} [*{}, *{0}, *{0}, *{0}, *{0}, *{0}, *{0}, *{0}, *{0}, *{0}]\n",
                if prev == 0 { "a".to_string() } else { format!("l{prev}") }
            ));
        }
        let err = parse(text.as_bytes()).err().map(|e| e.message).unwrap_or_default();
        assert!(err.contains("more than 100000 nodes"), "{err}");
    }

    #[test]
    fn deep_nesting_invalid_utf8_and_duplicates_are_errors() {
        let deep = "[".repeat(100);
        let e = parse(deep.as_bytes()).err().map(|e| e.message).unwrap_or_default();
        assert!(e.contains("deeper than 64"), "{e}");
        let deeper = "[".repeat(100_000);
        let e = parse(deeper.as_bytes()).err().map(|e| e.message).unwrap_or_default();
        assert!(e.contains("deeper than 64") || e.contains("recursion limit"), "{e}");
        let e = parse(b"job: a\nname: \xff\n").err().unwrap_or_else(|| Diagnostic::new(Pos::default(), ""));
        assert_eq!((e.pos, e.message.as_str()), (Pos { line: 2, column: 7 }, "the file is not UTF-8 text"));
        let e = parse(b"job: a\njob: b\n").err().unwrap_or_else(|| Diagnostic::new(Pos::default(), ""));
        assert_eq!(
            (e.pos, e.message.as_str()),
            (Pos { line: 2, column: 1 }, "`job` is set twice in this mapping (first at 1:1)")
        );
        let e = parse(b"a: [1, 2\n").err().map(|e| e.message).unwrap_or_default();
        assert!(e.starts_with("not YAML"), "{e}");
        let e = parse(b"a: 1\n---\nb: 2\n").err().map(|e| e.message).unwrap_or_default();
        assert!(e.contains("second"), "{e}");
    }
}
