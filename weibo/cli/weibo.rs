//! `weibo`: tools for Weibo's checkpoints and savepoints, without the
//! job's code. A binary of the `weibo` crate (feature `cli`), outside
//! `src/`: it uses the library's public API only, like any user.
//!
//! ```text
//! weibo savepoint inspect <dir> [--json]
//! weibo savepoint inspect <dir> --operator <id> [--state <name>] --key <key>
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use weibo::checkpoint::inspect::{Inspection, encode_key_text};

/// Tools for Weibo's checkpoints and savepoints.
#[derive(Parser, Debug)]
#[command(name = "weibo", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Savepoints and checkpoints.
    Savepoint {
        #[command(subcommand)]
        command: SavepointCommand,
    },
}

#[derive(Subcommand, Debug)]
enum SavepointCommand {
    /// What a savepoint (or checkpoint) holds: operators, ids, states, key
    /// types, schemas, key groups, entry counts and sizes, source positions.
    Inspect {
        /// The savepoint's or checkpoint's directory (the one with a MANIFEST).
        dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Print one key's state instead: the key as text (integers, bool,
        /// char, String keys) or its encoding in hex (`0x...`).
        #[arg(long, requires = "operator")]
        key: Option<String>,
        /// The operator whose state `--key` looks in, by id.
        #[arg(long)]
        operator: Option<String>,
        /// The state `--key` looks in (default: the operator's only one,
        /// or `value`).
        #[arg(long)]
        state: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // The whole chain: each error says what failed, its source why.
            eprint!("weibo: {e}");
            let mut cause = e.source();
            while let Some(c) = cause {
                eprint!(": {c}");
                cause = c.source();
            }
            eprintln!();
            ExitCode::FAILURE
        }
    }
}

/// Runs a command; what it prints, or the error.
fn run(cli: Cli) -> Result<String, Box<dyn std::error::Error>> {
    let Command::Savepoint { command: SavepointCommand::Inspect { dir, json, key, operator, state } } = cli.command;
    let (inspection, opened) = Inspection::open(&dir)?;
    let Some(key) = key else {
        return Ok(if json { serde_json::to_string_pretty(&inspection)? } else { inspection.to_string() });
    };
    let operator = operator.unwrap_or_default();
    let Some(op) = inspection.operators.iter().find(|o| o.id == operator) else {
        let ids: Vec<&str> = inspection.operators.iter().map(|o| o.id.as_str()).collect();
        return Err(format!("the checkpoint has no state of operator `{operator}` (it has: {})", ids.join(", ")).into());
    };
    let state = match (state, op.states.as_slice()) {
        (Some(s), _) => s,
        (None, [only]) => only.name.clone(),
        (None, _) => "value".to_string(),
    };
    let encoded = encode_key_text(op.key_type.as_deref().unwrap_or_default(), &key)?;
    match opened.key_state(&inspection, &operator, &state, &encoded)? {
        Some(found) if json => Ok(serde_json::to_string_pretty(&found)?),
        Some(found) => Ok(format!(
            "operator `{}`, state `{}`, key {key} (key group {}): {}",
            found.operator, found.state, found.key_group, found.value
        )),
        None => Err(format!("operator `{operator}` has no `{state}` for key {key}").into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("weibo").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn inspect_prints_a_savepoint_and_one_keys_state() {
        let dir = tempfile::tempdir().unwrap();
        let job = weibo::Job::new("counts").with_checkpoints(dir.path(), std::time::Duration::from_secs(60));
        job.source(weibo::sources::IterSource::new(0..10u64))
            .key_by(|x: &u64| x % 3)
            .fold(
                || (0u64, String::new()),
                |acc, x| {
                    acc.0 += x;
                    acc.1 = format!("last {x}");
                },
            )
            .uid("sums")
            .sink(weibo::sinks::Blackhole::new());
        job.run_blocking().unwrap();
        let (_, last) = weibo::checkpoint::complete_checkpoints(dir.path()).remove(0);
        let path = last.to_str().unwrap();
        let text = run(cli(&["savepoint", "inspect", path])).unwrap();
        assert!(text.contains("operator `sums`: fold, keyed by u64"), "{text}");
        assert!(text.contains("state `accumulator`: 3 entries"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&run(cli(&["savepoint", "inspect", path, "--json"])).unwrap()).unwrap();
        assert_eq!(json["operators"][0]["states"][0]["entries"], 3);
        // Key 1: 1 + 4 + 7.
        let one = run(cli(&["savepoint", "inspect", path, "--operator", "sums", "--key", "1"])).unwrap();
        assert!(one.ends_with("[12,\"last 7\"]"), "{one}");
        let err = run(cli(&["savepoint", "inspect", path, "--operator", "sums", "--key", "x"])).unwrap_err();
        assert!(err.to_string().contains("`x` is not a key of type `u64`"), "{err}");
        let err = run(cli(&["savepoint", "inspect", "/nonexistent/weibo"])).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/weibo"), "{err}");
    }
}
