//! No test file silently stops existing: every `tests/*.rs` is a `[[test]]`
//! target of `tests/Cargo.toml`, the helpers' library (`lib.rs`), or a
//! helper module a target includes (`#[path = "…"] mod …;`); and every
//! target's file exists.

use std::collections::BTreeSet;
use std::path::Path;

#[test]
fn every_test_file_is_built() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let mut targets = BTreeSet::new();
    let mut in_test = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_test = line == "[[test]]";
        } else if in_test && let Some(path) = line.strip_prefix("path = \"").and_then(|p| p.strip_suffix('"')) {
            targets.insert(path.to_string());
        }
    }
    let files: BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .collect();
    // What the targets include as modules of their own.
    let mut included = BTreeSet::new();
    for target in &targets {
        let text = std::fs::read_to_string(dir.join(target)).unwrap_or_default();
        for line in text.lines() {
            if let Some(path) = line.trim().strip_prefix("#[path = \"").and_then(|p| p.split('"').next()) {
                included.insert(path.to_string());
            }
        }
    }
    let missing: Vec<&String> = targets.iter().filter(|t| !files.contains(*t)).collect();
    assert!(missing.is_empty(), "targets in tests/Cargo.toml without a file: {missing:?}");
    let unbuilt: Vec<&String> =
        files.iter().filter(|f| *f != "lib.rs" && !targets.contains(*f) && !included.contains(*f)).collect();
    assert!(
        unbuilt.is_empty(),
        "tests/*.rs files that nothing builds (add a [[test]] target to tests/Cargo.toml, or include the module \
         from one): {unbuilt:?}"
    );
    assert!(targets.len() > 40, "only {} targets read from tests/Cargo.toml", targets.len());
}
