//! `cargo xtask`: Sluice's developer tooling. One module per subcommand; the
//! command line is in `cli`.
mod bench;
mod build;
mod cli;
mod cmd;
mod demo;
mod ebpf;
mod elf;
mod host;
mod image;
mod kubevalidate;
mod leaks;
mod libtest;
#[cfg(test)]
mod modgraph;
mod prometheus;
mod setup;
mod test;
mod testbed;
mod timetable;
mod vm;
mod ws;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    if let Command::ConnLoop(args) = &cli.command {
        return bench::conn_loop(args);
    }
    let ws = ws::Workspace::locate()?;
    match cli.command {
        Command::Setup(args) => setup::run(&args),
        Command::BuildEbpf(args) => ebpf::run(&ws, &args),
        Command::Build(args) => build::run(&ws, &args),
        Command::Image(args) => image::run(&ws, &args),
        Command::Test(args) => test::run(&ws, &args),
        Command::VmTest(args) => vm::run(&ws, &args),
        Command::Demo(_) => demo::run(&ws),
        Command::Bench(args) => bench::run(&ws, &args),
        Command::Profile(args) => bench::profile(&ws, &args),
        Command::VmBench(args) => vm::bench::run(&ws, &args),
        Command::ConnLoop(args) => bench::conn_loop(&args),
    }
}
