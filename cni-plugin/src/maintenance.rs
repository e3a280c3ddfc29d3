//! `sluice datapath ...`: maintenance commands for operators and `sluicectl`,
//! outside the CNI protocol (runtimes never pass arguments to a plugin, so an
//! invocation with arguments cannot be a CNI call).
//!
//! - `sluice datapath version [--pin-root P]`: the embedded object's hash, and the
//!   pinned one's if a pin root is given;
//! - `sluice datapath reload --pin-root P`: load this binary's programs and move
//!   every pinned link to them atomically, keeping the maps;
//! - `sluice datapath detach-all --pin-root P`: take every program off its hook
//!   (pods, uplink, socket hooks, sweeper), keeping maps and programs pinned.
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::{datapath::Datapath, error::Error};

const USAGE: &str = "usage: sluice datapath version [--pin-root DIR] | sluice datapath reload --pin-root DIR | sluice datapath detach-all --pin-root DIR";

/// Runs a maintenance command; `args` excludes the program name.
pub fn run(args: &[String]) -> Result<Value, Error> {
    let bad = |what: &str| Error::Usage(format!("{what}: {:?}\n{USAGE}", args.join(" ")));
    let (verb, rest) = match args {
        [d, verb, rest @ ..] if d == "datapath" => (verb.as_str(), rest),
        _ => return Err(bad("unknown command")),
    };
    let pin_root = match rest {
        [] => None,
        [flag, p] if flag == "--pin-root" => Some(PathBuf::from(p)),
        _ => return Err(bad("unexpected arguments")),
    };
    let embedded = format!("{:016x}", crate::datapath::object_hash());
    let pinned = |dp: &Datapath| -> Result<Value, Error> {
        Ok(match dp.meta()? {
            Some(m) => json!({
                "layoutVersion": m.layout_version,
                "objectHash": format!("{:016x}", m.object_hash),
                "loadedUnix": m.loaded_unix,
            }),
            None => Value::Null,
        })
    };
    match (verb, pin_root) {
        ("version", None) => Ok(json!({ "embeddedObjectHash": embedded })),
        ("version", Some(root)) => {
            let dp = Datapath::new(&root);
            Ok(json!({ "embeddedObjectHash": embedded, "pinned": pinned(&dp)? }))
        }
        ("reload", Some(root)) => {
            let dp = Datapath::new(&root);
            let before = pinned(&dp)?;
            dp.reload()?;
            Ok(json!({ "before": before, "after": pinned(&dp)? }))
        }
        ("detach-all", Some(root)) => {
            let dp = Datapath::new(&root);
            if dp.meta()?.is_none() {
                return Err(bad("no datapath is loaded at that pin root"));
            }
            Ok(json!({ "detached": dp.detach_all()? }))
        }
        ("reload" | "detach-all", None) => Err(bad("this command needs --pin-root")),
        _ => Err(bad("unknown datapath command")),
    }
}
