//! Compile-fail tests live in `fail/` (each with the `.stderr` it must
//! produce) and compile-pass tests in `pass/`; `ui.rs` runs them. Run with
//! `TRYBUILD=overwrite` to refresh the `.stderr` files after an intended
//! change of message, and review the diff.
