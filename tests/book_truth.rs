//! The book says what is true now: what is missing is on one page,
//! `not-yet.md`, and no other chapter (nor the README) says that something
//! is "not yet" there or "coming", or that there is "none … yet".

use std::path::Path;

/// Phrases that announce the future, and where in `text` (lowercase) the
/// first of them is, if any.
fn announces_the_future(text: &str) -> Option<&'static str> {
    let words: Vec<&str> = text.split(|c: char| !c.is_alphanumeric() && c != '\'').filter(|w| !w.is_empty()).collect();
    for (i, word) in words.iter().enumerate() {
        let next = words.get(i + 1).copied().unwrap_or_default();
        match *word {
            "not" if next == "yet" => return Some("not yet"),
            // `not supported yet`, `not implemented yet` (but `not fired
            // yet` says when, not what is missing).
            "not"
                if ["supported", "implemented", "there", "available", "built", "possible", "done"].contains(&next)
                    && words.get(i + 2) == Some(&"yet") =>
            {
                return Some("not … yet");
            }
            "coming" | "upcoming" => return Some("coming"),
            // `none … yet`, `no … yet` within a few words.
            "none" | "no" if words.iter().skip(i + 1).take(5).any(|w| *w == "yet") => return Some("none … yet"),
            _ => {}
        }
    }
    None
}

#[test]
fn only_the_not_yet_page_speaks_of_what_is_missing() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files: Vec<_> = std::fs::read_dir(root.join("book/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.push(root.join("README.md"));
    files.sort();
    let mut found = Vec::new();
    let mut read = 0;
    for path in &files {
        if path.file_name().is_some_and(|n| n == "not-yet.md") {
            continue;
        }
        read += 1;
        let text = std::fs::read_to_string(path).unwrap();
        // A sentence may run over lines: look at each paragraph.
        let mut line_no = 1;
        for paragraph in text.split("\n\n") {
            // Links to the page itself say its name.
            let paragraph_text =
                paragraph.to_lowercase().replace("[not yet](not-yet.md)", "").replace("not-yet.md", "");
            if let Some(phrase) = announces_the_future(&paragraph_text) {
                let first = paragraph.lines().next().unwrap_or_default();
                found.push(format!("{}:{line_no}: \"{phrase}\" in: {first}", path.display()));
            }
            line_no += paragraph.lines().count() + 1;
        }
    }
    assert!(read > 20, "only {read} chapters read");
    assert!(
        found.is_empty(),
        "chapters that speak of what is missing (move it to not-yet.md, or say what is true now):\n{}",
        found.join("\n")
    );
    let not_yet = std::fs::read_to_string(root.join("book/src/not-yet.md")).unwrap();
    let summary = std::fs::read_to_string(root.join("book/src/SUMMARY.md")).unwrap();
    assert!(not_yet.starts_with("# Not yet") && summary.contains("(not-yet.md)"));
}

#[test]
fn the_phrases_are_found() {
    for text in [
        "the crate holds no connector yet.",
        "these are not implemented yet",
        "connectors are coming in weibo-connectors",
        "none comes with weibo yet",
        "it is not there yet",
    ] {
        assert!(announces_the_future(text).is_some(), "{text}");
    }
    for text in ["records not committed", "nothing comes", "the yet-to-be", "none of them"] {
        assert!(announces_the_future(text).is_none(), "{text}");
    }
}
