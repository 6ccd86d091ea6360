//! Keeps `weibo/src` layered: every module may name only the layers below
//! it (`crate::…` paths in code, `use` lines or inline), and no two layers
//! name each other. The layers and what each may import are written down
//! in the book's design notes (`book/src/design-notes.md`, "Layers"); this
//! table is the same list. A failure names the file and line.
//!
//! To fix a failure, move the code, not the rule: a type both layers need
//! goes down to the lower one (or to the foundation), and a call upwards
//! becomes a trait the lower layer defines and the upper one implements.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layers from the bottom up. A module may name modules of a lower rank;
/// modules of the same rank may not name each other. The foundation (rank
/// 0) is the vocabulary every layer shares.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("record", 0),
    ("metrics", 0),
    ("codec", 0),
    ("task", 0),
    ("state", 2),
    ("time", 2),
    ("checkpoint", 3),
    ("sources", 4),
    ("sinks", 4),
    ("operator", 5),
    ("graph", 6),
    ("runtime", 7),
    ("stream", 8),
    ("testing", 9),
    // Re-exports only: what a pipeline needs, in one import.
    ("prelude", 10),
];

fn rank(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../weibo/src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to: `state/fjall.rs` → `state`,
/// `error.rs` → `error`; `None` for the crate root.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_string_lossy().into_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib").then_some(name)
}

/// The code of a line, without its comment and string literals (doc
/// comments link to other layers freely).
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut in_str = false;
    let line = line.replace("'\"'", "' '");
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_str => {
                chars.next();
            }
            '"' => in_str = !in_str,
            '/' if !in_str && chars.peek() == Some(&'/') => break,
            _ if !in_str => out.push(c),
            _ => {}
        }
    }
    out
}

/// Every `crate::<module>` a line names, including those in a `use
/// crate::{a, b::c}` group.
fn named_modules(code: &str, open_group: &mut bool) -> Vec<String> {
    let mut out = Vec::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut rest = code;
    if *open_group {
        // Inside a multi-line `use crate::{` group: every path that starts
        // a line names a module.
        let trimmed = code.trim_start();
        let first = ident(trimmed);
        if !first.is_empty() && first != "self" {
            out.push(first);
        }
        if code.contains("};") {
            *open_group = false;
        }
    }
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
            continue; // `$crate::`, `weibo_crate::`, `::crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            for part in group.split(',') {
                let name = ident(part.trim_start());
                if !name.is_empty() {
                    out.push(name);
                }
            }
            if !group.contains('}') {
                *open_group = true;
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

struct Import {
    from: String,
    to: String,
    at: String,
}

/// The macros a module exports (`#[macro_export]`), by name: Rust puts
/// them at the crate root (`crate::name!`), but they belong to the layer
/// of the module that defines them.
fn exported_macros(root: &Path, files: &[PathBuf]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for file in files {
        let Some(module) = module_of(file.strip_prefix(root).unwrap()) else { continue };
        let text = std::fs::read_to_string(file).unwrap();
        let mut exported = false;
        for line in text.lines().map(str::trim) {
            if line == "#[macro_export]" {
                exported = true;
            } else if let Some(rest) = line.strip_prefix("macro_rules!").filter(|_| exported) {
                let name: String = rest.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.insert(name, module.clone());
                exported = false;
            } else if !line.starts_with("#[") && !line.starts_with("///") {
                exported = false;
            }
        }
    }
    out
}

fn imports() -> Vec<Import> {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    let macros = exported_macros(&root, &files);
    assert!(macros.contains_key("internal_error"), "the exported macros were not found: {macros:?}");
    let mut out = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&root).unwrap().to_path_buf();
        let Some(from) = module_of(&relative) else { continue };
        let text = std::fs::read_to_string(&file).unwrap();
        let mut open_group = false;
        for (i, line) in text.lines().enumerate() {
            let code = code_of(line);
            for to in named_modules(&code, &mut open_group) {
                let to = macros.get(&to).cloned().unwrap_or(to);
                if to != from {
                    out.push(Import {
                        from: from.clone(),
                        to,
                        at: format!("weibo/src/{}:{}", relative.display(), i + 1),
                    });
                }
            }
        }
    }
    out
}

#[test]
fn every_module_belongs_to_a_layer() {
    let root = src();
    let mut unknown = BTreeSet::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        let Some(module) = module_of(Path::new(path.file_name().unwrap())) else { continue };
        if rank(&module).is_none() {
            unknown.insert(module);
        }
    }
    assert!(
        unknown.is_empty(),
        "modules without a layer in tests/architecture.rs (and the book's design notes): {unknown:?}"
    );
}

#[test]
fn imports_run_downwards() {
    let mut wrong = Vec::new();
    for import in imports() {
        let (Some(from), Some(to)) = (rank(&import.from), rank(&import.to)) else {
            wrong.push(format!("{}: `{}` names `crate::{}`, which is not a layer", import.at, import.from, import.to));
            continue;
        };
        if from == 0 && to == 0 {
            continue; // the foundation's files may share their vocabulary
        }
        if to >= from {
            wrong.push(format!(
                "{}: `{}` (layer {from}) imports `crate::{}` (layer {to}); a layer may import only layers below it",
                import.at, import.from, import.to
            ));
        }
    }
    assert!(wrong.is_empty(), "{} imports against the layers:\n{}", wrong.len(), wrong.join("\n"));
}

#[test]
fn no_two_modules_import_each_other() {
    let mut edges: BTreeMap<(String, String), String> = BTreeMap::new();
    for import in imports() {
        edges.entry((import.from, import.to)).or_insert(import.at);
    }
    let mut circles = Vec::new();
    for ((a, b), at) in &edges {
        if a < b
            && let Some(back) = edges.get(&(b.clone(), a.clone()))
        {
            circles.push(format!("`{a}` and `{b}` import each other ({at} and {back})"));
        }
    }
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

#[test]
fn the_checker_sees_imports() {
    // The parser must find what it is meant to find, or the tests above
    // would pass on anything.
    let mut open = false;
    assert_eq!(named_modules("use crate::state::ValueStore;", &mut open), ["state"]);
    assert_eq!(named_modules("use crate::{graph::Node, runtime};", &mut open), ["graph", "runtime"]);
    assert_eq!(named_modules("let x = crate::task::blocking(|| 1); // crate::stream", &mut open), ["task", "stream"]);
    assert_eq!(
        code_of("let x = crate::task::blocking(|| 1); // crate::stream"),
        "let x = crate::task::blocking(|| 1); "
    );
    assert!(named_modules("macro_rules! m { () => { $crate::x } }", &mut open).is_empty());
    assert_eq!(named_modules("use crate::{", &mut open), Vec::<String>::new());
    assert!(open);
    assert_eq!(named_modules("    checkpoint::Restore,", &mut open), ["checkpoint"]);
    assert_eq!(named_modules("};", &mut open), Vec::<String>::new());
    assert!(!open);
    assert!(!imports().is_empty());
}
