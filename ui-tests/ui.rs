//! Runs the compile-fail and compile-pass cases.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("fail/*.rs");
    t.pass("pass/*.rs");
}
