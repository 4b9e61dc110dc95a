//! `vigil bench`: `run` drives one or more servers through a workload and writes a result file;
//! `report` turns result files into `report.md` and `report.html`. The work is in `vigil-bench`.

use anyhow::{Context, Result};
use std::path::PathBuf;
use vigil_bench::{Settings, Target, Workload};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Measure a workload on one or more OpenAI-compatible servers; writes one JSON result file.
    Run(Box<RunArgs>),
    /// Turn result files into a Markdown summary and a self-contained HTML page.
    Report(ReportArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// A server to measure, as NAME=URL (repeatable), e.g. vigil=http://127.0.0.1:8080.
    #[arg(long = "target", required = true)]
    targets: Vec<String>,
    /// single, concurrent, prefill, agent-loop, tool-loop, live-stream, sustained, burst or
    /// matrix.
    #[arg(long)]
    workload: String,
    /// Directory for the result file.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// The `model` field to send (default: the first id of the target's /v1/models).
    #[arg(long)]
    model: Option<String>,
    /// Untimed requests (agent-loop: loops) per point [default: 3].
    #[arg(long)]
    warmup: Option<u32>,
    /// Measured requests (agent-loop: loops) per point; concurrent levels send at least 2 × N
    /// [default: 20].
    #[arg(long)]
    iterations: Option<u32>,
    /// Seed of the prompt composer [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// Per-request timeout in seconds [default: 900].
    #[arg(long)]
    request_timeout: Option<u64>,
    /// Price prompts with this tokenizer.json instead of each target's own count (`/tokenize`,
    /// llama-cpp-python's `/extras/tokenize/count`, or generation usage); the calibration
    /// check still asks the target.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Seconds to wait for each target to answer /v1/models.
    #[arg(long, default_value_t = 120)]
    startup_timeout: u64,
    /// single: prompt lengths, comma-separated [default: 128,1024].
    #[arg(long, value_delimiter = ',')]
    prompt_tokens: Option<Vec<u32>>,
    /// single: output lengths [default: 128].
    #[arg(long, value_delimiter = ',')]
    output_tokens: Option<Vec<u32>>,
    /// concurrent: stream counts [default: 1,8,32].
    #[arg(long, value_delimiter = ',')]
    concurrency: Option<Vec<u32>>,
    /// concurrent: prompt length of each stream [default: 512].
    #[arg(long)]
    concurrent_prompt_tokens: Option<u32>,
    /// concurrent: output length of each stream [default: 128].
    #[arg(long)]
    concurrent_output_tokens: Option<u32>,
    /// prefill: prompt lengths [default: 1024,4096].
    #[arg(long, value_delimiter = ',')]
    prefill_prompt_tokens: Option<Vec<u32>>,
    /// agent-loop and tool-loop: prefix lengths [default: 2048].
    #[arg(long, value_delimiter = ',')]
    prefix_tokens: Option<Vec<u32>>,
    /// agent-loop and tool-loop: turns per loop [default: 5].
    #[arg(long, value_delimiter = ',')]
    turns: Option<Vec<u32>>,
    /// agent-loop: tokens generated per turn [default: 48].
    #[arg(long)]
    turn_tokens: Option<u32>,
    /// tool-loop: tokens generated per turn [default: 160].
    #[arg(long)]
    tool_turn_tokens: Option<u32>,
    /// agent-loop and tool-loop: skip the loops held in a session (run by default on targets
    /// that serve sessions, beside the stateless re-send).
    #[arg(long)]
    no_session_loops: bool,
    /// sustained: workflows kept in flight [default: 8].
    #[arg(long)]
    sustained_workflows: Option<u32>,
    /// sustained: seconds during which finished workflows are replaced [default: 60].
    #[arg(long)]
    window_seconds: Option<u32>,
    /// burst: workflows dropped at once [default: 16].
    #[arg(long)]
    burst_workflows: Option<u32>,
    /// sustained and burst: each workflow's first message, in tokens [default: 512].
    #[arg(long)]
    workflow_prefix_tokens: Option<u32>,
    /// sustained and burst: turns per workflow [default: 3].
    #[arg(long)]
    workflow_turns: Option<u32>,
    /// sustained and burst: tokens generated per turn [default: 64].
    #[arg(long)]
    workflow_turn_tokens: Option<u32>,
    /// live-stream: tokens per entry, about (counted by each target's tokenizer) [default: 64].
    #[arg(long)]
    entry_tokens: Option<u32>,
    /// live-stream: ms between pushed entries, and between queries [default: 1000].
    #[arg(long)]
    period_ms: Option<u32>,
    /// live-stream: the session window in tokens [default: 1024].
    #[arg(long)]
    window_tokens: Option<u32>,
    /// live-stream: tokens of every answer [default: 16].
    #[arg(long)]
    answer_tokens: Option<u32>,
    /// live-stream: measured stateless replays per target [default: --iterations].
    #[arg(long)]
    replay_iterations: Option<u32>,
    /// live-stream: measured cold queries per session target [default: --iterations].
    #[arg(long)]
    cold_iterations: Option<u32>,
    /// live-stream: queries fall due this many ms after each push [default: half the period].
    #[arg(long)]
    query_offset_ms: Option<u32>,
    /// live-stream: chat streams kept running beside the stream (closed loop, 64 tokens a
    /// request), to measure ingest under a saturated engine [default: 0].
    #[arg(long)]
    chat_streams: Option<u32>,
    /// live-stream: the session window mode, `exact` or `shift` (Vigil's approximate
    /// position shift); with `shift` the run ends by measuring answer agreement with `exact`
    /// [default: the server's, exact].
    #[arg(long, value_parser = ["exact", "shift"])]
    window_mode: Option<String>,
    /// matrix: context lengths, the grid's rows [default: 1024,4096].
    #[arg(long, value_delimiter = ',')]
    matrix_contexts: Option<Vec<u32>>,
    /// matrix: simultaneous requests, the grid's columns [default: 1,2,4,8].
    #[arg(long, value_delimiter = ',')]
    matrix_concurrency: Option<Vec<u32>>,
    /// matrix: seconds of sustained decode per cell [default: 30].
    #[arg(long)]
    matrix_duration_seconds: Option<u32>,
    /// matrix: tokens each decode request asks for [default: 512].
    #[arg(long)]
    matrix_max_output: Option<u32>,
    /// The servers' prefix-cache setting, recorded in the result file (the harness cannot see it).
    #[arg(long)]
    prefix_cache: Option<String>,
}

#[derive(clap::Args)]
struct ReportArgs {
    /// Result files written by `vigil bench run`.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Directory for report.md and report.html.
    #[arg(long, default_value = "report")]
    out: PathBuf,
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.command {
        BenchCommand::Run(a) => run_workload(*a),
        BenchCommand::Report(a) => {
            for path in vigil_bench::report::write_report(&a.files, &a.out)? {
                println!("{}", path.display());
            }
            Ok(())
        }
    }
}

fn run_workload(a: RunArgs) -> Result<()> {
    let d = Settings::default();
    let settings = Settings {
        warmup: a.warmup.unwrap_or(d.warmup),
        iterations: a.iterations.unwrap_or(d.iterations),
        seed: a.seed.unwrap_or(d.seed),
        request_timeout_s: a.request_timeout.unwrap_or(d.request_timeout_s),
        prompt_tokens: a.prompt_tokens.unwrap_or(d.prompt_tokens),
        output_tokens: a.output_tokens.unwrap_or(d.output_tokens),
        concurrency: a.concurrency.unwrap_or(d.concurrency),
        concurrent_prompt_tokens: a
            .concurrent_prompt_tokens
            .unwrap_or(d.concurrent_prompt_tokens),
        concurrent_output_tokens: a
            .concurrent_output_tokens
            .unwrap_or(d.concurrent_output_tokens),
        prefill_prompt_tokens: a.prefill_prompt_tokens.unwrap_or(d.prefill_prompt_tokens),
        prefix_tokens: a.prefix_tokens.unwrap_or(d.prefix_tokens),
        turns: a.turns.unwrap_or(d.turns),
        turn_tokens: a.turn_tokens.unwrap_or(d.turn_tokens),
        tool_turn_tokens: a.tool_turn_tokens.unwrap_or(d.tool_turn_tokens),
        session_loops: !a.no_session_loops,
        sustained_workflows: a.sustained_workflows.unwrap_or(d.sustained_workflows),
        window_s: a.window_seconds.unwrap_or(d.window_s),
        burst_workflows: a.burst_workflows.unwrap_or(d.burst_workflows),
        workflow_prefix_tokens: a.workflow_prefix_tokens.unwrap_or(d.workflow_prefix_tokens),
        workflow_turns: a.workflow_turns.unwrap_or(d.workflow_turns),
        workflow_turn_tokens: a.workflow_turn_tokens.unwrap_or(d.workflow_turn_tokens),
        entry_tokens: a.entry_tokens.unwrap_or(d.entry_tokens),
        period_ms: a.period_ms.unwrap_or(d.period_ms),
        window_tokens: a.window_tokens.unwrap_or(d.window_tokens),
        answer_tokens: a.answer_tokens.unwrap_or(d.answer_tokens),
        replay_iterations: a.replay_iterations.or(d.replay_iterations),
        cold_iterations: a.cold_iterations.or(d.cold_iterations),
        query_offset_ms: a.query_offset_ms.or(d.query_offset_ms),
        chat_streams: a.chat_streams.unwrap_or(d.chat_streams),
        window_mode: a.window_mode.clone().or(d.window_mode),
        matrix_contexts: a.matrix_contexts.unwrap_or(d.matrix_contexts),
        matrix_concurrency: a.matrix_concurrency.unwrap_or(d.matrix_concurrency),
        matrix_duration_s: a.matrix_duration_seconds.unwrap_or(d.matrix_duration_s),
        matrix_max_output: a.matrix_max_output.unwrap_or(d.matrix_max_output),
        prefix_cache: a.prefix_cache.unwrap_or(d.prefix_cache),
        ..d
    };
    let targets = a
        .targets
        .iter()
        .map(|t| t.parse::<Target>())
        .collect::<Result<Vec<_>, _>>()?;
    let opts = vigil_bench::RunOptions {
        workload: a.workload.parse::<Workload>()?,
        settings,
        out_dir: a.out,
        model: a.model,
        startup_timeout_s: a.startup_timeout,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        tokenizer: a.tokenizer,
    };
    // One thread: the client should take as little CPU from the servers under test as it can.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let path = runtime.block_on(vigil_bench::run(&opts, &targets))?;
    println!("{}", path.display());
    Ok(())
}
