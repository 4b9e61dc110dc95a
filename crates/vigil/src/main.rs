//! The `vigil` binary: `generate` and `pull` (and, later, `serve` and `bench`).

mod generate;
mod pull;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "vigil", version, about = "Vigil: an LLM inference engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Fetch the default model (SmolLM2-135M-Instruct Q4_1) into the cache directory.
    Pull(pull::PullArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Pull(args) => pull::run(args).map(|path| println!("{}", path.display())),
    }
}
