//! `sluicectl`: read and change Sluice's pinned datapath maps.
//! The clap tree is in `args.rs`, one module per verb, every map read and write
//! through `sluice_maps` (`target.rs` picks the pin root),
//! output formatting in `table.rs`. `main` is thin and prints errors once.
mod args;
mod bandwidth;
mod caps;
mod counters;
mod datapath;
mod endpoints;
mod lb;
mod metrics;
mod monitor;
mod nat;
mod policy;
mod ports;
mod services;
mod signals;
mod status;
mod table;
mod target;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // `sluicectl ... | head` ends quietly, like other tools, instead of
    // panicking on the closed pipe (Rust ignores SIGPIPE by default).
    // SAFETY: resetting a signal disposition before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // Bad arguments exit 1 like every other refusal (clap's default is 2);
    // --help and --version exit 0.
    let cli = match args::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let Some(what) = cli.command.write_name() {
        if let Err(e) = caps::require_write(what) {
            eprintln!("sluicectl: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    let result = match &cli.command {
        args::Command::Status(a) => status::execute(&cli.target, a),
        args::Command::Endpoints(a) => endpoints::execute(&cli.target, a),
        args::Command::Counters(a) => counters::execute(&cli.target, a),
        args::Command::Monitor(a) => monitor::execute(&cli.target, a),
        args::Command::Datapath(c) => datapath::execute(&cli.target, c),
        args::Command::Nat(c) => nat::execute(&cli.target, c),
        args::Command::Ports(c) => ports::execute(&cli.target, c),
        args::Command::Bandwidth(c) => bandwidth::execute(&cli.target, c),
        args::Command::Services(c) => services::execute(&cli.target, c),
        args::Command::Policy(a) => {
            target::Datapath::open(&cli.target).and_then(|dp| policy::execute(&dp, a))
        }
        args::Command::Metrics(a) => metrics::execute(&cli.target, a),
        args::Command::Completions(a) => {
            use clap::CommandFactory;
            clap_complete::generate(
                a.shell,
                &mut args::Cli::command(),
                "sluicectl",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluicectl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
