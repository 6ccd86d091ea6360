//! The test package's layout, which nothing else would check:
//!
//! - every `tests/*.rs` is a `[[test]]` target of `tests/Cargo.toml` (a
//!   file that is none is never compiled nor run), and every target's file
//!   exists;
//! - helpers are shared one way, as modules of the package's library
//!   (`tests/support/`, `weibo_tests`): no `tests/*.rs` includes a file
//!   with a `path` attribute;
//! - every `tests/support/*.rs` is a module of that library (`support/lib.rs`
//!   declares it), or it would silently not compile.

use std::collections::BTreeSet;
use std::path::Path;

/// The attribute that includes a file as a module (spelled in two pieces,
/// so that this file does not contain it).
const PATH_ATTRIBUTE: &str = concat!("#[", "path");

fn dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The names of the `.rs` files directly in `dir`.
fn rust_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The `path`s of a manifest's sections named `section` (`[[test]]`,
/// `[lib]`).
fn paths_in(manifest: &str, section: &str) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == section;
        } else if inside
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "path"
        {
            paths.insert(value.trim().trim_matches('"').to_string());
        }
    }
    paths
}

/// The modules a library root declares as files of its directory (`mod
/// name;`, with any visibility, and no `path` attribute that takes the
/// file from elsewhere).
fn file_modules(lib: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    let mut elsewhere = false;
    for line in lib.lines().map(str::trim) {
        let declared = line
            .strip_prefix("pub ")
            .or_else(|| line.strip_prefix("pub(crate) "))
            .unwrap_or(line)
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'));
        if let Some(name) = declared
            && !elsewhere
        {
            modules.insert(name.trim().to_string());
        }
        if !line.starts_with("#[") {
            elsewhere = false;
        }
        if line.starts_with(PATH_ATTRIBUTE) {
            elsewhere = true;
        }
    }
    modules
}

/// What is wrong with the targets: `tests/*.rs` files no target builds,
/// and targets whose file is missing.
fn target_problems(files: &BTreeSet<String>, targets: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let unbuilt = files.difference(targets).cloned().collect();
    let missing = targets.difference(files).cloned().collect();
    (unbuilt, missing)
}

/// The support files (`*.rs` but the library root) `modules` does not
/// declare.
fn undeclared(support: &BTreeSet<String>, modules: &BTreeSet<String>) -> Vec<String> {
    support.iter().filter(|f| *f != "lib.rs" && !modules.contains(f.trim_end_matches(".rs"))).cloned().collect()
}

#[test]
fn every_test_file_is_a_target_and_every_target_a_file() {
    let manifest = read(&dir().join("Cargo.toml"));
    let targets = paths_in(&manifest, "[[test]]");
    assert!(targets.len() > 40, "only {} targets read from tests/Cargo.toml", targets.len());
    let (unbuilt, missing) = target_problems(&rust_files(dir()), &targets);
    assert!(
        unbuilt.is_empty(),
        "tests/*.rs files that nothing builds (add a [[test]] target to tests/Cargo.toml, or move a helper into \
         tests/support/): {unbuilt:?}"
    );
    assert!(missing.is_empty(), "targets in tests/Cargo.toml without a file: {missing:?}");
}

#[test]
fn no_test_file_includes_a_helper_by_path() {
    let including: Vec<String> =
        rust_files(dir()).into_iter().filter(|f| read(&dir().join(f)).contains(PATH_ATTRIBUTE)).collect();
    assert!(
        including.is_empty(),
        "tests/*.rs files that include a file by a path attribute (make it a module of tests/support/ and use it \
         as `weibo_tests::…`): {including:?}"
    );
}

#[test]
fn every_support_file_is_a_module_of_the_library() {
    let manifest = read(&dir().join("Cargo.toml"));
    assert_eq!(
        paths_in(&manifest, "[lib]"),
        BTreeSet::from(["support/lib.rs".to_string()]),
        "the package's library is tests/support/lib.rs"
    );
    let support = dir().join("support");
    let modules = file_modules(&read(&support.join("lib.rs")));
    let files = rust_files(&support);
    assert!(files.len() > 5, "only {} files read from tests/support/", files.len());
    let undeclared = undeclared(&files, &modules);
    assert!(
        undeclared.is_empty(),
        "tests/support/*.rs files that tests/support/lib.rs does not declare (`pub mod name;`), so nothing \
         compiles them: {undeclared:?}"
    );
}

/// The checks above find what they look for (each would pass on anything
/// if its parsing found nothing).
#[test]
fn the_checks_name_what_is_wrong() {
    let manifest = "[lib]\npath = \"support/lib.rs\"\n\n[[test]]\nname = \"a\"\npath = \"a.rs\"\n\n[[test]]\n\
                    name = \"gone\"\npath = \"gone.rs\"\n\n[dependencies]\npath = \"not-a-target.rs\"\n";
    let targets = paths_in(manifest, "[[test]]");
    assert_eq!(targets, BTreeSet::from(["a.rs".to_string(), "gone.rs".to_string()]));
    let files = BTreeSet::from(["a.rs".to_string(), "stray.rs".to_string()]);
    assert_eq!(target_problems(&files, &targets), (vec!["stray.rs".to_string()], vec!["gone.rs".to_string()]));

    let lib = format!(
        "//! mod commented;\npub mod crash;\nmod private;\n{PATH_ATTRIBUTE} = \"../elsewhere.rs\"]\n\
         #[allow(dead_code)]\nmod elsewhere;\npub mod inline {{\n}}\n"
    );
    let modules = file_modules(&lib);
    assert_eq!(modules, BTreeSet::from(["crash".to_string(), "private".to_string()]));
    let support: BTreeSet<String> =
        ["lib.rs", "crash.rs", "private.rs", "elsewhere.rs", "forgotten.rs"].map(String::from).into();
    assert_eq!(undeclared(&support, &modules), vec!["elsewhere.rs".to_string(), "forgotten.rs".to_string()]);
}
