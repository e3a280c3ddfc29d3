//! `sluice-node` as the tests run it: in a node's namespace, against the
//! stand-in API server ([`crate::apiserver`]) through a kubeconfig of its
//! own, its log in a file of the node's directory.
use std::{fs, path::Path, time::Duration};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::json;

use crate::{err, exec, Node, Result};

/// Starts `sluice-node <args> --pin-root <node's> --resync-secs 2` in `node`,
/// reaching the API at `127.0.0.1:<port>`; its log goes to `<node dir>/<log>`.
pub fn start(node: &Node, port: u16, args: &[&str], log: &str) -> Result<exec::Running> {
    let kubeconfig = node.dir().join(format!("kubeconfig-{port}"));
    let cfg = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": format!("http://127.0.0.1:{port}")}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    });
    fs::write(&kubeconfig, cfg.to_string())
        .map_err(|e| err!("writing {}: {e}", kubeconfig.display()))?;
    let bin = crate::sluice_node_bin()?.display().to_string();
    let pin_root = node.pin_root().display().to_string();
    let mut all = vec!["-c", "exec \"$0\" \"$@\" 2>>\"$AGENT_LOG\"", &bin];
    all.extend(args);
    all.extend(["--pin-root", &pin_root, "--resync-secs", "2"]);
    exec::spawn(
        Some(&node.netns_path()),
        Path::new("/bin/sh"),
        &all,
        &[
            ("KUBECONFIG".to_string(), kubeconfig.display().to_string()),
            (
                "AGENT_LOG".to_string(),
                node.dir().join(log).display().to_string(),
            ),
        ],
        b"",
    )
}

/// What the agent logged so far.
pub fn log_of(node: &Node, log: &str) -> String {
    fs::read_to_string(node.dir().join(log)).unwrap_or_default()
}

/// SIGTERM, and the exit must be clean (an error with the log otherwise).
pub fn stop(agent: exec::Running, node: &Node, log: &str) -> Result<()> {
    let pid = agent
        .pid()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| err!("the agent has no pid"))?;
    nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM)
        .map_err(|e| err!("SIGTERM to the agent ({pid}): {e}"))?;
    let out = agent.wait(Duration::from_secs(10))?;
    if !out.success() {
        return Err(err!(
            "the agent did not exit cleanly: {out}\n{}",
            log_of(node, log)
        ));
    }
    Ok(())
}
