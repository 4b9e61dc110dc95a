//! The `vigil` binary: `serve`, `generate`, `pull` and `bench`.

mod bench;
mod generate;
mod pull;
mod serve;

use clap::{Parser, Subcommand};
use std::io::IsTerminal;

/// The environment variables every command reads, shown under `--help`.
const ENVIRONMENT: &str = "Environment:
  VIGIL_HOME          cache directory for pulled models and, by default, session state [default: ~/.cache/vigil]
  VIGIL_LOG           log filter: error, warn, info, debug, trace, or per module
                      (`vigil_server=debug`) [default: info]
  VIGIL_FORCE_SCALAR  set to 1 to use the portable kernels only (no AVX2/AVX-512)
  VIGIL_MAX_ISA       cap the kernels at scalar, avx2, avx_vnni or avx512 [default: the CPU's best]
  VIGIL_MMAP          set to 1 to serve weights from the checkpoint's file mapping, not a resident
                      copy in huge pages [default: off]
  VIGIL_BF16_DOTS     set to 1 to multiply BF16 weights with vdpbf16ps (AVX512_BF16), activations
                      rounded to BF16 [default: off, the f32 path]
  VIGIL_API_KEY       `serve`: the API key, as --api-key";

#[derive(Parser)]
#[command(
    name = "vigil",
    version,
    about = "Vigil: an LLM inference engine",
    after_help = ENVIRONMENT
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI and Anthropic APIs (default http://127.0.0.1:8080).
    #[command(after_help = ENVIRONMENT)]
    Serve(Box<serve::ServeArgs>),
    /// Generate text from a prompt, streaming it to stdout.
    #[command(after_help = ENVIRONMENT)]
    Generate(generate::GenerateArgs),
    /// Fetch the default model (SmolLM2-135M-Instruct Q4_1) into the cache directory.
    #[command(after_help = ENVIRONMENT)]
    Pull(pull::PullArgs),
    /// Benchmark OpenAI-compatible servers (`run`) and report the results (`report`).
    Bench(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VIGIL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Generate(args) => generate::run(args),
        Command::Pull(args) => pull::run(args).map(|path| println!("{}", path.display())),
        Command::Bench(args) => bench::run(args),
    }
}

/// A count that must be at least 1 (`--threads`): 0 is refused instead of meaning 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
