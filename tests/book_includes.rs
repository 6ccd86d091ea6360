//! The book's code comes from compiled examples: every `{{#include}}` in
//! `book/src` must name an existing file and, if given, an existing anchor.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, missing_docs)]

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
