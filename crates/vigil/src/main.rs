//! The `vigil` binary: `serve`, `generate`, `pull` and `bench`.

mod bench;
mod generate;
mod pull;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "vigil", version, about = "Vigil: an LLM inference engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI and Anthropic APIs (default http://127.0.0.1:8080).
    Serve(serve::ServeArgs),
    /// Generate text from a prompt, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Fetch the default model (SmolLM2-135M-Instruct Q4_1) into the cache directory.
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
        .init();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Pull(args) => pull::run(args).map(|path| println!("{}", path.display())),
        Command::Bench(args) => bench::run(args),
    }
}
