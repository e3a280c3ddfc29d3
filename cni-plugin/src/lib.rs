//! The `sluice` CNI plugin. `main.rs` is a thin shell around [`run`].
pub mod cni;
pub mod commands;
pub mod datapath;
pub mod error;
pub mod gateway;
pub mod interface;
pub mod ipam;
pub mod maintenance;
pub mod node;
pub mod overwrite;
pub mod pod;
pub mod spare;
pub mod state;
pub mod timing;

// The node's kernel interfaces, shared with the agent (crate `sluice-host`).
pub use sluice_host::{lock, netlink, netns};

use std::io::{IsTerminal, Read};

use serde_json::Value;

use cni::{
    config::{peek_version, NetConf, Strictness, MAX_STDIN_BYTES},
    env::{Command, Env},
    version::Version,
};
use error::Error;

/// What the binary prints.
pub enum Output {
    Ok(Option<Value>),
    /// `version` is the `cniVersion` the error JSON carries.
    Err {
        version: String,
        error: Error,
    },
}

/// Reads stdin, at most [`MAX_STDIN_BYTES`]; more is refused (code 5).
fn read_stdin() -> Result<Vec<u8>, Error> {
    let stdin = std::io::stdin();
    // Nobody piped a config in (someone ran `sluice` by hand): don't wait for one.
    if stdin.is_terminal() {
        return Ok(Vec::new());
    }
    let mut buf = Vec::new();
    stdin
        .lock()
        .take(MAX_STDIN_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io("reading the network config from stdin", e))?;
    if buf.len() as u64 > MAX_STDIN_BYTES {
        return Err(Error::io(
            "reading the network config from stdin",
            std::io::Error::other(format!(
                "more than {MAX_STDIN_BYTES} bytes; refusing an oversized config"
            )),
        ));
    }
    Ok(buf)
}

/// Runs one invocation from the process environment and stdin.
pub fn run() -> Output {
    let stdin = match read_stdin() {
        Ok(b) => b,
        Err(error) => {
            return Output::Err {
                version: Version::LATEST.to_string(),
                error,
            }
        }
    };
    // Errors carry the config's cniVersion when it can be read (spec section 5).
    let version = peek_version(&stdin)
        .filter(|v| v.parse::<Version>().is_ok() && !v.is_empty())
        .unwrap_or_else(|| Version::LATEST.to_string());
    let result = (|| {
        let env = Env::from_process()?;
        if env.command == Command::Version {
            return Ok(Some(commands::version::version(&stdin)));
        }
        let conf = NetConf::parse_for(&stdin, Strictness::for_command(env.command))?;
        commands::run(&env, &conf)
    })();
    match result {
        Ok(v) => Output::Ok(v),
        Err(error) => Output::Err { version, error },
    }
}
