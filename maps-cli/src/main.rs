//! `sluicectl`: read and change Sluice's pinned datapath maps.
//! The clap tree is in `args.rs`, one module per verb, every aya call in `bpf.rs`,
//! output formatting in `table.rs`. `main` is thin and prints errors once.
mod args;
mod bpf;
mod endpoints;
mod table;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let result = match &cli.command {
        args::Command::Endpoints(a) => endpoints::execute(&cli.target, a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluicectl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
