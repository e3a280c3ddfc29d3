//! `sluice`: the CNI plugin binary. Reads the CNI environment and the network
//! config, runs the command, prints the result or a CNI error. Every failure ends
//! here as one error JSON on stdout with a non-zero exit (spec section 2, "Errors").
use std::process::ExitCode;

use sluice_cni::{cni::version::Version, run, Output};

fn main() -> ExitCode {
    // Last resort: even a bug must answer the runtime in CNI's error format.
    std::panic::set_hook(Box::new(|info| {
        let msg = format!("internal error: {info}");
        eprintln!("sluice: {msg}");
        println!(
            "{}",
            serde_json::json!({
                "cniVersion": Version::LATEST.to_string(),
                "code": 999,
                "msg": "internal error",
                "details": msg,
            })
        );
    }));
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.is_empty() {
        return match sluice_cni::maintenance::run(&args) {
            Ok(v) => {
                println!("{v}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluice: {}", e.details());
                ExitCode::FAILURE
            }
        };
    }
    match run() {
        Output::Ok(Some(v)) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Output::Ok(None) => ExitCode::SUCCESS,
        Output::Err { version, error } => {
            eprintln!("sluice: {}", error.details());
            println!(
                "{}",
                serde_json::json!({
                    "cniVersion": version,
                    "code": error.code(),
                    "msg": error.short(),
                    "details": error.details(),
                })
            );
            ExitCode::FAILURE
        }
    }
}
