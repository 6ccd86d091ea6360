//! The book's code comes from compiled examples: every `{{#include}}` in
//! `book/src` must name an existing file and, if given, an existing anchor,
//! and every snippet shows its imports.

use std::path::Path;

#[test]
fn every_book_include_names_an_existing_file_and_anchor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../book/src");
    let mut checked = 0;
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (line_no, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(start) = rest.find("{{#include ") {
                let after = &rest[start + "{{#include ".len()..];
                let Some(end) = after.find("}}") else { break };
                let spec = after[..end].trim();
                rest = &after[end..];
                checked += 1;
                let (file, anchor) = match spec.split_once(':') {
                    Some((f, a)) => (f, Some(a)),
                    None => (spec, None),
                };
                let target = path.parent().unwrap().join(file);
                let where_ = format!("{}:{}", path.display(), line_no + 1);
                let Ok(body) = std::fs::read_to_string(&target) else {
                    problems.push(format!("{where_}: no file {}", target.display()));
                    continue;
                };
                if let Some(anchor) = anchor.filter(|a| a.parse::<usize>().is_err() && !a.contains(':')) {
                    let open = format!("ANCHOR: {anchor}");
                    let close = format!("ANCHOR_END: {anchor}");
                    if !body.lines().any(|l| l.trim_end().ends_with(&open))
                        || !body.lines().any(|l| l.trim_end().ends_with(&close))
                    {
                        problems.push(format!("{where_}: {} has no anchor `{anchor}`", target.display()));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "broken includes:\n{}", problems.join("\n"));
    assert!(checked > 0, "the book includes no compiled code at all");
}

/// Every Rust snippet of the book is compiled code with its imports in
/// view: a ```rust block includes from an example, and from an example
/// with an `imports` anchor it shows that anchor first. No snippet is
/// `ignore`d or written by hand.
#[test]
fn every_book_snippet_is_compiled_code_with_its_imports() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../book/src");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut problems = Vec::new();
    let mut snippets = 0;
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let fence = lines[i];
            if !fence.starts_with("```rust") {
                i += 1;
                continue;
            }
            let start = i + 1;
            let mut end = start;
            while end < lines.len() && !lines[end].starts_with("```") {
                end += 1;
            }
            let block = &lines[start..end];
            let where_ = format!("{}:{}", path.display(), i + 1);
            snippets += 1;
            if fence.contains("ignore") {
                problems.push(format!("{where_}: an ignored snippet (make it an example's anchor)"));
            }
            // From an example, or a test (which the suite compiles too).
            let included: Vec<(&str, &str)> = block
                .iter()
                .filter_map(|l| l.trim().strip_prefix("{{#include ../../")?.strip_suffix("}}")?.split_once(':'))
                .collect();
            match included.first() {
                None => problems.push(format!("{where_}: a snippet written by hand (include it from an example)")),
                Some((file, anchor)) => {
                    let example = file.strip_prefix("examples/").map(|f| examples.join(f));
                    let body = example.and_then(|f| std::fs::read_to_string(f).ok()).unwrap_or_default();
                    if body.contains("// ANCHOR: imports") && *anchor != "imports" {
                        problems.push(format!(
                            "{where_}: shows {file} without its imports (include `{file}:imports` first)"
                        ));
                    }
                }
            }
            i = end + 1;
        }
    }
    assert!(snippets > 100, "only {snippets} snippets found");
    assert!(problems.is_empty(), "{} snippets:\n{}", problems.len(), problems.join("\n"));
}
