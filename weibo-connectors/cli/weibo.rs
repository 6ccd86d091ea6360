//! `weibo`: pipelines in YAML, and tools for Weibo's jobs, checkpoints and
//! savepoints, without the job's code. A binary of the `weibo-connectors`
//! crate (feature `cli`, with every connector), outside `src/`: it uses
//! the library's public API only, like any user.
//!
//! ```text
//! weibo validate <file>...
//! weibo test <file-or-dir>...
//! weibo plan <file>
//! weibo run <file> [--admin <addr>] [--restore-from <dir>]
//! weibo status <url> [--token <token>] [--json]
//! weibo savepoint <url> <name> [--token <token>]
//! weibo stop <url> [--savepoint <name>] [--token <token>]
//! weibo checkpoint list <dir> [--json]
//! weibo checkpoint inspect <dir> [--json]
//! weibo checkpoint inspect <dir> --operator <id> [--state <name>] --key <key>
//! weibo checkpoint verify <dir>
//! weibo savepoint inspect <dir> ...      (as `checkpoint inspect`)
//! weibo serve [--dir <dir>] [--listen <addr>]
//! weibo jobs [--server <url>] list [--json]
//! weibo jobs submit <name> --yaml <file> [--admin <addr>] [--env K=V]...
//! weibo jobs submit <name> [--admin <url>] [--env K=V]... -- <program> [<arg>...]
//! weibo jobs status <name> [--json]
//! weibo jobs start|cancel|remove <name>
//! weibo jobs stop <name> [--savepoint <name>]
//! weibo jobs upgrade <name> [--savepoint <name>] [--yaml <file>]
//! weibo jobs savepoint <name> <savepoint>
//! weibo jobs logs <name> [--lines <n>]
//! ```
//!
//! A checkpoint `<dir>` may be a URL, `s3://<bucket>/<path>`, with
//! credentials, region and endpoint from the `AWS_*` variables
//! (`AWS_ENDPOINT` and `AWS_ALLOW_HTTP=true` for a local server).
//!
//! Exit codes: 0 when the command did what it says; 1 when it could not
//! (a pipeline file with errors, a job that failed, the job's admin API
//! refused or could not be reached, a checkpoint is missing or damaged);
//! 2 for a command line it does not understand.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};
use weibo::checkpoint::CheckpointStorage;
use weibo::checkpoint::inspect::{Inspection, encode_key_text};
use weibo_connectors::yaml::{Pipeline, TestFile};

/// Tools for Weibo's jobs (through their admin API), checkpoints and
/// savepoints.
#[derive(Parser, Debug)]
#[command(
    name = "weibo",
    version,
    after_help = "Examples:\n  \
        weibo validate pipelines/*.yaml\n  \
        weibo test pipelines/\n  \
        weibo plan clicks.yaml\n  \
        weibo run clicks.yaml --admin 127.0.0.1:9090\n  \
        weibo status http://127.0.0.1:9090\n  \
        WEIBO_ADMIN_TOKEN=secret weibo savepoint http://127.0.0.1:9090 before-upgrade\n  \
        weibo stop http://127.0.0.1:9090 --savepoint v2\n  \
        weibo checkpoint list ./checkpoints\n  \
        weibo checkpoint verify ./checkpoints/savepoints/v2\n  \
        weibo checkpoint inspect ./checkpoints/chk-00000000000000000007 --operator totals --key 42\n  \
        weibo serve --dir /var/lib/weibo --listen 127.0.0.1:7070\n  \
        weibo jobs submit clicks --yaml clicks.yaml --admin 127.0.0.1:9101\n  \
        weibo jobs list\n  \
        weibo jobs stop clicks --savepoint before-upgrade\n  \
        AWS_REGION=eu-west-1 weibo checkpoint list s3://my-bucket/jobs/orders"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Checks pipeline files without running them: every problem, each at
    /// its line and column. Exit code 0 when all are valid, 1 otherwise.
    Validate {
        /// The pipeline files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Runs the tests of pipeline files (`*_test.yaml`: input records
    /// and watermarks, the records each sink must get) without any
    /// service. Exit code 0 when every case passes, 1 otherwise.
    Test {
        /// Test files, or folders to find `*_test.yaml` files in.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// A pipeline file's graph and execution plan (operators, chains,
    /// edges, partitions), without running it.
    Plan {
        /// The pipeline file.
        file: PathBuf,
    },
    /// Runs a pipeline file until its sources end (or the job is stopped
    /// through its admin API), then prints its metrics.
    Run {
        /// The pipeline file.
        file: PathBuf,
        /// Serve the job's admin API and dashboard at this address
        /// (`host:port`); its token from `WEIBO_ADMIN_TOKEN`.
        #[arg(long)]
        admin: Option<String>,
        /// Start from this checkpoint or savepoint (default:
        /// `WEIBO_RESTORE_FROM`, which `weibo serve` sets after an upgrade).
        #[arg(long)]
        restore_from: Option<PathBuf>,
    },
    /// A running job's state, from its admin API (`GET /api/job`).
    Status {
        /// The job's admin API: `http://host:port` (or `https://`).
        url: String,
        #[command(flatten)]
        auth: Auth,
        /// Print the API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Takes a savepoint of a running job (`weibo savepoint <url> <name>`,
    /// through its admin API), or prints what one holds (`weibo savepoint
    /// inspect <dir>`).
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Savepoint {
        #[command(subcommand)]
        command: Option<SavepointCommand>,
        /// The job's admin API: `http://host:port` (or `https://`).
        #[arg(required = true)]
        url: Option<String>,
        /// The savepoint's name (letters, digits, `-`, `_`, `.`).
        #[arg(required = true)]
        name: Option<String>,
        #[command(flatten)]
        auth: Auth,
    },
    /// Stops a running job with a last checkpoint (or savepoint `--savepoint
    /// <name>`), through its admin API, and waits for it to end.
    Stop {
        /// The job's admin API: `http://host:port` (or `https://`).
        url: String,
        /// Make the last checkpoint savepoint `<name>` (the stop is refused
        /// when it cannot be taken).
        #[arg(long)]
        savepoint: Option<String>,
        #[command(flatten)]
        auth: Auth,
    },
    /// A job's checkpoints and savepoints on disk.
    Checkpoint {
        #[command(subcommand)]
        command: CheckpointCommand,
    },
    /// Runs the control plane for this machine: a registry of jobs in
    /// `--dir`, each run as a supervised process (restarted with a backoff
    /// when it dies, failed after a crash loop), and its API on `--listen`
    /// (its token from `WEIBO_ADMIN_TOKEN`; loopback without one). Jobs
    /// outlive it; started again, it adopts those still running.
    Serve {
        /// The registry's directory.
        #[arg(long, default_value = "weibo-jobs")]
        dir: PathBuf,
        /// The API's address.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: String,
    },
    /// The jobs of a control plane (`weibo serve`), through its API.
    Jobs {
        /// The control plane's API (default: `WEIBO_SERVER`, else
        /// http://127.0.0.1:7070).
        #[arg(long, global = true)]
        server: Option<String>,
        #[command(flatten)]
        auth: Auth,
        #[command(subcommand)]
        command: JobsCommand,
    },
}

#[derive(Subcommand, Debug)]
enum JobsCommand {
    /// Every job, its phase and restarts.
    List {
        /// Print the API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Registers a job and starts it: a pipeline file (`--yaml`, run by
    /// this `weibo`), or a program and its arguments after `--`.
    Submit {
        /// The job's name.
        name: String,
        /// The pipeline file.
        #[arg(long, conflicts_with = "program")]
        yaml: Option<PathBuf>,
        /// The job's admin API: for `--yaml`, the address it is served on
        /// (`127.0.0.1:9101`); for a program, the URL it serves it at.
        /// Stops and savepoints go through it.
        #[arg(long)]
        admin: Option<String>,
        /// A variable for the job's process (`NAME=value`), repeatable.
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Restarts allowed within the window before the job is failed.
        #[arg(long)]
        max_restarts: Option<u32>,
        /// The program and its arguments.
        #[arg(last = true, id = "program")]
        program: Vec<String>,
    },
    /// A job's spec, phase, restarts and latest events.
    Status {
        /// The job.
        name: String,
        /// Print the API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Starts a job that is stopped, finished, failed or cancelled.
    Start {
        /// The job.
        name: String,
    },
    /// Stops a job through its admin API with a last checkpoint (or
    /// savepoint `--savepoint`; refused, the job running on, when it cannot
    /// be taken), and waits until its process has ended.
    Stop {
        /// The job.
        name: String,
        /// The savepoint's name.
        #[arg(long)]
        savepoint: Option<String>,
    },
    /// Upgrades a job: stops it with savepoint `--savepoint` and starts it
    /// from it (or, without, from its last checkpoint), as a new pipeline
    /// file (`--yaml`) when given; the old version runs on when the
    /// savepoint cannot be taken. Waits until the new version runs.
    Upgrade {
        /// The job.
        name: String,
        /// The savepoint to stop with and start from.
        #[arg(long)]
        savepoint: Option<String>,
        /// The new pipeline file, for a YAML job.
        #[arg(long)]
        yaml: Option<PathBuf>,
    },
    /// Takes a savepoint of a running job, which runs on.
    Savepoint {
        /// The job.
        name: String,
        /// The savepoint's name.
        savepoint: String,
    },
    /// Kills a job's process, without a checkpoint.
    Cancel {
        /// The job.
        name: String,
    },
    /// Removes a job that does not run from the registry.
    Remove {
        /// The job.
        name: String,
    },
    /// The last lines of a job's output.
    Logs {
        /// The job.
        name: String,
        /// How many.
        #[arg(long, default_value_t = 100)]
        lines: usize,
    },
}

/// The admin API's token.
#[derive(Args, Debug)]
struct Auth {
    /// The admin API's bearer token (default: the `WEIBO_ADMIN_TOKEN`
    /// environment variable; never printed).
    #[arg(long)]
    token: Option<String>,
}

impl Auth {
    fn token(&self) -> Option<String> {
        self.token.clone().or_else(|| std::env::var("WEIBO_ADMIN_TOKEN").ok().filter(|t| !t.is_empty()))
    }
}

#[derive(Subcommand, Debug)]
enum SavepointCommand {
    /// What a savepoint (or checkpoint) holds: as `weibo checkpoint inspect`.
    Inspect(InspectArgs),
}

#[derive(Subcommand, Debug)]
enum CheckpointCommand {
    /// The complete checkpoints in a job's checkpoint directory, oldest
    /// first, then its savepoints by name.
    List {
        /// The job's checkpoint directory (`Job::with_checkpoints`), or its
        /// storage's URL (`s3://bucket/prefix`).
        dir: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// What a checkpoint (or savepoint) holds: operators, ids, states, key
    /// types, schemas, key groups, entry counts and sizes, source positions;
    /// or one key's state.
    Inspect(InspectArgs),
    /// Reads every file of a checkpoint (or savepoint) and checks it: its
    /// manifest, each state file's checksum and entries. Exit code 0 when
    /// it is whole, 1 (with the file that is not) otherwise.
    Verify {
        /// The checkpoint's or savepoint's directory (the one with a
        /// MANIFEST), or its URL (`s3://bucket/prefix/chk-7`).
        dir: String,
    },
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// The checkpoint's or savepoint's directory (the one with a MANIFEST),
    /// or its URL (`s3://bucket/prefix/savepoints/v2`).
    dir: String,
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
    /// The state `--key` looks in (default: the operator's only one, or
    /// `value`).
    #[arg(long)]
    state: Option<String>,
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

type Failure = Box<dyn std::error::Error>;

/// Runs a command; what it prints, or the error.
fn run(cli: Cli) -> Result<String, Failure> {
    match cli.command {
        Command::Validate { files } => {
            let mut bad = 0;
            let mut out = Vec::new();
            for file in &files {
                match Pipeline::from_file(file) {
                    Ok(p) => out.push(format!(
                        "{}: valid (job `{}`, {} steps)",
                        file.display(),
                        p.spec().job,
                        p.spec().steps.len() + 1
                    )),
                    Err(errors) => {
                        bad += 1;
                        eprintln!("{errors}");
                        out.push(format!("{}: {} error(s)", file.display(), errors.diagnostics.len()));
                    }
                }
            }
            if bad > 0 {
                return Err(
                    format!("{bad} of {} pipeline file(s) are not valid:\n{}", files.len(), out.join("\n")).into()
                );
            }
            Ok(out.join("\n"))
        }
        Command::Test { paths } => {
            let mut files = Vec::new();
            for p in &paths {
                if p.is_dir() {
                    test_files_in(p, &mut files)?;
                } else {
                    files.push(p.clone());
                }
            }
            files.sort();
            if files.is_empty() {
                return Err(format!(
                    "no *_test.yaml file in {}",
                    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                )
                .into());
            }
            let (mut passed, mut failed) = (0, 0);
            for file in &files {
                let report = match TestFile::from_file(file) {
                    Ok(tests) => tests.run()?,
                    Err(errors) => {
                        eprintln!("{errors}");
                        failed += 1;
                        continue;
                    }
                };
                println!("{report}");
                let bad = report.cases.iter().filter(|(_, p)| !p.is_empty()).count();
                failed += bad;
                passed += report.cases.len() - bad;
            }
            if failed > 0 {
                return Err(format!("{failed} test(s) failed, {passed} passed").into());
            }
            Ok(format!("{passed} test(s) passed"))
        }
        Command::Plan { file } => {
            let job = pipeline(&file)?.job()?;
            Ok(format!("{job}\n{}", job.plan()?))
        }
        Command::Run { file, admin, restore_from } => {
            let mut job = pipeline(&file)?.job()?;
            if let Some(addr) = admin {
                job = job.with_admin(addr);
                if let Ok(token) = std::env::var("WEIBO_ADMIN_TOKEN")
                    && !token.is_empty()
                {
                    job = job.with_admin_token(token);
                }
            }
            // `weibo serve` names the savepoint an upgraded job starts from.
            let restore_from = restore_from
                .or_else(|| std::env::var_os("WEIBO_RESTORE_FROM").filter(|p| !p.is_empty()).map(PathBuf::from));
            if let Some(dir) = restore_from {
                job = job.restore_from(dir);
            }
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let report = runtime.block_on(job.run())?;
            Ok(format!("{}", report.metrics))
        }
        Command::Status { url, auth, json } => {
            let job = call(&url, "GET", "/api/job", auth.token().as_deref(), None)?;
            if !field(&job, "job").is_string() || !field(&job, "status").is_object() {
                return Err(format!("{url} does not answer as a Weibo job's admin API: {job}").into());
            }
            Ok(if json { serde_json::to_string_pretty(&job)? } else { status_text(&job) })
        }
        Command::Savepoint { command: Some(SavepointCommand::Inspect(args)), .. } => inspect(args),
        Command::Savepoint { command: None, url: Some(url), name: Some(name), auth } => {
            let taken = call(&url, "POST", "/api/savepoints", auth.token().as_deref(), Some(json!({ "name": name })))?;
            Ok(format!("savepoint `{name}` written to {}", text(field(&taken, "path"))))
        }
        Command::Savepoint { .. } => {
            Err("`weibo savepoint` takes a job's admin API and a name, or `inspect <dir>`".into())
        }
        Command::Stop { url, savepoint, auth } => {
            let body = savepoint.map_or_else(|| json!({}), |name| json!({ "savepoint": name }));
            let stopped = call(&url, "POST", "/api/stop", auth.token().as_deref(), Some(body))?;
            Ok(match field(&stopped, "checkpoint").as_str() {
                Some(path) => {
                    format!("job stopped ({}), its last checkpoint at {path}", state_text(field(&stopped, "status")))
                }
                None => format!("job stopped ({}), without a last checkpoint", state_text(field(&stopped, "status"))),
            })
        }
        Command::Serve { dir, listen } => serve(dir, &listen),
        Command::Jobs { server, auth, command } => {
            let server = server
                .or_else(|| std::env::var("WEIBO_SERVER").ok().filter(|s| !s.is_empty()))
                .unwrap_or_else(|| "http://127.0.0.1:7070".into());
            jobs(&server, auth.token().as_deref(), command)
        }
        Command::Checkpoint { command: CheckpointCommand::List { dir, json } } => list(&dir, json),
        Command::Checkpoint { command: CheckpointCommand::Inspect(args) } => inspect(args),
        Command::Checkpoint { command: CheckpointCommand::Verify { dir } } => {
            let (inspection, _) = open_checkpoint(&dir)?;
            let states: usize = inspection.operators.iter().map(|o| o.states.len()).sum();
            let entries: u64 = inspection.operators.iter().flat_map(|o| &o.states).map(|s| s.entries).sum();
            Ok(format!(
                "{}: checkpoint {} of job `{}` is whole: {} operators, {states} states, {entries} entries, {} source positions",
                inspection.path.display(),
                inspection.checkpoint,
                inspection.job,
                inspection.operators.len(),
                inspection.sources.len()
            ))
        }
    }
}

/// `weibo serve`: the control plane in `dir`, its API on `listen`, until
/// the process is ended (its jobs run on).
fn serve(dir: PathBuf, listen: &str) -> Result<String, Failure> {
    use weibo_connectors::control::{ControlPlane, routes};
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let plane = ControlPlane::open(&dir)?;
        let mut options = weibo::AdminOptions::new(listen);
        if let Ok(token) = std::env::var("WEIBO_ADMIN_TOKEN")
            && !token.is_empty()
        {
            options = options.with_token(token);
        }
        let service = weibo::AdminService::serve("weibo-serve", &options, routes(plane.clone()))?;
        println!(
            "weibo serve: {} jobs in {}, API on http://{}",
            plane.list().len(),
            dir.display(),
            service.local_addr()
        );
        use std::io::Write as _;
        std::io::stdout().flush()?;
        std::future::pending::<()>().await;
        Ok::<_, Failure>(String::new())
    })
}

/// `weibo jobs …` against the control plane at `server`.
fn jobs(server: &str, token: Option<&str>, command: JobsCommand) -> Result<String, Failure> {
    let line = |job: &Value| {
        let status = field(job, "status");
        let pid = field(status, "pid").as_u64().map_or_else(String::new, |p| format!(", process {p}"));
        format!(
            "{}: {} ({}), {} restarts{pid}",
            text(field(job, "name")),
            text(field(status, "phase")),
            text(field(status, "reason")),
            field(status, "restarts").as_u64().unwrap_or(0)
        )
    };
    let path = |name: &str, rest: &str| format!("/api/jobs/{}{rest}", percent(name));
    match command {
        JobsCommand::List { json } => {
            let all = call(server, "GET", "/api/jobs", token, None)?;
            if json {
                return Ok(serde_json::to_string_pretty(&all)?);
            }
            let jobs = field(&all, "jobs").as_array().cloned().unwrap_or_default();
            if jobs.is_empty() {
                return Ok("no jobs".into());
            }
            Ok(jobs.iter().map(line).collect::<Vec<_>>().join("\n"))
        }
        JobsCommand::Submit { name, yaml, admin, env, max_restarts, program } => {
            let mut spec_env = serde_json::Map::new();
            for pair in env {
                let Some((k, v)) = pair.split_once('=') else {
                    return Err(format!("`--env {pair}`: write NAME=value").into());
                };
                spec_env.insert(k.to_string(), json!(v));
            }
            let (command, admin_url) = match (yaml, program.is_empty()) {
                (Some(file), true) => {
                    let file = std::fs::canonicalize(&file).map_err(|e| format!("{}: {e}", file.display()))?;
                    pipeline(&file)?;
                    let me = std::env::current_exe()?;
                    let mut command = vec![me.display().to_string(), "run".into(), file.display().to_string()];
                    if let Some(addr) = &admin {
                        command.extend(["--admin".to_string(), addr.clone()]);
                    }
                    (command, admin.map(|a| format!("http://{a}")))
                }
                (None, false) => (program, admin),
                (Some(_), false) => return Err("give a pipeline file (--yaml) or a program after --, not both".into()),
                (None, true) => {
                    return Err("give the job's pipeline file (--yaml <file>) or its program after --".into());
                }
            };
            let mut spec = serde_json::Map::new();
            spec.insert("name".into(), json!(name));
            spec.insert("command".into(), json!(command));
            spec.insert("env".into(), Value::Object(spec_env));
            spec.insert("admin".into(), json!(admin_url));
            if let Some(n) = max_restarts {
                spec.insert("restart".into(), json!({ "max_restarts": n }));
            }
            let spec = Value::Object(spec);
            let job = call(server, "POST", "/api/jobs", token, Some(spec))?;
            Ok(format!("submitted {}", line(&job)))
        }
        JobsCommand::Status { name, json } => {
            let job = call(server, "GET", &path(&name, ""), token, None)?;
            if json {
                return Ok(serde_json::to_string_pretty(&job)?);
            }
            let mut out = line(&job);
            for event in field(&job, "events").as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "\n  {} -> {}: {}",
                    text(field(event, "from")),
                    text(field(event, "to")),
                    text(field(event, "reason"))
                ));
            }
            Ok(out)
        }
        JobsCommand::Start { name } => {
            call(server, "POST", &path(&name, "/start"), token, Some(json!({})))?;
            Ok(format!("job `{name}` starting"))
        }
        JobsCommand::Stop { name, savepoint } => {
            let body = savepoint.as_ref().map_or_else(|| json!({}), |s| json!({ "savepoint": s }));
            call(server, "POST", &path(&name, "/stop"), token, Some(body))?;
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            loop {
                let job = call(server, "GET", &path(&name, ""), token, None)?;
                let phase = text(field(field(&job, "status"), "phase"));
                if phase != "stopping" && phase != "running" {
                    return Ok(line(&job));
                }
                if std::time::Instant::now() > deadline {
                    return Err(format!("job `{name}` is still {phase} after 120 s").into());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        JobsCommand::Upgrade { name, savepoint, yaml } => {
            let before = call(server, "GET", &path(&name, ""), token, None)?;
            let old_pid = field(field(&before, "status"), "pid").as_u64();
            let mut body = serde_json::Map::new();
            if let Some(sp) = &savepoint {
                body.insert("savepoint".into(), json!(sp));
            }
            if let Some(file) = yaml {
                let file = std::fs::canonicalize(&file).map_err(|e| format!("{}: {e}", file.display()))?;
                pipeline(&file)?;
                let mut spec = field(&before, "spec").clone();
                let command: Vec<Value> = field(&spec, "command").as_array().cloned().unwrap_or_default();
                let is_run = command.get(1).and_then(Value::as_str) == Some("run");
                if !is_run {
                    return Err(format!(
                        "job `{name}` is not a pipeline run by `weibo run`: --yaml cannot replace its file"
                    )
                    .into());
                }
                let mut command = command;
                if let Some(slot) = command.get_mut(2) {
                    *slot = json!(file.display().to_string());
                }
                if let Some(map) = spec.as_object_mut() {
                    map.insert("command".into(), Value::Array(command));
                }
                body.insert("spec".into(), spec);
            }
            call(server, "POST", &path(&name, "/upgrade"), token, Some(Value::Object(body)))?;
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            loop {
                let job = call(server, "GET", &path(&name, ""), token, None)?;
                let status = field(&job, "status");
                let phase = text(field(status, "phase"));
                let pid = field(status, "pid").as_u64();
                if phase == "running" && pid.is_some() && pid != old_pid || phase == "finished" {
                    return Ok(format!("upgraded {}", line(&job)));
                }
                if phase == "failed" || phase == "stopped" || phase == "cancelled" {
                    return Err(
                        format!("the upgrade of job `{name}` did not start its new version: {}", line(&job)).into()
                    );
                }
                if std::time::Instant::now() > deadline {
                    return Err(format!("job `{name}` is still {phase} after 120 s").into());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        JobsCommand::Savepoint { name, savepoint } => {
            let taken = call(server, "POST", &path(&name, "/savepoint"), token, Some(json!({ "name": savepoint })))?;
            Ok(format!("savepoint `{savepoint}` of job `{name}` written to {}", text(field(&taken, "path"))))
        }
        JobsCommand::Cancel { name } => {
            call(server, "POST", &path(&name, "/cancel"), token, Some(json!({})))?;
            Ok(format!("job `{name}` cancelled"))
        }
        JobsCommand::Remove { name } => {
            call(server, "DELETE", &path(&name, ""), token, Some(json!({})))?;
            Ok(format!("job `{name}` removed"))
        }
        JobsCommand::Logs { name, lines } => {
            let logs = call(server, "GET", &path(&name, &format!("/logs?lines={lines}")), token, None)?;
            Ok(field(&logs, "lines").as_array().into_iter().flatten().map(text).collect::<Vec<_>>().join("\n"))
        }
    }
}

/// `name` for a URL's path: anything but letters, digits, `-`, `_` and
/// `.` percent-encoded.
fn percent(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The `*_test.yaml` files under `dir`, at any depth.
fn test_files_in(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Failure> {
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            test_files_in(&path, out)?;
        } else if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with("_test.yaml")) {
            out.push(path);
        }
    }
    Ok(())
}

/// The checked pipeline in `file`; its errors, one per line, otherwise.
fn pipeline(file: &Path) -> Result<Pipeline, Failure> {
    Pipeline::from_file(file).map_err(|errors| format!("{} is not a valid pipeline:\n{errors}", file.display()).into())
}

/// Field `name` of `v` (null when it has none).
fn field<'a>(v: &'a Value, name: &str) -> &'a Value {
    v.get(name).unwrap_or(&Value::Null)
}

/// A value as text: a string as it is, anything else as JSON.
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// A job's state (`{"state": "failed", "error": ...}`) as text.
fn state_text(status: &Value) -> String {
    let state = text(field(status, "state"));
    match (status.get("error"), status.get("checkpoint")) {
        (Some(e), _) => format!("{state}: {}", text(e)),
        (None, Some(c)) => format!("{state} checkpoint {c}"),
        (None, None) => state,
    }
}

/// `GET /api/job` as a line.
fn status_text(job: &Value) -> String {
    let uptime =
        field(job, "uptime_ms").as_u64().map_or_else(String::new, |ms| format!(", up {:.1} s", ms as f64 / 1000.0));
    let checkpoint = match (field(job, "checkpoints").as_bool(), field(job, "last_checkpoint").as_u64()) {
        (Some(false), _) => ", no checkpoints".to_string(),
        (_, Some(n)) => format!(", last checkpoint {n}"),
        (_, None) => ", no checkpoint yet".to_string(),
    };
    format!("job `{}`: {}{uptime}{checkpoint}", text(field(job, "job")), state_text(field(job, "status")))
}

/// Asks the admin API at `url`: `method` on `path`, with `token` and a JSON
/// `body`. Its answer, or an error with the API's own message.
fn call(url: &str, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> Result<Value, Failure> {
    let base = url.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(format!("`{url}` is not an API's address: give it as http://host:port").into());
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (status, text) = runtime.block_on(async {
        // A stop or a savepoint waits for a checkpoint: no short timeout.
        let client = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build()?;
        let method = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut request = client.request(method, format!("{base}{path}"));
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        if let Some(b) = body {
            request = request.header("content-type", "application/json").body(b.to_string());
        }
        let response = request.send().await.map_err(|e| format!("cannot reach the API at {base}: {e}"))?;
        let status = response.status();
        Ok::<_, Failure>((status, response.text().await?))
    })?;
    let answer: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status.is_success() {
        return Ok(answer);
    }
    let why = answer.get("error").map_or_else(|| self::text(&answer), self::text);
    let hint = if status == reqwest::StatusCode::UNAUTHORIZED {
        " (give the API's token with --token or WEIBO_ADMIN_TOKEN)"
    } else {
        ""
    };
    Err(format!("{base}{path} answered {status}: {why}{hint}").into())
}

/// The complete checkpoints and the savepoints under `dir`.
/// `s3://<bucket>/<path>` as its bucket and path (without the slashes
/// around it); `None` for anything else.
fn s3_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("s3://")?;
    let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
    Some((bucket, path.trim_matches('/')))
}

/// The S3 storage of `bucket` under `prefix`, configured from the `AWS_*`
/// variables.
fn s3_storage(bucket: &str, prefix: &str) -> Result<weibo_connectors::s3::S3Storage, Failure> {
    if bucket.is_empty() {
        return Err("an S3 URL names its bucket: s3://<bucket>/<path>".into());
    }
    Ok(weibo_connectors::s3::S3Storage::builder(bucket, prefix).from_env().build()?)
}

/// The checkpoint or savepoint at `dir`: a local directory, or a URL
/// `s3://bucket/<job's prefix>/chk-<n>` (or `.../savepoints/<name>`).
fn open_checkpoint(dir: &str) -> Result<(Inspection, weibo::checkpoint::inspect::Opened), Failure> {
    let Some((bucket, path)) = s3_url(dir) else {
        return Ok(Inspection::open(Path::new(dir))?);
    };
    // The job's storage is what holds `chk-<n>` and `savepoints/`.
    let segments: Vec<&str> = path.split('/').collect();
    let split = match segments.as_slice() {
        [.., "savepoints", _] => segments.len() - 2,
        [] | [""] => return Err(format!("{dir}: the URL names no checkpoint (s3://<bucket>/<path>/chk-<n>)").into()),
        _ => segments.len() - 1,
    };
    let (prefix, name) = segments.split_at(split);
    let (prefix, name) = (prefix.join("/"), name.join("/"));
    let storage: std::sync::Arc<dyn CheckpointStorage> = std::sync::Arc::new(s3_storage(bucket, &prefix)?);
    let (mut inspection, opened) = Inspection::open_in(&storage, &name)?;
    inspection.path = PathBuf::from(format!("s3://{bucket}/{path}"));
    Ok((inspection, opened))
}

fn list(dir: &str, json: bool) -> Result<String, Failure> {
    if let Some((bucket, path)) = s3_url(dir) {
        let storage = s3_storage(bucket, path)?;
        let mut checkpoints = weibo::checkpoint::complete_checkpoints_in(&storage, "")?;
        checkpoints.sort_by_key(|(n, _)| n.get());
        let savepoints = weibo::checkpoint::savepoints_in(&storage)?;
        let at = |name: &str| storage.locate(name).display().to_string();
        let checkpoints: Vec<(u64, String)> = checkpoints.iter().map(|(n, d)| (n.get(), at(d))).collect();
        let savepoints: Vec<(String, String)> =
            savepoints.iter().map(|s| (s.clone(), at(&format!("savepoints/{s}")))).collect();
        return listing(dir, &checkpoints, &savepoints, json);
    }
    let dir = Path::new(dir);
    if !dir.is_dir() {
        return Err(format!("{}: no such checkpoint directory", dir.display()).into());
    }
    let mut checkpoints = weibo::checkpoint::complete_checkpoints(dir);
    checkpoints.sort_by_key(|(n, _)| n.get());
    let storage = weibo::checkpoint::LocalDir::new(dir.to_path_buf());
    let savepoints = weibo::checkpoint::savepoints_in(&storage)?;
    let checkpoints: Vec<(u64, String)> = checkpoints.iter().map(|(n, p)| (n.get(), p.display().to_string())).collect();
    let savepoints: Vec<(String, String)> =
        savepoints.iter().map(|s| (s.clone(), dir.join("savepoints").join(s).display().to_string())).collect();
    listing(&dir.display().to_string(), &checkpoints, &savepoints, json)
}

/// `checkpoint list`'s output: the checkpoints (number, where) and the
/// savepoints (name, where) of the storage at `dir`.
fn listing(
    dir: &str,
    checkpoints: &[(u64, String)],
    savepoints: &[(String, String)],
    json: bool,
) -> Result<String, Failure> {
    if json {
        let checkpoints: Vec<Value> = checkpoints.iter().map(|(n, p)| json!({ "checkpoint": n, "path": p })).collect();
        let savepoints: Vec<Value> = savepoints.iter().map(|(s, p)| json!({ "name": s, "path": p })).collect();
        return Ok(serde_json::to_string_pretty(&json!({ "checkpoints": checkpoints, "savepoints": savepoints }))?);
    }
    let mut out = Vec::new();
    for (n, path) in checkpoints {
        out.push(format!("checkpoint {n:>6}  {path}"));
    }
    for (name, path) in savepoints {
        out.push(format!("savepoint  {name}  {path}"));
    }
    if out.is_empty() {
        out.push(format!("{dir}: no complete checkpoint and no savepoint"));
    }
    Ok(out.join("\n"))
}

/// `checkpoint inspect` and `savepoint inspect`.
fn inspect(InspectArgs { dir, json, key, operator, state }: InspectArgs) -> Result<String, Failure> {
    let (inspection, opened) = open_checkpoint(&dir)?;
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

    /// A job that runs until stopped, its admin API on a loopback port
    /// with a token, checkpointing into `dir`: its handle, the runtime it
    /// runs on (apart from the command's own) and the API's address.
    #[cfg(feature = "admin")]
    fn running(dir: &std::path::Path) -> (weibo::JobHandle, tokio::runtime::Runtime, String) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let job = weibo::Job::new("counting")
            .with_checkpoints(dir, Duration::from_millis(200))
            .with_admin("127.0.0.1:0")
            .with_admin_token("cli-secret");
        job.source(weibo::sources::Generator::new(u64::MAX, |i| i).with_rate(1_000.0))
            .key_by(|x: &u64| x % 5)
            .reduce(|a, b| a + b)
            .uid("sums")
            .sink(weibo::sinks::Blackhole::new());
        let handle = runtime.block_on(async { job.spawn() }).unwrap();
        let addr = format!("http://{}", handle.admin_addr().unwrap());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while handle.checkpoint_history().is_empty() {
            assert!(std::time::Instant::now() < deadline, "the job never checkpointed");
            std::thread::sleep(Duration::from_millis(20));
        }
        (handle, runtime, addr)
    }

    /// Against a real job: its status, a savepoint, the checkpoints and
    /// savepoints on disk (listed, verified whole, a damaged one refused
    /// naming its file), and a stop with a last savepoint; without the
    /// token, or at an address where nothing listens, each command fails
    /// with what to do.
    #[cfg(feature = "admin")]
    #[test]
    fn status_savepoint_stop_list_and_verify_against_a_running_job() {
        let dir = tempfile::tempdir().unwrap();
        let (handle, _runtime, url) = running(dir.path());
        let token = ["--token", "cli-secret"];
        let with = |args: &[&str]| cli(&[args, &token[..]].concat());

        let status = run(with(&["status", &url])).unwrap();
        assert!(status.starts_with("job `counting`: running, up "), "{status}");
        assert!(status.contains("last checkpoint "), "{status}");
        let json: serde_json::Value = serde_json::from_str(&run(with(&["status", &url, "--json"])).unwrap()).unwrap();
        assert_eq!(json["status"]["state"], "running");
        let refused = run(cli(&["status", &url])).unwrap_err().to_string();
        assert!(refused.contains("401") && refused.contains("--token or WEIBO_ADMIN_TOKEN"), "{refused}");
        let unreachable = run(with(&["status", "http://127.0.0.1:9"])).unwrap_err().to_string();
        assert!(unreachable.contains("cannot reach the API at http://127.0.0.1:9"), "{unreachable}");
        let not_a_url = run(with(&["status", "127.0.0.1:9090"])).unwrap_err().to_string();
        assert!(not_a_url.contains("give it as http://host:port"), "{not_a_url}");

        let taken = run(with(&["savepoint", &url, "before-upgrade"])).unwrap();
        assert!(taken.starts_with("savepoint `before-upgrade` written to "), "{taken}");
        let savepoint = dir.path().join("savepoints/before-upgrade");
        assert!(savepoint.join("MANIFEST").is_file(), "{taken}");
        let bad_name = run(with(&["savepoint", &url, "../elsewhere"])).unwrap_err().to_string();
        assert!(bad_name.contains("400"), "{bad_name}");

        let listed = run(cli(&["checkpoint", "list", dir.path().to_str().unwrap()])).unwrap();
        assert!(listed.lines().any(|l| l.starts_with("checkpoint ")), "{listed}");
        assert!(listed.lines().any(|l| l.starts_with("savepoint  before-upgrade  ")), "{listed}");
        let verified = run(cli(&["checkpoint", "verify", savepoint.to_str().unwrap()])).unwrap();
        assert!(verified.contains("of job `counting` is whole"), "{verified}");

        let stopped = run(with(&["stop", &url, "--savepoint", "last"])).unwrap();
        assert!(stopped.starts_with("job stopped (stopped), its last checkpoint at "), "{stopped}");
        assert!(stopped.ends_with("savepoints/last"), "{stopped}");
        assert!(handle.status().has_ended());

        // A damaged state file: the checkpoint is not whole, and the error
        // names the file.
        let state_file = std::fs::read_dir(&savepoint)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|n| n != "MANIFEST"))
            .unwrap();
        let mut bytes = std::fs::read(&state_file).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&state_file, bytes).unwrap();
        let damaged = run(cli(&["checkpoint", "verify", savepoint.to_str().unwrap()])).unwrap_err().to_string();
        let name = state_file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(damaged.contains(&name), "{damaged}");
    }

    #[test]
    fn the_command_line_says_what_it_takes() {
        let usage = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("weibo").chain(args.iter().copied())).unwrap_err().to_string()
        };
        assert!(usage(&["savepoint", "http://127.0.0.1:1"]).contains("<NAME>"));
        assert!(usage(&["stop"]).contains("<URL>"));
        assert!(usage(&["checkpoint", "frobnicate"]).contains("unrecognized subcommand"));
        let help = usage(&["--help"]);
        assert!(help.contains("weibo checkpoint verify"), "{help}");
        let list = run(cli(&["checkpoint", "list", "/nonexistent/weibo"])).unwrap_err().to_string();
        assert!(list.contains("/nonexistent/weibo: no such checkpoint directory"), "{list}");
    }
}
