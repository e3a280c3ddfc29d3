//! One module per CNI command. Each takes the validated environment and config and
//! returns what goes on stdout (`None` when the command prints nothing).
pub mod add;
mod check;
mod del;
mod gc;
mod status;
pub mod version;

use serde_json::Value;

use crate::{
    cni::{config::NetConf, env::Command, env::Env},
    error::Error,
};

/// Runs a command other than VERSION.
pub fn run(env: &Env, conf: &NetConf) -> Result<Option<Value>, Error> {
    let cmd = env.command;
    // CHECK arrived with 0.4.0, GC and STATUS with 1.1.0 (spec version tables).
    let allowed = match cmd {
        Command::Check => conf.cni_version.has_check(),
        Command::Gc | Command::Status => conf.cni_version.has_gc_and_status(),
        _ => true,
    };
    if !allowed {
        return Err(Error::IncompatibleVersion {
            version: conf.cni_version.to_string(),
            reason: format!("config version does not allow {cmd}"),
        });
    }
    // A current-thread runtime: every netlink socket is driven on this thread,
    // which also keeps namespace switches (setns is per thread) predictable.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the async runtime", e))?;
    rt.block_on(async {
        match cmd {
            Command::Add => add::add(env, conf).await.map(Some),
            Command::Del => del::del(env, conf).await.map(|()| None),
            Command::Check => check::check(env, conf).await.map(|()| None),
            Command::Gc => gc::gc(env, conf).await.map(|()| None),
            Command::Status => status::status(env, conf).map(|()| None),
            Command::Version => Err(Error::env("CNI_COMMAND", "VERSION", "handled elsewhere")),
        }
    })
}
